"""Where a `fleet up` spends its round trips before the job runs, per host and phase: read from
FLEET_TRACE's record (fleet/transport/trace.py: one line per connection or session channel,
with what it ran, when it began and how long it took, on fleet's own clock)."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

# A round trip's phase, by its kind and what it ran (the first pattern that matches); what
# matches none (the run's own streams, heartbeats, the end) is not counted.
PHASES: tuple[tuple[str, str], ...] = (
    ("connect", r"^connect:"),
    ("gate (GPUs, leases)", r"^run: list GPUs"),
    # The claim's stream is named by its first telling line: the claim script's comment, or,
    # where the probe rides on it (its text an argument of the claim), the probe's.
    ("claim + probe", r"^stream: # fleet\S* (claim|probe) |^run: probe$|^answer: the probe"),
    ("port checks", r"test listener|^run: connect test|^run: stop the listener"),
    ("upload", r"^run: create |\.fleet-bundle|^run: read the setup marker"),
    ("start", r"manifest\.json|^run: start run\.sh|watcher"),
)
# What each phase may take per host, at the physical limit the target names: one handshake,
# then about one round trip per phase (the master takes one more in the port checks: its
# listener before the workers test it, its test of theirs after).
BUDGET: dict[str, int] = {name: 1 for name, _ in PHASES}


@dataclass
class Budget:
    """Per phase: the round trips each host made in it, and how long the phase took (from its
    first round trip's start to its last one's end, over every host)."""

    trips: dict[str, list[int]] = field(default_factory=dict)  # per phase, one count a host
    seconds: dict[str, float] = field(default_factory=dict)


def phase_of(kind: str, what: str) -> str | None:
    said = f"{kind}: {what}"
    for name, pattern in PHASES:
        if re.search(pattern, said):
            return name
    return None


def read(trace: Path) -> Budget:
    """The budget of one launch, from its trace file (a missing file: an empty budget)."""
    recs = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    hosts = sorted({r["host"] for r in recs})
    b = Budget()
    for name, _ in PHASES:
        mine = [r for r in recs if phase_of(r["kind"], r["what"]) == name]
        # An "answer" is no round trip of its own: when a stream's awaited part came.
        b.trips[name] = [sum(1 for r in mine if r["host"] == h and r["kind"] != "answer")
                         for h in hosts]
        # A stream held open (the claim) counts by its start (its length is the launch's), and
        # to the answer it was waited for, where one is noted.
        if mine:
            ends = [r["t"] + (r["s"] or 0.0) if r["kind"] != "stream" else r["t"] for r in mine]
            b.seconds[name] = max(ends) - min(r["t"] for r in mine)
    return b


def merged(budgets: list[Budget]) -> list[tuple[str, float, float | None]]:
    """Per phase, medians over launches: round trips per host, and the phase's seconds."""
    out = []
    for name, _ in PHASES:
        trips = [statistics.median(b.trips[name]) for b in budgets if b.trips.get(name)]
        secs = [b.seconds[name] for b in budgets if name in b.seconds]
        out.append((name, statistics.median(trips) if trips else 0.0,
                    statistics.median(secs) if secs else None))
    return out
