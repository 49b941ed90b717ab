# Returns once the run's wrapper (pid $2, run directory $1) has ended, printing nothing: the end
# reaches fleet as soon as it happens, however much of node.log is still on its way. Where run.sh
# holds its lock, a shared flock returns at once the wrapper ends; elsewhere its pid is watched.
# A wrapper that is a zombie nobody reaps still answers kill -0: its state there says it ended
# (never its exit code file, which the job can write while the wrapper lives).
if [ -e "$1/locked" ] && command -v flock >/dev/null 2>&1; then
  flock -s "$1/lock" true 2>/dev/null
else
  while kill -0 "$2" 2>/dev/null &&
      [ "$(sed -n 's/.*) \([A-Z]\) .*/\1/p' "/proc/$2/stat" 2>/dev/null)" != Z ]; do
    sleep 0.2
  done
fi
