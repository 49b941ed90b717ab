"""Files fleet puts in each run directory's site/ for the job's python processes (on the node's
PYTHONPATH): small, standard library only, inert outside a fleet run."""
