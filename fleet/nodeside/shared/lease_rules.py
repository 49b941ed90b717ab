"""What a GPU lease is, for the program that writes leases on a host (fleet/nodeside/lease.py)
and for fleet.facts.leases that reads them: its file's name, its longest life, its fields'
bounds, and how much of a lease directory anyone reads."""

from __future__ import annotations

import math
import re

# A lease ends within a week of its file's last status change (ctime: the kernel sets it on
# every write, rename or chmod; its owner cannot set it back, as `touch -d` sets an mtime).
MAX_LEASE_S = 7 * 86400
# What a directory anyone may write to can hold before fleet stops reading it and says so:
# names of any kind (an empty *.lease file is skipped at the cost of a name), and records
# read (4 KiB each). As fleet.facts.gpus's listing: past either, the leases are unknown,
# never "none".
MAX_NAMES = 10000
MAX_RECORDS = 500
LEASE_FILE = re.compile(r"[0-9]{1,10}-[0-9a-f]{12}\.lease")
MAX_GPUS = 256  # indices a lease names at most, each below 1 << 16


def lease_time(value: object) -> float | None:
    """A time a lease gives (seconds since the epoch, the host's clock); None where it is not
    one (a bool, not a number, not finite, negative or past the year 5138)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < 1e11 else None


def lease_gpus(value: object) -> tuple[int, ...] | None | bool:
    """The GPU indices a lease names, sorted, once each; None for the whole host; False where
    it is not either."""
    if value is None:
        return None
    if not isinstance(value, list) or not value or len(value) > MAX_GPUS:
        return False
    if not all(type(v) is int and 0 <= v < 1 << 16 for v in value):
        return False
    return tuple(sorted(set(value)))


def lease_end(until: float, changed: float) -> float:
    """When a lease that says `until` ends: at most MAX_LEASE_S after its file's last status
    change (`changed`, its ctime): one written by hand with a far end still ends."""
    return min(until, changed + MAX_LEASE_S)


# A run lease's run (fleet up's placement, a queue's agent): a run id's shape, as fleet makes
# them (fleet.plan.new_run_id); anything else is no run.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def lease_run(value: object) -> str:
    """The run a lease is held for, "" where it names none (or names it in any other shape)."""
    return value if isinstance(value, str) and RUN_ID.fullmatch(value) else ""
