"""`fleet usage`: GPU-hours per user, host and job over a window, from this machine's records
alone (the runs' records and the sweeps'), never a host asked. Reading the records makes spans
(one node's part of a run, or one queued run); what follows is pure: the part of each span
inside the window, times its GPUs, summed by user, by host and by job.

A `fleet up` node's GPUs are the ones the inventory chose for it (`gpus`, kept in the run's
record), else those its env in the run's manifest made visible (a CUDA_VISIBLE_DEVICES of the
job's or the inventory's own); where neither says, fleet never recorded how many the run used
there, and the span counts as unknown (its node-hours said, never turned into GPU-hours). A
node's part runs from the run's start (its record's, as `fleet status` says it) to its end as
fleet saw it (kept in outcomes.json), else to the end of its attempt (the next attempt's start,
or the run's kept verdict), else to now: still running, and said so."""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.config.inventory import BackendKind
from fleet.errors import FleetError
from fleet.run import outcomes, sweeps, verdict
from fleet.run.record import RunRecord, all_runs

HOUR = 3600.0


@dataclass(frozen=True)
class Span:
    """One node's part of a run, or one queued run: whose, where, which job, how many GPUs
    (None: not known), from when to when (this machine's clock; a queued run's, its host's),
    and whether it still ran when last seen (counted to `end`, which is then now)."""

    run: str  # the run's id (a restart's attempts: their run's)
    user: str
    host: str
    job: str
    gpus: int | None
    start: float
    end: float
    running: bool = False

    def inside(self, since: float, until: float) -> float:
        """Seconds of it inside [since, until]."""
        return max(0.0, min(self.end, until) - max(self.start, since))


@dataclass
class Row:
    """One user's, host's or job's sum (or the total): GPU-hours, the runs counted (any part
    inside the window), those still running, and those with a part whose GPUs are unknown,
    with that part's node-hours."""

    name: str
    gpu_hours: float = 0.0
    runs: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    unknown_node_hours: float = 0.0

    def add(self, s: Span, seconds: float) -> None:
        self.runs.add(s.run)
        if s.running:
            self.running.add(s.run)
        if s.gpus is None:
            self.unknown.add(s.run)
            self.unknown_node_hours += seconds / HOUR
        else:
            self.gpu_hours += seconds * s.gpus / HOUR

    def as_json(self, key: str) -> dict[str, Any]:
        return {key: self.name, "gpu_hours": round(self.gpu_hours, 6), "runs": len(self.runs),
                "running": len(self.running), "unknown_gpus": len(self.unknown),
                "unknown_node_hours": round(self.unknown_node_hours, 6)}


@dataclass(frozen=True)
class Usage:
    since: float
    until: float
    users: list[Row]
    hosts: list[Row]
    jobs: list[Row]
    total: Row
    not_counted: tuple[str, ...] = ()  # runs whose GPUs fleet never records (Slurm's)
    damaged: dict[str, str] = field(default_factory=dict)  # record: why, skipped


def aggregate(spans: Iterable[Span], since: float, until: float,
              not_counted: Iterable[str] = (), damaged: dict[str, str] | None = None) -> Usage:
    """The spans' parts inside [since, until], summed by user, host and job; each table by
    GPU-hours, most first (then by name)."""
    tables: dict[str, dict[str, Row]] = {"user": {}, "host": {}, "job": {}}
    total = Row("total")
    for s in spans:
        if s.end < since or s.start > until:
            continue
        seconds = s.inside(since, until)
        for key, name in (("user", s.user), ("host", s.host), ("job", s.job)):
            tables[key].setdefault(name, Row(name)).add(s, seconds)
        total.add(s, seconds)

    def ordered(rows: dict[str, Row]) -> list[Row]:
        return sorted(rows.values(), key=lambda r: (-r.gpu_hours, r.name))

    return Usage(since, until, ordered(tables["user"]), ordered(tables["host"]),
                 ordered(tables["job"]), total, tuple(not_counted), dict(damaged or {}))


def as_json(u: Usage) -> dict[str, Any]:
    """`fleet usage --json`'s object (docs/EVENTS.md)."""
    return {"v": 1, "since": u.since, "until": u.until, "total": u.total.as_json("name"),
            "by_user": [r.as_json("user") for r in u.users],
            "by_host": [r.as_json("host") for r in u.hosts],
            "by_job": [r.as_json("job") for r in u.jobs],
            "not_counted": list(u.not_counted), "damaged": u.damaged}


def job_name(run_id: str) -> str:
    """The job's name, the run id's start (`mnist` of mnist-20250101-120000-49b0)."""
    parts = run_id.rsplit("-", 3)
    return parts[0] if len(parts) == 4 and parts[0] else run_id


