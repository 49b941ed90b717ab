"""What fleet learns from a node or a scheduler: each fact a command plus a pure parser."""
