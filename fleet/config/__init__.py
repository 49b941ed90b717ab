"""What the user writes: the inventory (hosts or a Slurm cluster), the job, host keys."""
