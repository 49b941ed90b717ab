"""Where a `fleet up` spends its round trips, per host and phase: read from FLEET_TRACE's record
(fleet/transport/trace.py: one line per connection or session channel) and fleet's stderr, whose
per-host lines mark the end of each phase."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import Line

# Each phase ends, per host, at the first stderr line matching its pattern ("{host}" stands for
# the host's name; a pattern without it ends the phase on every host at once).
PHASES: tuple[tuple[str, str], ...] = (
    ("connect", r"fleet: {host}\s+connected \("),
    ("gate, claim, probe, plan", r"fleet: {host}\s+node rank "),
    ("upload and port checks", r"^fleet: preflight: |fleet: {host}\s+code: sent "),
    ("start", r"fleet: {host}\s+started "),
)


@dataclass
class Budget:
    """Per phase: the round trips each host made in it, and when its last host ended it."""

    trips: dict[str, list[int]] = field(default_factory=dict)  # per phase, one count a host
    ends: dict[str, float] = field(default_factory=dict)  # per phase, seconds since the command
    whats: dict[str, set[str]] = field(default_factory=dict)  # per phase, what was run


def ends_of(err: list[Line], t0_wall: float, host: str) -> list[float]:
    """Wall times at which `host` ended each phase (the later of its patterns' first lines)."""
    out = []
    for _, pattern in PHASES:
        alts = [re.compile(p.replace("{host}", re.escape(host))) for p in pattern.split("|")]
        hits = [min((x.wall for x in err if rx.search(x.text)), default=None) for rx in alts]
        found = [h for h in hits if h is not None]
        out.append(max(found) if found else float("nan"))
    return out


def read(trace: Path, err: list[Line], t0_wall: float) -> Budget:
    """The budget of one launch, from its trace file and its stderr lines."""
    recs = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    hosts = sorted({r["host"] for r in recs})
    b = Budget()
    for host in hosts:
        ends = ends_of(err, t0_wall, host)
        mine = [r for r in recs if r["host"] == host]
        start = t0_wall
        for (name, _), end in zip(PHASES, ends, strict=True):
            inside = [r for r in mine if start <= r["t"] < end]
            b.trips.setdefault(name, []).append(len(inside))
            b.whats.setdefault(name, set()).update(f"{r['kind']}: {r['what'][:40]}"
                                                   for r in inside)
            b.ends[name] = max(b.ends.get(name, 0.0), end - t0_wall)
            start = end
    return b


def merged(budgets: list[Budget]) -> list[tuple[str, float, float, list[str]]]:
    """Per phase, medians over launches: round trips per host, seconds the phase took (its last
    host's end minus the phase before's), and what ran in it."""
    out = []
    prev: list[float] = [0.0] * len(budgets)
    for name, _ in PHASES:
        trips = [statistics.median(b.trips[name]) for b in budgets if b.trips.get(name)]
        ends = [b.ends.get(name, float("nan")) for b in budgets]
        secs = [e - p for e, p in zip(ends, prev, strict=True)]
        prev = ends
        whats = sorted(set().union(*(b.whats.get(name, set()) for b in budgets)))
        out.append((name, statistics.median(trips) if trips else float("nan"),
                    statistics.median(secs) if secs else float("nan"), whats))
    return out
