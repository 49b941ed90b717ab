# Starts a command in the background, its output to a file, and prints that output once the
# command has said something (10 s at most): fleet's test listener (listen.py), which says
# whether it listens, and stays after this program ends until its connections came or its time
# is up. $1: seconds after which `timeout` ends it whatever it does; the rest: the command.
f=$(mktemp "${TMPDIR:-/tmp}/fleet-listen.XXXXXX") || exit 1
limit=$1
shift
timeout "$limit" "$@" > "$f" 2>&1 < /dev/null &
i=0
while [ ! -s "$f" ] && [ "$i" -lt 500 ]; do
  sleep 0.02
  i=$((i + 1))
done
cat "$f"
rm -f "$f"
