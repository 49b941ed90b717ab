"""A run's end as both sides word it: whether a node's wrapper has ended, how long a run took,
the headline of its end's notice, and where a Python traceback begins in a log."""

from __future__ import annotations

import os

from fleet.nodeside.shared.nodemap import EXIT_CODE

TRACEBACK = "Traceback (most recent call last):"  # a Python traceback's first line


def ended(run_dir: str, pid: int) -> bool:
    """Whether the wrapper has ended (a zombie nobody reaps has: its exit code is written)."""
    if os.path.exists(os.path.join(run_dir, EXIT_CODE)):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def duration(seconds: float) -> str:
    """`2h 03m`, `4m 05s`, `12s`."""
    s = max(int(seconds), 0)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def headline(run_id: str, job: str, state: str, seconds: float) -> str:
    """The first line of a run's end's notice, from fleet (attached) or the master (detached)."""
    return f"fleet: run {run_id} ({job}) {state} after {duration(seconds)}"
