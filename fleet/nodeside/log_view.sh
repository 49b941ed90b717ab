# node.log's whole lines as they are now, each as `<time> <line>`: when it was written by this
# node's clock, from node.times (fleet/nodeside/log_times.py; `-` where the index has not reached
# it, or the run has none). First a line `size=<bytes> now=<this node's time>`, last `end=<byte>`:
# the offset after the last whole line shown or passed over (a follower resumes there).
# $1: the run directory; $2: only lines written at or after this time ("": all; a line without
# a time is kept); $3: only the last $3 of those lines ("": all).
cd "$1" 2>/dev/null && [ -f node.log ] || { echo "no node.log in $1" >&2; exit 3; }
s=$(wc -c < node.log)
t=node.times
[ -f "$t" ] || t=/dev/null
printf 'size=%s now=%s\n' "$((s))" "$(date +%s.%N)"
head -c "$s" node.log | LC_ALL=C awk -v since="$2" -v keep="$3" -v size="$s" '
  function emit(line, end,   tm) {
    while (k <= n && o[k] < end) k++
    tm = (k <= n) ? w[k] : "-"
    if (since != "" && tm != "-" && tm + 0 < since + 0) return
    if (keep == "") { print tm " " line; return }
    c++
    buf[c] = tm " " line
    delete buf[c - keep]
  }
  !lines { n++; o[n] = $1 + 0; w[n] = $2; next }
  { if (have) emit(prev, pend)
    have = 1; prev = $0; pend += length($0) + 1 }
  END {
    e = pend
    if (have && pend <= size + 0) emit(prev, pend)
    else if (have) e = pend - length(prev) - 1
    if (keep != "") for (i = c - keep + 1; i <= c; i++) if (i >= 1) print buf[i]
    print "end=" e + 0
  }' "$t" lines=1 -
