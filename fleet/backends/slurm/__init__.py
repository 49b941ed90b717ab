"""fleet.backends.slurm."""
