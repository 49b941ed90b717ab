# Starts the run's wrapper, run.sh, detached from this connection (its own session, no tty),
# then prints its pid once run.sh has recorded it.
# $1: the run directory, $2: the run id, $3: how many times to look for the pid, 0.01 s apart.
cd "$1" || exit 1
[ -e stopped ] && { echo 'stopped before it started' >&2; exit 3; }
# Appending: stop.sh's line lands whole between the job's, never overwritten by them.
env "FLEET_RUN_ID=$2" setsid sh ./run.sh >> node.log 2>&1 < /dev/null &
i=0
while [ ! -s pid ] && [ "$i" -lt "$3" ]; do
  sleep 0.01
  i=$((i + 1))
done
cat pid
