"""fleet.run."""
