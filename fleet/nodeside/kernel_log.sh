# What the node's kernel log says of OOM kills (fleet.facts.failure.parse_kernel_log reads it):
# the node's uptime, the kernel's "Killed process PID (name)" lines with their time since boot,
# and whether the log could be read at all (dmesg may be for root alone).
echo "uptime=$(cut -d' ' -f1 /proc/uptime 2>/dev/null)"
if ! command -v dmesg >/dev/null 2>&1; then
  echo 'unreadable=there is no dmesg on its PATH'
elif dmesg >/dev/null 2>&1; then
  dmesg 2>/dev/null | grep -a 'Killed process [0-9]' | tail -n 20 | sed 's/^/kill|/'
  echo readable
else
  echo "unreadable=$(dmesg 2>&1 | head -n 1)"
fi
