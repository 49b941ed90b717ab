"""`fleet up`'s lifecycle, the same for every backend: the runner (one state machine), its guard
and monitor, the restart policy's attempts, the end's notification, and signal handling. It
drives a backend through the seam (fleet.backends.base); no backend imports it."""
