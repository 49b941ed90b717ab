"""The queue's packing: runs of uneven length on a lab's GPUs, placed by the queue's own rule
(fleet/nodeside/shared/queue_rules.py `place`, the function its runner calls) in time, side by
side with the baseline a person has without a queue: one run started on each GPU as one ends,
in the order they were written down. Both against the ideal packing of the same lengths (found
by search, to 0.2%). The lengths are known to the simulation
only; the queue sees them where they were given (`--expect`), and the last row shows it
without them. The e2e test (tests/e2e/test_e2e_queue.py) measures the real thing on the
testbed, with the runs' real start-up in their lengths."""

from __future__ import annotations

import heapq
import random

from bench.common import Config, Table
from fleet.nodeside.shared.queue_plan import packed
from fleet.nodeside.shared.queue_rules import Slots, Spec, place

TARGET = 1.15  # makespan / ideal, at most, with --expect
SEARCH = 200_000  # steps of one packing search, at most


def lower_bound(lengths: list[float], slots: int) -> float:
    """No packing ends sooner: the mean load, the longest, the two that share a GPU."""
    s = sorted(lengths, reverse=True)
    pair = s[slots - 1] + s[slots] if len(s) > slots else 0.0
    return max(sum(s) / slots, s[0], pair)


def fits_in(lengths: list[float], slots: int, limit: float) -> bool:
    """Whether these lengths pack onto `slots` GPUs, none busy past `limit` (a search: longest
    first, into each distinct load once)."""
    s = sorted(lengths, reverse=True)
    loads = [0.0] * slots
    budget = [SEARCH]
    rest = [sum(s[i:]) for i in range(len(s) + 1)]

    def place(i: int) -> bool:
        if i == len(s):
            return True
        budget[0] -= 1
        if budget[0] < 0:  # undecided: taken as packing, so the ideal is never overstated
            return True
        if rest[i] > sum(limit - x for x in loads) + 1e-9:
            return False
        tried: set[float] = set()
        for k in range(slots):
            if loads[k] + s[i] <= limit + 1e-9 and loads[k] not in tried:
                tried.add(loads[k])
                loads[k] += s[i]
                if place(i + 1):
                    return True
                loads[k] -= s[i]
        return False

    return place(0)


def ideal(lengths: list[float], slots: int, within: float = 0.002) -> float:
    """The best packing's makespan, to `within` of it (a bisection between the lower bound and
    the longest-first packing, which is at most 4/3 of it)."""
    lo = lower_bound(lengths, slots)
    ends = [0.0] * slots
    for length in sorted(lengths, reverse=True):
        heapq.heapreplace(ends, ends[0] + length)
    hi = max(ends)
    while hi - lo > within * lo:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits_in(lengths, slots, mid) else (mid, hi)
    return hi


def simulate(lengths: list[float], hosts: int, gpus: int, expect: bool,
             held: int = 0) -> float:
    """The makespan when the runner places these single-GPU runs as GPUs free up, by its own
    rules (queue_plan.packed where the lengths are known, else queue_rules.place); `held`
    GPUs of the first host are a colleague's the whole time."""
    specs = [Spec(f"r-{i}", "sw", 1, 0, length if expect else None, float(i), 1,
                  tuple(f"h{k}" for k in range(hosts)))
             for i, length in enumerate(lengths)]
    order = [f"h{k}" for k in range(hosts)]
    free = {h: set(range(held if h == "h0" else 0, gpus)) for h in order}
    running: dict[tuple[str, int], float] = {}  # GPU -> its run's end
    waiting, ends, now = list(specs), [], 0.0
    length = {s.run: lengths[i] for i, s in enumerate(specs)}
    while waiting or ends:
        agents = {h: Slots(tuple(range(gpus)), set(free[h]), busy={
            g: end - now for (host, g), end in running.items() if host == h}) for h in order}
        plan = packed(waiting, agents, order)
        for spec, host, got in place(waiting, agents, order) if plan is None else plan:
            waiting.remove(spec)
            free[host] -= set(got)
            running[(host, got[0])] = now + length[spec.run]
            heapq.heappush(ends, (now + length[spec.run], host, got))
        now, host, got = heapq.heappop(ends)
        free[host] |= set(got)
        running.pop((host, got[0]), None)
    return now


def run(cfg: Config) -> list[Table]:
    table = Table("The queue's packing (simulated, the runner's own placement rule)",
                  ["runs", "lengths", "GPUs", "ideal", "by hand / ideal", "queue / ideal",
                   "queue without --expect / ideal"])
    rng = random.Random(42)
    # (runs, lengths, hosts, GPUs each, GPUs a colleague holds the whole time)
    cases = [(24, (10, 40), 3, 4, 0), (24, (10, 40), 3, 4, 1), (60, (60, 3600), 3, 4, 0),
             (200, (30, 600), 8, 8, 0)]
    for n, (lo, hi), hosts, gpus, held in cases[:3] if cfg.quick else cases:
        lengths = [rng.uniform(lo, hi) for _ in range(n)]
        slots = hosts * gpus - held
        best = ideal(lengths, slots)
        queued = simulate(lengths, hosts, gpus, True, held)
        blind = simulate(lengths, hosts, gpus, False, held)
        ends = [0.0] * slots
        for length in lengths:
            heapq.heapreplace(ends, ends[0] + length)
        table.add(n, f"{lo}-{hi} s", f"{hosts}x{gpus}" + (f" - {held}" if held else ""),
                  f"{best:.0f} s",
                  f"{max(ends) / best:.3f}x", f"{queued / best:.3f}x",
                  f"{blind / best:.3f}x")
        if queued / best > TARGET:
            table.problems.append(f"{n} runs: {queued / best:.3f}x the ideal (target "
                                  f"{TARGET}x)")
    table.notes.append("by hand: a run started on each GPU as one ends, in the order written "
                       "down; queue: the runner's plan for runs of known lengths (fleet sweep "
                       "--expect); without --expect, the order queued; 3x4 - 1: a colleague "
                       "holds one GPU the whole time")
    return [table]
