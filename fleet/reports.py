"""What a run's seam returns where it once returned sentences: a stop's result, the end of a
run that never started, a detached start. Data only; fleet.phrases makes the words."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stopped:
    """What a stop achieved: per node (or "slurm") why a process may still run there (none:
    stopped everywhere). `job`: the scheduler's job that was cancelled as one (Slurm), and
    the state it was left in, where known."""

    run_id: str
    problems: tuple[tuple[str, str], ...] = ()
    job: str = ""
    state: str = ""


@dataclass(frozen=True)
class Forgotten:
    """Nothing of the run ever started, and what its preparation left was removed (best
    effort). `scheduler`: nothing was submitted to it; `maybe_queued`: the job's name where the
    scheduler may have queued it all the same (its directory `kept`, and the record)."""

    scheduler: str = ""
    maybe_queued: str = ""
    kept: str = ""


@dataclass(frozen=True)
class Detached:
    """The run goes on without fleet: how many of its nodes had started (`of` them) after
    `waited` seconds; `job`: the scheduler's job (a queued one may not have started)."""

    run_id: str
    started: int
    of: int
    waited: float = 0.0
    job: str = ""
    queued: bool = False  # the scheduler had not started it yet
