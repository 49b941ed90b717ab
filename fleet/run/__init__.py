"""A run as data, the same for every backend: its local record, what fleet saw of each node's
end, the failure phases, log tagging and views, and the hang's stack dumps."""
