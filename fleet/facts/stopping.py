"""What a node's stop.sh says while the run's processes end after its SIGTERM (its `ending=`
lines, every 0.5 s), parsed as untrusted input: a line that is not exactly one of them is none."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleet.events import Ending

# `ending=<ms since SIGTERM> torchrun=<n> workers=<n> wrapper=<0|1> other=<n>`
LINE = re.compile(r"ending=(\d{1,9}) torchrun=(\d{1,6}) workers=(\d{1,6}) wrapper=([01]) "
                  r"other=(\d{1,6})", re.ASCII)  # digits 0-9 only


@dataclass(frozen=True)
class StillEnding:
    """What of the run was still alive on a node at one of stop.sh's looks."""

    since: float  # seconds since stop.sh sent SIGTERM
    torchrun: int
    workers: int  # processes whose parent is a torchrun
    wrapper: bool  # run.sh, which records torchrun's exit code once it has ended
    other: int

    @property
    def what(self) -> Ending:
        """The one thing the node waits for, as a person would name it."""
        if self.torchrun:
            return Ending.TORCHRUN_WORKERS if self.workers else Ending.TORCHRUN
        if self.workers:
            return Ending.WORKERS
        if self.other:
            return Ending.OTHER
        return Ending.WRAPPER


# What a node's stop is on: stop.sh's word, or fleet's own step before it (Ending.CONNECTING...)
StopStep = StillEnding | Ending


def parse_ending(line: str) -> StillEnding | None:
    """One `ending=` line of stop.sh, or None for any other line (or a malformed one)."""
    m = LINE.fullmatch(line.strip())
    if m is None:
        return None
    ms, torchrun, workers, wrapper, other = (int(g) for g in m.groups())
    if not (torchrun or workers or wrapper or other):
        return None  # nothing alive: no wait to name
    return StillEnding(ms / 1000, torchrun, workers, wrapper == 1, other)
