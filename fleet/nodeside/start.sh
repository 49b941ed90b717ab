# Starts the run's wrapper, run.sh, detached from this connection (its own session, no tty),
# then prints `<pid> <start>` once run.sh has recorded its pid: the wrapper as this shell started
# it (`$!`: setsid runs in it, no fork, as it leads no process group here) and its start time
# (clock ticks after boot, /proc/PID/stat), read at once, before anything reaps it. fleet keeps
# both on its own machine: the run directory's pid and procs are the job's to write.
# $1: the run directory, $2: the run id, $3: how many times to look for the pid, 0.01 s apart;
# $4 (optional): the node's python, which keeps node.log's time index beside it while the
# wrapper lives (log_times.py, its text on file descriptor 3, started by `-c $5`), and records
# the run's processes by descent while they live ($6, run_tree.py in the run directory): a
# process that leaves the run's environment and session is still found by stop.sh.
# $7, $8 (optional, a detached run): the nodes' own watcher's program and its config in the
# run directory (fleet/nodeside/watcher.py): the config is opened and removed before the job
# begins (it holds the node's keys), and given to the watcher on its stdin; the watcher has
# FLEET_ATTEMPT_ID, so that the run's stop ends it too.
cd "$1" || exit 1
[ -e stopped ] && { echo 'stopped before it started' >&2; exit 3; }
watch=
if [ -n "${8:-}" ] && [ -f "$8" ] && [ -n "$4" ] && exec 4< "$8"; then
  rm -f "$8"
  watch=yes
fi
# Appending: stop.sh's line lands whole between the job's, never overwritten by them.
env "FLEET_ATTEMPT_ID=$2" setsid sh ./run.sh >> node.log 2>&1 < /dev/null 4<&- &
w=$!
# A builtin read, before any command this shell waits for: it may reap the wrapper meanwhile.
IFS= read -r st < "/proc/$w/stat" || st=
# The fields after the command name's last `) `; the start time is the 20th of them.
ws=$(printf '%s\n' "${st##*) }" | awk '$20 ~ /^[0-9]+$/ { print $20 }')
i=0
while [ ! -s pid ] && [ "$i" -lt "$3" ]; do
  sleep 0.01
  i=$((i + 1))
done
[ -s pid ] || exit 0  # run.sh never got going: no pid, and fleet says so
if [ -n "$watch" ] && [ -n "$ws" ]; then
  env "FLEET_ATTEMPT_ID=$2" setsid "$4" -I -S "$7" "$1" "$w" "$ws" <&4 > /dev/null 2>&1 3<&- 4<&- &
fi
# Neither is in the run's environment nor descends from it: stop.sh leaves them be, and each
# ends by itself after the wrapper (run_tree.py after the last process it recorded).
if [ -n "$4" ]; then
  setsid "$4" -I -S -c "$5" "$1" "$w" < /dev/null > /dev/null 2>&1 4<&- &
  [ -f "${6:-}" ] && setsid "$4" -I -S "$6" "$1" "$w" < /dev/null > /dev/null 2>&1 3<&- 4<&- &
fi
echo "$w $ws"
