# What each rank of a run on this node did lately, for `fleet top` and the straggler watch
# (fleet.facts.ranktop.parse_top reads it): the node's clock, the log's pace, and every rank's
# sampling summary (fleet/nodeside/shared/sampling.py). Never a whole log: only the lines of
# about the last $4 seconds are counted here, at most $5 bytes of them read.
# $1: the run directory, $2: how many summaries at most, $3: bytes of one summary,
# $4: seconds of log counted, $5: bytes of log counted at most.
# Everything in the run directory is the job's to write: only this program's headers start with
# `=== `, every line of a summary starts with `|`, and every size is bounded.
most=$2 bytes=$3 since=$4 cap=$5
cd "$1" 2>/dev/null || { echo "=== missing"; exit 0; }
now=$(date +%s.%N | cut -c 1-20)
echo "=== now $now"
# node.times: `<bytes> <time>` per stamp (fleet/nodeside/log_times.py); its last stamps only.
# The log's offset and time of the last stamp before the span, and of the last one.
if [ -f node.times ] && [ ! -L node.times ]; then
  # (offset 0 and time `-`: the log began within the span, as far as the stamps kept tell)
  span=$(tail -n 4000 node.times 2>/dev/null | awk -v since="$since" -v now="$now" '
    BEGIN { from = 0; at = "-" }
    $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+(\.[0-9]+)?$/ {
      if ($2 + 0 < now - since) { from = $1; at = $2 }
      to = $1; last = $2; n++ }
    END { if (n) print from, at, to, last }')
  if [ -n "$span" ]; then
    echo "=== stamps $span"
    set -- $span
    if [ "$3" -le "$1" ]; then
      echo "=== lines 0"  # no line within the span
    elif [ -f node.log ] && [ ! -L node.log ]; then
      echo "=== lines $(tail -c +"$(($1 + 1))" node.log 2>/dev/null | head -c "$(($3 - $1))" |
        head -c "$cap" | wc -l)"
    fi
  fi
fi
# The newest summaries first (`ls -t`): a process that ended long ago (a worker the job spawned,
# an earlier rank) never crowds out a live rank; names of digits only.
k=0
for p in $(ls -t samples 2>/dev/null | grep -E '^[0-9]{1,10}$' | head -n "$((most + 1))"); do
  f=samples/$p
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  k=$((k + 1))
  [ "$k" -le "$most" ] || { echo "=== cut"; break; }
  echo "=== sample $p"
  head -c "$bytes" "$f" | head -n 20 | sed 's/^/|/'
  echo
done
true
