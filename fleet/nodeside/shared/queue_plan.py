"""Packing runs whose lengths are known (`--expect`): where every waiting run needs one GPU
and says how long it takes, the runner plans them all at once instead of placing the longest
first as GPUs free up. Each GPU the queue may use is a bin that is ready now, or when the run
on it is expected to end; the plan is first-fit-decreasing into bins of the smallest common end
that fits (a bisection: MULTIFIT), each GPU's runs longest first. What starts now is the first
run planned for each free GPU; the rest is planned again at the next event, with what really
happened. Longest first alone puts the last few short runs on top of full GPUs where there are
a few more runs than twice the GPUs (24 runs on 11 GPUs: about 1.2x the best packing)."""

from __future__ import annotations

from typing import Any

from fleet.nodeside.shared.queue_rules import RUNNING, SUCCEEDED, Slots, Spec

ROUNDS = 30  # bisection steps
BUSY_S = 1.0


def packed(specs: list[Spec], agents: dict[str, Slots], hosts: list[str], extra: float = 0.0
           ) -> list[tuple[Spec, str, tuple[int, ...]]] | None:
    """What starts now by the plan (GPUs taken out of `agents`), or None where the plan does
    not apply (a run needs more than one GPU or a whole host, says no length, or runs of
    several priorities wait). `extra`: what a run takes beyond what it said (overrun())."""
    if not specs or any(s.gpus != 1 or s.expect is None for s in specs) or len(
            {s.priority for s in specs}) > 1:
        return None
    # a busy GPU no sooner than a second from now, even where its run overran what it said
    bins = [(host, g, 0.0 if g in slots.free else max(BUSY_S, slots.busy.get(g, 0.0)))
            for host in hosts if (slots := agents.get(host)) is not None and not slots.whole
            for g in slots.gpus if g in slots.free or g in slots.busy]
    if not bins:
        return []
    jobs = sorted(specs, key=lambda s: (-(s.expect or 0.0), s.submitted, s.run))
    total = sum(s.expect or 0.0 for s in jobs) + extra * len(jobs) + sum(b[2] for b in bins)
    lo = max(total / len(bins), max(s.expect or 0.0 for s in jobs) + extra)
    hi = max(b[2] for b in bins) + sum(s.expect or 0.0 for s in jobs) + extra * len(jobs)
    best = _fill(jobs, bins, hi, extra)
    for _ in range(ROUNDS):
        mid = (lo + hi) / 2
        got = _fill(jobs, bins, mid, extra)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    out: list[tuple[Spec, str, tuple[int, ...]]] = []
    left = list(jobs)
    for k, (host, g, ready) in enumerate(bins):
        planned = [s for s in (best or {}).get(k, []) if s in left]
        if ready == 0.0 and g in agents[host].free and planned:
            out.append((planned[0], host, (g,)))  # its longest
            left.remove(planned[0])
            agents[host].free.discard(g)
    for host, g, ready in bins:  # a free GPU the plan left idle takes the longest left
        fit = [s for s in left if host in s.hosts]
        if ready == 0.0 and g in agents[host].free and fit:
            out.append((fit[0], host, (g,)))
            left.remove(fit[0])
            agents[host].free.discard(g)
    return out


def _fill(jobs: list[Spec], bins: list[tuple[str, int, float]], end: float, extra: float
          ) -> dict[int, list[Spec]] | None:
    """First fit, longest first, into bins that end by `end`; None where one does not fit."""
    loads = [b[2] for b in bins]
    plan: dict[int, list[Spec]] = {}
    for spec in jobs:
        length = (spec.expect or 0.0) + extra
        for k, (host, _, _) in enumerate(bins):
            if host in spec.hosts and loads[k] + length <= end + 1e-9:
                loads[k] += length
                plan.setdefault(k, []).append(spec)
                break
        else:
            return None
    return plan


def overrun(runs: dict[str, dict[str, Any]], specs: dict[str, Spec]) -> float:
    """What runs take beyond what they said (their start-up, a slower host), learnt from those
    that ended: the median, at least 0."""
    over = sorted(r["ended"] - r["started"] - specs[k].expect for k, r in runs.items()
                  if r["state"] == SUCCEEDED and k in specs and specs[k].expect is not None
                  and isinstance(r.get("started"), float) and isinstance(r.get("ended"), float))
    return max(0.0, over[len(over) // 2]) if over else 0.0


def views_of(agents: dict[str, Slots], runs: dict[str, dict[str, Any]], specs: dict[str, Spec],
             now: float, extra: float = 0.0) -> dict[str, Slots]:
    """Each host as the placement sees it: what its agent last said, less the GPUs of the
    queue's runs there (started or on their way), each with its run's expected time left."""
    views = {}
    for host, s in agents.items():
        mine = {run: r for run, r in runs.items() if r["host"] == host and r["state"] == RUNNING}
        busy = {g: _left(specs.get(run), r["started"], now, extra)
                for run, r in mine.items() for g in r["gpus"]}
        whole = s.whole or any(run in specs and specs[run].gpus == 0 for run in mine)
        views[host] = Slots(s.gpus, s.free - set(busy), s.held, whole, busy)
    return views


def _left(spec: Spec | None, started: float | None, now: float, extra: float) -> float:
    expect = spec.expect + extra if spec is not None and spec.expect is not None else 0.0
    return max(0.0, expect - (now - started if started is not None else 0.0))
