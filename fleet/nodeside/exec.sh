# `fleet exec` on a node: the user's command ($4 on, run as given, never re-split) in directory
# $1, its output (stdout and stderr as they come) cut after $2 bytes and then a line "$3 N" with
# the N bytes cut; on stderr "status CODE", or "absent" where $1 is not there (nothing ran).
# What the command prints past the cut is read to its end (counted, not dropped unread), so the
# command is never killed by a closed pipe for printing much.
dir=$1 cap=$2 mark=$3
shift 3
if ! cd "$dir" 2>/dev/null; then
  echo absent >&2
  exit 0
fi
{
  { "$@" 3>&-; echo "status $?" >&3; } 2>&1 |
    { head -c "$cap"; printf '\n%s %s\n' "$mark" "$(wc -c | tr -d ' ')"; }
} 3>&2
