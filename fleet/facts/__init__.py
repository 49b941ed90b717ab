"""fleet.facts."""
