# fleet's claim on a host: while this script lives, no other `fleet up` prepares this machine.
# $1: fleet's workdir on the node, $2: the run id. Prints one status line ("claimed", "busy
# <run id of the holder>", or "unsupported" where flock is missing or the filesystem cannot
# lock), then a "." twice a second:
# when fleet closes the channel (or its connection dies) the next write fails, the shell dies
# of SIGPIPE and the lock (fd 9, held by this shell alone) is released. A claim that is being
# released so (a launch that just gave up) is waited for, 3 s at most, before "busy".
# $3 (may be ""): a script run once claimed (or unsupported), before the holding starts, in a
# subshell (in the home directory, as any command starts) without the lock's descriptor: the
# launch's probe, in the claim's own round trip.
set -u
then=${3:-}
mkdir -p "$1" && cd "$1" || exit 1
me=".fleet-claim.$(uname -n)"
if ! command -v flock >/dev/null 2>&1; then
  echo unsupported
  [ -z "$then" ] || (cd "${HOME:-/}" && eval "$then")
  exit 0
fi
exec 9>>"$me" || exit 1
flock -w 3 -E 75 9
got=$?
if [ "$got" -eq 75 ]; then  # held by another launch (75: flock's conflict, asked for here)
  echo "busy $(head -c 200 "$me.who" 2>/dev/null | tr -cd 'A-Za-z0-9._-')"
  exit 0
fi
if [ "$got" -ne 0 ]; then  # a filesystem without locks (some NFS mounts): nothing to hold
  echo unsupported
  [ -z "$then" ] || (cd "${HOME:-/}" && eval "$then") 9>&-
  exit 0
fi
printf '%s\n' "$2" > "$me.who"
echo claimed
[ -z "$then" ] || (cd "${HOME:-/}" && eval "$then") 9>&-
while sleep 0.5 9>&-; do
  echo . || exit 0
done
