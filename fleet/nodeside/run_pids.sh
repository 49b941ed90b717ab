# run_pids ID: the processes of fleet run ID on this machine. torchrun starts each worker in its
# own session, so process groups do not reach them: they are found by FLEET_RUN_ID in their
# environment instead, with one grep over every process's environment (NUL-separated entries,
# matched whole), the shell that asks left out.
run_pids() {
  grep -lzxF -- "FLEET_RUN_ID=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | grep -vx "$$"
}
