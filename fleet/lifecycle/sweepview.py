"""A sweep and the queue as words and as JSON: `fleet sweep status` (a row per run: its
parameters, state, host and GPUs, duration, the last value of the job's first metric), a
followed sweep's lines, `fleet queue` (what waits, and for what)."""

from __future__ import annotations

import dataclasses
from typing import Any

from fleet.facts.queue import QueuedRun, QueueLook
from fleet.run.sweeps import SweepRecord
from fleet.tables import draw


def where(r: QueuedRun) -> str:
    if not r.host:
        return "-"
    return f"{r.host} GPU {','.join(map(str, r.gpu_ids))}" if r.gpu_ids else r.host


def duration(r: QueuedRun) -> str:
    if r.started is None:
        return "-"
    end = r.ended if r.ended is not None else r.seen
    if not end:
        return "-"
    s = max(0, int(end - r.started))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def value(r: QueuedRun, name: str | None) -> str:
    if name is None or name not in r.metrics:
        return "-"
    return f"{r.metrics[name]:.4g}"


def metric_name(rec: SweepRecord) -> str | None:
    """The metric the table shows: the first any run reported."""
    for r in rec.runs:
        if r.metrics:
            return next(iter(r.metrics))
    return None


def table(rec: SweepRecord) -> list[str]:
    names = list(rec.runs[0].params) if rec.runs else []
    metric = metric_name(rec)
    headers = ["#", *names, "STATE", "WHERE", "TIME", (metric or "METRIC").upper()]
    rows = []
    for i, r in enumerate(rec.runs, 1):
        state = r.state + (f" (attempt {r.attempt})" if r.attempt > 1 else "")
        rows.append([str(i), *(r.params.get(n, "") for n in names), state, where(r),
                     duration(r), value(r, metric)])
    counts: dict[str, int] = {}
    for r in rec.runs:
        counts[r.state] = counts.get(r.state, 0) + 1
    head = (f"sweep {rec.sweep_id}: {rec.job_name} on {rec.inventory}, "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return [head, draw(headers, rows, [], None, False)]


def line(r: QueuedRun) -> str:
    """One run's news, as a followed sweep says it."""
    params = " ".join(f"{k}={v}" for k, v in r.params.items())
    tail = {"queued": r.why or "queued", "running": f"running on {where(r)}"}.get(
        r.state, f"{r.state} after {duration(r)}"
        + (f", exit code {r.exit_code}" if r.exit_code not in (None, 0) else "")
        + "".join(f", {k} {v:.4g}" for k, v in r.metrics.items())
        + (f" ({r.why})" if r.why and r.state != "succeeded" else ""))
    return f"{r.run_id}{' ' + params if params else ''}: {tail}"


def as_dict(rec: SweepRecord) -> dict[str, Any]:
    out = dataclasses.asdict(rec)
    out["v"] = 1
    return out


def queue_rows(look: QueueLook) -> list[str]:
    live = {k: r for k, r in look.runs.items() if r.state in ("queued", "running")}
    head = ("the queue's runner is running" if look.alive else
            "no queue runner is running (nothing queued, or its host is gone)")
    if look.damaged:
        head += f"; {look.damaged}"
    if not live:
        return [head, "nothing queued or running"]
    rows = [[k, r.state, where(r) if r.state == "running" else r.why or "-"]
            for k, r in sorted(live.items(), key=lambda kv: (kv[1].state != "running", kv[0]))]
    return [head, draw(["RUN", "STATE", "WHERE / WAITS FOR"], rows, [], None, False)]
