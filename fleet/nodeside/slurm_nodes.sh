# Each node's directory under a Slurm run's directory ($1) (fleet.facts.slurm.parse_nodes reads
# it): its name, its exit code, whether Slurm signalled it, and the rank line its task printed
# first.
cd "$1" 2>/dev/null || exit 0
for d in */; do
  d=${d%/}
  [ -f "$d/node.log" ] || continue
  s=
  [ -e "$d/signalled" ] && s=signalled
  printf 'node=%s|%s|%s|%s\n' "$d" "$(cat "$d/exit_code" 2>/dev/null)" "$s" \
    "$(head -n 1 "$d/node.log")"
done
true
