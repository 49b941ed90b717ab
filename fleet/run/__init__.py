"""A run, the same for every backend: the runner, its guard and monitor, states and records."""
