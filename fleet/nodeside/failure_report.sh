# What a node says of its run's failure (fleet.facts.failure.parse_report reads it), in sections
# that each start with a `=== ` line: the end of node.log, torchrun's error files with the time
# each was written, and each rank's stderr from its last Python traceback on (within its last
# lines), else its last lines.
# $1: the run directory, $2: lines of node.log, $3: lines of a stderr.log to look in, $4: lines
# to print where it holds no traceback, $5: the line a traceback starts with.
cd "$1" 2>/dev/null || exit 0
echo '=== log'
tail -n "$2" node.log 2>/dev/null
for f in torchrun/*/attempt_*/*/error.json; do
  [ -f "$f" ] && { echo "=== $f $(stat -c %.9Y "$f")"; cat "$f"; echo; }
done
for f in torchrun/*/attempt_*/*/stderr.log; do
  [ -f "$f" ] || continue
  echo "=== $f $(stat -c %.9Y "$f")"
  tail -n "$3" "$f" | awk -v header="$5" -v keep="$4" '{ l[NR] = $0 } index($0, header) { s = NR }
    END { if (!s) s = NR - keep + 1; if (s < 1) s = 1; for (i = s; i <= NR; i++) print l[i] }'
done
true
