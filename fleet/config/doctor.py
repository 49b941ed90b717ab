"""`[doctor]` in an inventory: the bounds of `fleet doctor`'s verdict, each relative to the
hosts' own median where a figure is compared between hosts; every mistake named by its key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fleet.config.schema import Table


@dataclass(frozen=True)
class Bounds:
    """What `fleet doctor` calls slow or faulty."""

    link: float = 0.25  # a link below this share of the median bandwidth is slow
    latency: float = 4.0  # a round trip this many times the median is slow...
    latency_floor_ms: float = 0.5  # ...and this much above it
    disk: float = 0.25  # a disk below this share of the median write or read speed
    cores: float = 0.5  # fewer CPUs than this share of the median
    memory: float = 0.5  # less memory than this share of the median
    steal: float = 0.1  # more of the CPU time stolen by the hypervisor than this share
    clock_skew_s: float = 1.0  # a clock this far from the hosts' median


# key -> (lowest, highest) it may be set to
LIMITS = {"link": (0.0, 1.0), "latency": (1.0, 1e6), "latency_floor_ms": (0.0, 1e6),
          "disk": (0.0, 1.0), "cores": (0.0, 1.0), "memory": (0.0, 1.0), "steal": (0.0, 1.0),
          "clock_skew_s": (0.0, 1e6)}


def take_bounds(t: Table) -> Bounds:
    """The inventory's `[doctor]` table (or the defaults where it has none)."""
    values: dict[str, float] = {}
    for key, (lo, hi) in LIMITS.items():
        if t.has(key):
            value = float(t.take(key, float))
            if not lo <= value <= hi:
                raise t.error(key, f"must be a number from {lo:g} to {hi:g}, not {value:g}")
            values[key] = value
    t.done()
    return dataclasses.replace(Bounds(), **values)


BEFORE = ("quick", "full")


def take_before(t: Table) -> str:
    """A job's `[doctor] before`: "quick" or "full" runs `fleet doctor` on the job's hosts
    before `up` starts anything (and, with `[restart]`, before each later attempt); "" none."""
    before = t.take("before", str, "")
    if before not in ("", *BEFORE):
        raise t.error("before", f'must be "quick" or "full", not {before!r}')
    t.done()
    return before
