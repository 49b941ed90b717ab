"""Sweeps and submitted runs as data: a grid's combinations, each one's job (its values as the
job's arguments or environment), its expected time, its id; and what a look at the queue adds
to the sweep's record on this machine (history: fleet.run.sweeps)."""

from __future__ import annotations

import dataclasses
import getpass
import itertools
import re
import secrets
import time
from pathlib import Path

from fleet.backends.queueing import Queued
from fleet.config.job import Job, with_extra_args
from fleet.config.select import Selection, load_selected
from fleet.errors import UsageError
from fleet.facts.queue import QueuedRun, QueueLook
from fleet.nodeside.shared import nodemap
from fleet.run import record, sweeps
from fleet.run.sweeps import SweepRecord
from fleet.timespan import parse_duration

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
MOST_RUNS = 1000  # combinations one sweep may have
MOST_VALUE = 200  # characters of one value


def parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    """`--grid lr=1e-3,3e-4` (each given once): the names in order, each with its values."""
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not NAME.match(name):
            raise UsageError(f"--grid {item!r}: write NAME=V1,V2 (a name of letters, digits and "
                             "_, not starting with a digit)")
        if any(name == n for n, _ in grid):
            raise UsageError(f"--grid {name} is given twice: give each name once, with all "
                             "its values")
        vals = values.split(",")
        for v in vals:
            if not v or len(v) > MOST_VALUE or not v.isprintable():
                raise UsageError(f"--grid {name}: {v!r} is no value (1 to {MOST_VALUE} "
                                 "printable characters, none of them a comma)")
        if len(set(vals)) != len(vals):
            raise UsageError(f"--grid {name}: a value is given twice")
        grid.append((name, vals))
    if not grid:
        raise UsageError("a sweep needs at least one --grid NAME=V1,V2")
    count = 1
    for _, vals in grid:
        count *= len(vals)
    if count > MOST_RUNS:
        raise UsageError(f"the grid makes {count} runs: at most {MOST_RUNS} a sweep")
    return grid


def combos(grid: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    names = [n for n, _ in grid]
    return [dict(zip(names, vals, strict=True))
            for vals in itertools.product(*(v for _, v in grid))]


def with_params(job: Job, params: dict[str, str], how: str) -> Job:
    """The job with a combination's values: `--name value` after its arguments (in the place
    of its `{args}` word, where it has one), or (how = "env") each as an environment variable
    of that name."""
    if how == "env":
        return dataclasses.replace(job, env={**job.env, **params})
    return with_extra_args(job, [w for k, v in params.items() for w in (f"--{k}", v)])


def expected(template: str | None, params: dict[str, str]) -> float | None:
    """`--expect`: a duration (30m), or one made of the grid's values ({epochs}m)."""
    if template is None:
        return None
    try:
        text = template.format_map(params)
    except (KeyError, ValueError, IndexError) as e:
        raise UsageError(f"--expect {template!r}: {e} is not a name of the grid") from None
    seconds = parse_duration(text)
    if seconds is None:
        raise UsageError(f"--expect {template!r} gives {text!r}, not a duration (40s, 30m, 2h)")
    return seconds


def new_sweep(job: Job, inventory: Path, queue_host: str, kind: str,
              runs: list[tuple[dict[str, str], Job, int, float | None]]) -> tuple[
                  SweepRecord, list[Queued]]:
    """A new sweep's record and its runs to queue, ids `<sweep>-<n>`."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    sweep_id = f"{job.name}-{'sweep' if kind == 'sweep' else 'q'}-{stamp}-{secrets.token_hex(2)}"
    queued = [Queued(f"{sweep_id}-{i}", j, params, priority, expect)
              for i, (params, j, priority, expect) in enumerate(runs, 1)]
    rec = SweepRecord(
        sweep_id=sweep_id, job=str(job.path), job_name=job.name, inventory=str(inventory),
        queue_host=queue_host, user=getpass.getuser(), submitted=time.time(), kind=kind,
        runs=tuple(QueuedRun(run_id=q.run_id, params=q.params,
                             gpus=q.job.placement.gpus_per_node or 0, priority=q.priority,
                             expect_s=q.expect_s) for q in queued))
    return rec, queued


def seen(rec: SweepRecord, look: QueueLook) -> SweepRecord:
    """The sweep's record with what this look saw of its runs, kept on this machine; a run
    seen on a host for the first time (or a new attempt's) gets a run record of its own, so
    that `fleet logs`, `status`, `stop` and `ps` know it."""
    new = sweeps.merged(rec, {r: look.runs[r] for r in (q.run_id for q in rec.runs)
                              if r in look.runs})
    if new == rec:
        return new
    sweeps.save(new)
    placed = [(old, now) for old, now in zip(rec.runs, new.runs, strict=True)
              if now.host and now.host in rec.workdirs and now.started is not None
              and (now.host, now.attempt) != (old.host, old.attempt if old.started else 0)]
    if placed:
        hosts = {h.name: h for h in load_selected(Path(rec.inventory), Selection()).hosts}
        for _, r in placed:
            if r.host in hosts:
                record.save_queued(r.run_id, rec.job, r.started or time.time(), hosts[r.host],
                                   nodemap.run_dir(rec.workdirs[r.host], r.run_id, r.host),
                                   len(r.gpu_ids) or None)
    return new


def done(rec: SweepRecord) -> bool:
    return all(r.ended_state for r in rec.runs)
