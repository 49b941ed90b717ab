"""fleet.backends.hosts."""
