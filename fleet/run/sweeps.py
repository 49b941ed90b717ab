"""What fleet saw of queued runs (`fleet sweep`, `fleet submit`), kept on this machine under
<state dir>/sweeps/<sweep id>.json: what was queued, with which parameters, and each run's
place and end as fleet last saw them in the queue runner's state. History: an end fleet saw is
never taken back by a later look (a lost host's runner cannot say otherwise), and `fleet sweep
status` and `fleet usage` read it with every host gone."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from fleet.errors import RunNotFound, UsageError
from fleet.facts.queue import QueuedRun
from fleet.nodeside.shared.queue_rules import STATES
from fleet.run.record import state_dir, write_atomic


@dataclass(frozen=True)
class SweepRecord:
    """A sweep (or one submitted run: kind "submit"): the job, the inventory and the queue's
    host, who submitted it and when, and its runs."""

    sweep_id: str
    job: str  # the job file's path
    job_name: str
    inventory: str
    queue_host: str
    user: str  # who submitted it, on this machine
    submitted: float
    kind: str = "sweep"
    runs: tuple[QueuedRun, ...] = ()
    workdirs: dict[str, str] = field(default_factory=dict)  # per host, as staged (home known)


def sweeps_dir() -> Path:
    return state_dir().parent / "sweeps"


def save(rec: SweepRecord) -> None:
    d = sweeps_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(d / f"{rec.sweep_id}.json",
                     json.dumps(dataclasses.asdict(rec), indent=1) + "\n")
    except OSError as e:
        raise UsageError(f"cannot record the sweep in {d}: {e}; set FLEET_STATE_DIR to a "
                         "writable directory") from e


def parse(text: str) -> SweepRecord:
    """A sweep record from its JSON (ValueError, KeyError or TypeError where damaged)."""
    data = json.loads(text)
    runs = []
    for r in data.pop("runs"):
        r["gpu_ids"] = tuple(r.get("gpu_ids", ()))
        if r.get("state") not in STATES:
            raise ValueError(f"unknown state {r.get('state')!r}")
        runs.append(QueuedRun(**r))
    return SweepRecord(**data, runs=tuple(runs))


def all_sweeps() -> tuple[list[SweepRecord], dict[str, str]]:
    """Every sweep recorded here, oldest first, and the damaged ones' words by file name."""
    out, damaged = [], {}
    d = sweeps_dir()
    for p in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            out.append(parse(p.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            damaged[p.name] = f"damaged sweep record: {e}"
    out.sort(key=lambda s: (s.submitted, s.sweep_id))
    return out, damaged


def load(sweep_id: str | None = None) -> SweepRecord:
    """The sweep of that id (or a unique prefix of it); the latest where None."""
    every, _ = all_sweeps()
    if sweep_id is None:
        if not every:
            raise RunNotFound("no sweep recorded on this machine yet (fleet sweep JOB --grid ...)")
        return every[-1]
    found = [s for s in every if s.sweep_id == sweep_id] or [
        s for s in every if s.sweep_id.startswith(sweep_id)]
    if len(found) != 1:
        raise RunNotFound(f"no sweep {sweep_id!r} recorded on this machine" if not found else
                          f"{sweep_id!r} names {len(found)} sweeps: give more of its id")
    return found[0]


def merged(rec: SweepRecord, seen: dict[str, QueuedRun]) -> SweepRecord:
    """The record with what a look at the queue saw: an end already recorded stays, whatever
    a later look says (history; the runner starts a lost run again before it ends it)."""
    runs = []
    for old in rec.runs:
        new = seen.get(old.run_id)
        if new is None or old.ended_state:
            runs.append(old)
        else:
            runs.append(dataclasses.replace(new, params=old.params, gpus=old.gpus,
                                            priority=old.priority, expect_s=old.expect_s))
    return dataclasses.replace(rec, runs=tuple(runs))
