"""The queue behind the seam (`fleet submit`, `fleet sweep`, `fleet queue`): what a backend
that queues runs answers. The hosts backend answers with a runner on one host of the inventory
and an agent on each (fleet.backends.hosts.queue); Slurm has a queue of its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleet.config.job import Job
from fleet.console import Console
from fleet.facts.queue import QueueLook
from fleet.run.sweeps import SweepRecord


@dataclass(frozen=True)
class Queued:
    """One run to queue: its id, its parameters (a sweep's grid values), the job as it runs
    (with them as arguments or environment), its priority and its expected time."""

    run_id: str
    job: Job
    params: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    expect_s: float | None = None


class Queue(Protocol):
    def submit(self, sweep: SweepRecord, runs: list[Queued], console: Console) -> SweepRecord:
        """Stage every run on every host that may run it, then queue them all at once (all or
        nothing: a host that cannot be staged queues none), and make sure the runner and the
        agents run. The sweep's record, as queued."""
        ...

    def look(self) -> QueueLook:
        """The queue as its runner last wrote it (history is the caller's to keep)."""
        ...

    def cancel(self, names: list[str], console: Console) -> QueueLook:
        """Stop these sweeps or runs: what waits never starts, what runs is stopped; the
        queue once they all ended (or the bound passed)."""
        ...
