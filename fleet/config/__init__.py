"""fleet.config."""
