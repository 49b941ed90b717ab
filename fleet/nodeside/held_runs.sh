# Every run directory under $1 (a workdir's runs/) without an exit code: its machine and whether
# its pid is alive here, which means something only where the machine is this one ($2,
# fleet.shell.MACHINE_ID): a directory shared with other machines holds their runs too.
cd "$1" 2>/dev/null || exit 0
echo "me=$2"
for d in */*/; do
  d=${d%/}
  [ -d "$d" ] || continue
  [ -e "$d/exit_code" ] && continue
  p=$(cat "$d/pid" 2>/dev/null) || continue
  alive=no
  kill -0 "$p" 2>/dev/null && alive=yes
  echo "run=$d $alive $(cat "$d/machine" 2>/dev/null)"
done