def run_spans(rec: RunRecord, ends: dict[str, float], closed: float | None, now: float,
              me: str, run: str = "", job: str = "",
              visible: dict[str, int] | None = None) -> list[Span]:
    """Each node's part of one launched run (or attempt): `ends` when fleet saw each node's
    part end, `closed` when the attempt was over without that (the next attempt's start, the
    run's kept verdict; None: nothing says so, it runs on, to `now`). A node's GPUs: those
    the inventory chose, else `visible`'s count for it (the manifest's), else unknown."""
    out = []
    for n in rec.nodes:
        end, running = ends.get(n.host.name), False
        if end is None:
            end, running = (closed, False) if closed is not None else (now, True)
        gpus = len(n.host.gpus) if n.host.gpus else (visible or {}).get(n.host.name)
        out.append(Span(run or rec.run_id, n.host.user or me, n.host.name,
                        job or job_name(rec.run_id), gpus, rec.started,
                        max(end, rec.started), running))
    return out


_DEVICE = re.compile(r"\d{1,4}|(GPU|MIG)-[0-9A-Za-z/-]{1,80}")


def visible_count(value: object) -> int | None:
    """How many GPUs a CUDA_VISIBLE_DEVICES the run was given names (`0,1`: 2; a UUID list
    too); None where it is no plain list of them (empty, `-1`, anything CUDA reads otherwise:
    never a guess)."""
    if not isinstance(value, str) or not value.strip():
        return None
    names = [v.strip() for v in value.split(",")]
    if not all(_DEVICE.fullmatch(v) for v in names) or len(set(names)) != len(names):
        return None
    return len(names)


def manifest_gpus(record_dir: Path) -> dict[str, int]:
    """Per node, the GPUs its env in the run's manifest made visible (the job's or the
    inventory's own CUDA_VISIBLE_DEVICES), where it names a plain list; none without a
    manifest (a run that ended before one was kept)."""
    try:
        nodes = json.loads((record_dir / "manifest.json").read_text())["nodes"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(nodes, dict):
        return {}
    out = {}
    for name, n in nodes.items():
        env = n.get("env") if isinstance(n, dict) else None
        count = visible_count(env.get("CUDA_VISIBLE_DEVICES")) if isinstance(env, dict) else None
        if count is not None:
            out[str(name)] = count
    return out


def queued_spans(rec: sweeps.SweepRecord, now: float) -> list[Span]:
    """Each started run of a sweep, as QueuedRun.gpu_hours counts it: its GPUs (at least 1)
    from its start to its end, else to when fleet last saw it, else to now."""
    out = []
    for q in rec.runs:
        if q.started is None:
            continue
        end = q.ended if q.ended is not None else q.seen or now
        out.append(Span(q.run_id, q.user or rec.user, q.host or rec.queue_host, rec.job_name,
                        max(1, len(q.gpu_ids)), q.started, max(end, q.started),
                        running=q.ended is None and not q.ended_state))
    return out


def me() -> str:
    """This machine's user: who a host with no `user` was logged into as."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "?"


def gather(now: float, since: float) -> tuple[list[Span], list[str], dict[str, str]]:
    """Every span this machine's records hold, the runs started since `since` that fleet
    does not know the GPUs of at all (a Slurm run's: its record keeps no end either), and the
    damaged records (each named with why), skipped."""
    records, damaged = all_runs()
    found, bad = sweeps.all_sweeps()
    queued = {q.run_id for s in found for q in s.runs}  # counted from their sweep's record
    records = [r for r in records if (r.parent or r.run_id) not in queued]
    who = me()
    spans: list[Span] = []
    unknown: list[str] = []
    attempts: dict[str, list[RunRecord]] = {}
    for r in records:  # oldest first: a run's attempts in order
        attempts.setdefault(r.parent or r.run_id, []).append(r)
    for run_id, every in attempts.items():
        top = every[0]  # the run's own record (or, where that is gone, its first attempt's)
        if top.backend is not BackendKind.HOSTS:
            if top.started >= since:
                unknown.append(run_id)
            continue
        parts: list[Span] = []
        try:
            kept = verdict.read(top.dir)
            for i, rec in enumerate(every):
                if not rec.launched:
                    continue
                closed = every[i + 1].started if i + 1 < len(every) else \
                    kept.at if kept is not None else None
                ends = {name: s.at for name, s in outcomes.seen(rec.dir).items() if s.final}
                parts += run_spans(rec, ends, closed, now, who, run_id, job_name(run_id),
                                   manifest_gpus(rec.dir))
        except (FleetError, OSError) as e:  # the whole run skipped, named
            damaged[str(top.dir)] = str(e)
            continue
        spans += parts
    damaged.update({str(sweeps.sweeps_dir() / name): why for name, why in bad.items()})
    for s in found:
        spans += queued_spans(s, now)
    return spans, unknown, damaged


def usage(seconds: float, now: float) -> Usage:
    """GPU-hours of the last `seconds` to `now`, from this machine's records."""
    spans, unknown, damaged = gather(now, now - seconds)
    return aggregate(spans, now - seconds, now, unknown, damaged)
