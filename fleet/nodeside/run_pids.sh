# run_pids ID DIR [PID START]: the processes of fleet run ID on this machine, DIR its node's run
# directory, PID and START its wrapper as fleet recorded it when it started it (start.sh).
# A process is the run's by any link it cannot shed on its own: FLEET_ATTEMPT_ID=ID in its
# environment, or FLEET_RUN_ID=ID where it has no FLEET_ATTEMPT_ID (one started before fleet set
# it; every attempt of a run with [restart] has the run's FLEET_RUN_ID, the first attempt's id),
# as torchrun starts each worker in its own session, so sessions alone do not reach them; the
# wrapper's session; the record of the wrapper's descendants that run_tree.py keeps while they
# live (DIR/procs: pid and start time, a pid may be reused), which a process that left both the
# environment and the session (`setsid env -u FLEET_ATTEMPT_ID -u FLEET_RUN_ID ...`) cannot
# leave; or a parent that is the run's. Each pid is checked before it is named: alive, not PID 1
# nor an unreaped zombie, not the shell that asks, owned by the user who asks, and started no
# earlier than the wrapper. The wrapper and its start are fleet's word (PID START): the job can write
# DIR, so DIR/procs is only a hint, each line checked against that start, and emptying or
# rewriting it cannot move the start nor hide the session. Without PID START (a run recorded
# before fleet kept them, a hang report) they are DIR/pid and the record's first line, if it
# names that pid; without either only the environment and descent from it count.
# ${procfs:-/proc} is where processes are read (a unit test's own). Every file there and in DIR
# is read as data.
run_pids() {
  rp_proc=${procfs:-/proc}
  rp_w=${3:-} rp_s=${4:-}
  [ -n "$rp_s" ] || { rp_w=$(head -c 16 "$2/pid" 2>/dev/null); rp_s=; }
  # One pass over every environment; the few found are then asked which attempt they are.
  rp_e=$(grep -lzxF -e "FLEET_RUN_ID=$1" -e "FLEET_ATTEMPT_ID=$1" "$rp_proc"/[0-9]*/environ \
    2>/dev/null)
  {
    printf '%s\n' "$rp_e" | sed -n 's|^.*/\([0-9][0-9]*\)/environ$|E \1|p'
    if [ -n "$rp_e" ]; then
      # shellcheck disable=SC2086 # /proc paths: no blank in them
      grep -lz '^FLEET_ATTEMPT_ID=' $rp_e 2>/dev/null |
        sed -n 's|^.*/\([0-9][0-9]*\)/environ$|A \1|p'
      # shellcheck disable=SC2086
      grep -lzxF -- "FLEET_ATTEMPT_ID=$1" $rp_e 2>/dev/null |
        sed -n 's|^.*/\([0-9][0-9]*\)/environ$|O \1|p'
    fi
    head -c 1048576 "$2/procs" 2>/dev/null | sed -n 's/^\([0-9][0-9]*\) \([0-9][0-9]*\)$/R \1 \2/p'
    grep -H '^Uid:' "$rp_proc"/[0-9]*/status 2>/dev/null |
      sed -n 's|^.*/\([0-9][0-9]*\)/status:Uid:[[:space:]]*\([0-9][0-9]*\).*$|U \1 \2|p'
    # Every line of every stat, behind its file's name: a command name may hold a newline.
    grep -H '' "$rp_proc"/[0-9]*/stat 2>/dev/null | sed -n 's|^.*/\([0-9][0-9]*\)/stat:|S \1 |p'
  } | awk -v w="$rp_w" -v given="$rp_s" -v me="$(id -u)" -v self="$$" '
    $1 == "E" { env[$2] = 1; next }
    $1 == "A" { other[$2] = 1; next }  # has an attempt id: its own decides
    $1 == "O" { own[$2] = 1; next }
    $1 == "R" { rec[$2 " " ($3 + 0)] = 1; if (first == "") { first = $2; first_s = $3 } next }
    $1 == "U" { uid[$2] = $3; next }
    $1 == "S" { p = $2; sub(/^S [0-9]+ /, ""); stat[p] = stat[p] $0 " "; next }
    function ok(q) {
      return (q in start) && q != 1 && q != self && (q in uid) && uid[q] == me &&
             (floor == "" || start[q] >= floor)
    }
    END {
      # The command name ends at the last ") ": the fields after it are numbers and a letter.
      for (p in stat) {
        t = stat[p]
        if (substr(t, 1, length(p) + 2) != p " (") continue
        sub(/^.*\) /, "", t)
        if (split(t, f, " ") < 20 || f[2] !~ /^[0-9]+$/ || f[20] !~ /^[0-9]+$/) continue
        if (f[1] == "Z" || f[1] == "X") continue  # ended: only its parent may reap it
        ppid[p] = f[2]; sid[p] = f[4]; start[p] = f[20] + 0
      }
      # The run began when its wrapper did: fleet says when, else the first line of the record if
      # it names the wrapper.
      floor = ""
      if (w !~ /^[0-9]+$/) w = ""
      else if (given ~ /^[0-9]+$/) floor = given + 0
      else if (first == w) floor = first_s + 0
      for (q in env) if (ok(q) && (q in own || !(q in other))) mine[q] = 1
      if (floor != "") {
        for (q in start) if (((q " " start[q]) in rec) && ok(q)) mine[q] = 1
        # The session of that number is the run one while the wrapper lives, and after it has
        # ended while the session does (the number is not given to a new process until then);
        # a process that has the number now and is not the wrapper may lead a session of its
        # own: none counts then.
        if (!(w in start) || start[w] == floor)
          for (q in sid) if (sid[q] == w && ok(q)) mine[q] = 1
      }
      n = 1
      while (n) {
        n = 0
        for (q in ppid) if (!(q in mine) && (ppid[q] in mine) && ok(q)) { mine[q] = 1; n = 1 }
      }
      for (q in mine) print q
    }' | sort -n  # in the order they started (awk walks an array in no order)
}
