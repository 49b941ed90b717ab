# One Slurm job as Slurm tells it (fleet.facts.slurm.parse_job reads it), each answer in its own
# section: squeue (jobs still in the queue), scontrol (kept MinJobAge after the end, with the
# exit code) and sacct (where accounting runs). $1: the job id.
echo '=== squeue'
squeue -h -j "$1" -o '%i|%T|%N|%r' 2>&1
echo '=== scontrol'
scontrol show job -o "$1" 2>&1
echo '=== sacct'
sacct -n -P -X -j "$1" -o JobID,State,ExitCode,NodeList 2>&1
echo '=== end'
true
