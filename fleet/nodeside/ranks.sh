# What each worker's sitecustomize recorded in the run directory $1: "<local rank> <global
# rank>" lines (fleet.facts.run_state.parse_ranks takes plain numbers only).
cd "$1/ranks" 2>/dev/null || exit 0
for f in [0-9]*; do
  [ -f "$f" ] && echo "$f $(cat "$f")"
done
true
