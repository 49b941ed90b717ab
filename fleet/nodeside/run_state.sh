# What a node's run directory says about the run there (fleet.facts.run_state.parse_state).
# $1: the run directory, $2: this machine's identity (fleet.shell.MACHINE_ID, as run.sh wrote it).
cd "$1" 2>/dev/null || { echo missing; exit 0; }
echo "pid=$(cat pid 2>/dev/null)"
echo "code=$(cat exit_code 2>/dev/null)"
echo "started=$(cat started 2>/dev/null)"
echo "ended=$(stat -c %Y exit_code 2>/dev/null)"
echo "last=$(stat -c %Y node.log stopped 2>/dev/null | sort -n | tail -n 1)"
echo "now=$(date +%s)"
# The stop record, whoever wrote it (the job can write there too): parse_stop_record tells
# fleet's from a forgery.
[ -e stopped ] && head -n 40 stopped | cut -c 1-400 | sed 's/^/stop|/'
echo "me=$2"
echo "machine=$(cat machine 2>/dev/null)"
p=$(cat pid 2>/dev/null); [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo alive
true
