# Every rank's Python stack (fleet.facts.stacks.parse_dump reads what this prints): signals each
# registered process of the run, then prints per process its identity and stack; then the run's
# other processes (pid and command line), with py-spy's dump of those that are Python where
# py-spy exists. Needs run_pids (run_pids.sh) defined before it.
# $1: the node's run directory, $2: the run id, $3: the flight recorder's pipe prefix, $4: its
# dump prefix, $5 and $6: the real-time signals a process may ask for (lowest, highest), $7: how
# many tenths of a second to wait for the stacks, $8: bytes of a stack file to print.
# Everything in the run directory is the job's to write, so what this prints is framed: only its
# own headers start with `=== `, every line of a file or of py-spy's output starts with `|`, a
# flight recorder file's name is given in hex, and sizes are bounded.
cd "$1" 2>/dev/null || { echo missing; exit 0; }
[ -e exit_code ] && echo "=== ended $(head -n 1 exit_code | head -c 12 | tr -cd '0-9-')"
mine=$(run_pids "$2" .)
sent=''
# NCCL flight recorder (where the job asked for it): each rank dumps when its pipe is written
# to. A pipe nobody reads would block the write: it runs aside, briefly.
writers=''
for f in "$3"*.pipe; do
  [ -p "$f" ] || continue
  ( echo 1 > "$f" ) & writers="$writers $!"
done
[ -n "$writers" ] && { sleep 0.5; kill $writers 2>/dev/null; }
for w in stacks/*.who; do
  [ -f "$w" ] || continue
  p=${w#stacks/}
  p=${p%.who}
  case $p in ''|*[!0-9]*) continue;; esac
  # Only a process of this run: a pid from the file may have been reused since.
  case " $(echo $mine) " in *" $p "*) ;; *) continue;; esac
  # Only a real-time signal, whatever the .who file says: never one that stops or ends it.
  sig=$(sed -n 's/^sig=//p' "$w" | head -n 1)
  case $sig in ''|*[!0-9]*) continue;; esac
  [ "$sig" -ge "$5" ] && [ "$sig" -le "$6" ] || continue
  : > "stacks/$p"
  kill -"$sig" "$p" 2>/dev/null && sent="$sent $p"
done
i=0
while [ "$i" -lt "$7" ]; do
  empty=0
  for p in $sent; do [ -s "stacks/$p" ] || empty=1; done
  [ "$empty" = 0 ] && break
  sleep 0.1
  i=$((i + 1))
done
sleep 0.1  # a dump being written: let it finish
for p in $sent; do
  echo "=== stack $p $(grep -v '^sig=' "stacks/$p.who" | head -c 200 | tr -c 'A-Za-z0-9=_-' ' ')"
  head -c "$8" "stacks/$p" | sed 's/^/|/'
  echo
done
for f in "$4"*; do
  n=$(printf %s "$f" | od -An -v -tx1 | tr -d ' \n')
  if [ -L "$f" ]; then
    echo "=== fr $n - link"
  elif [ -f "$f" ]; then
    echo "=== fr $n $(wc -c < "$f")"
  fi
done
spy=$(command -v py-spy 2>/dev/null)
for p in $mine; do
  case " $sent " in *" $p "*) continue;; esac
  cmd=$(head -c 2000 /proc/$p/cmdline 2>/dev/null | tr '\0\n' '  ')
  [ -n "$cmd" ] || continue
  echo "=== proc $p $cmd"
  case "$cmd" in
    *python*) [ -n "$spy" ] && "$spy" dump --pid "$p" 2>&1 | head -n 200 | sed 's/^/|/';;
  esac
done
true
