# The run's node.log from byte $3 on (1: its start); with the wrapper's pid ($2), until the
# wrapper ends, else what is there now. $1: the run directory.
# The wrapper's end is an event where run.sh holds its lock: a shared flock returns at once then,
# the waiter exits and is reaped by this shell, and tail (checking every 0.05 s) reads the rest
# and stops. Elsewhere tail watches the wrapper's pid. tail is never this program's last
# command: a shell would exec it, and the waiter would become tail's own unreaped child.
if [ -z "$2" ]; then
  tail -c "+$3" "$1/node.log" 2>/dev/null
else
  # $w: a process that lives exactly as long as the wrapper.
  w=$2
  if [ -e "$1/locked" ] && command -v flock >/dev/null 2>&1; then
    flock -s "$1/lock" true 2>/dev/null & w=$!
  fi
  tail -c "+$3" -F -s 0.05 --pid "$w" "$1/node.log" 2>/dev/null
fi
code=$?
exit "$code"
