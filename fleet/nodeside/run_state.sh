# What a node's run directory says about the run there (fleet.facts.run_state.parse_state).
# $1: the run directory, $2: this machine's identity (fleet.shell.MACHINE_ID, as run.sh wrote it).
cd "$1" 2>/dev/null || { echo missing; exit 0; }
# A file's first line, cut short: the job can write these files too, and a line of its own
# (`alive`, `missing`) must never reach fleet as one of this program's.
one() { head -c 300 "$1" 2>/dev/null | head -n 1 | tr -d '\r'; }
echo "pid=$(one pid)"
echo "code=$(one exit_code)"
echo "started=$(one started)"
echo "ended=$(stat -c %Y exit_code 2>/dev/null)"
echo "last=$(stat -c %Y node.log stopped 2>/dev/null | sort -n | tail -n 1)"
echo "now=$(date +%s)"
# The stop record, whoever wrote it (the job can write there too): parse_stop_record tells
# fleet's from a forgery.
[ -e stopped ] && head -n 40 stopped | cut -c 1-400 | sed 's/^/stop|/'
echo "me=$2"
echo "machine=$(one machine)"
# Digits only: `kill -0 -1` would answer for every process there is. A zombie nobody reaps has
# ended. (Not the lock: the job can replace that file.)
p=$(one pid)
case $p in
  '' | *[!0-9]*) ;;
  *)
    if kill -0 "$p" 2>/dev/null &&
        [ "$(sed -n 's/.*) \([A-Z]\) .*/\1/p' "/proc/$p/stat" 2>/dev/null)" != Z ]; then
      echo alive
    fi ;;
esac
true
