"""The Slurm backend: a job submitted through a cluster's login node."""
