"""The queue's packing: runs of uneven length on a lab's GPUs, placed by the queue's own rule
(fleet/nodeside/shared/queue_rules.py `place`, the function its runner calls) in time, side by
side with the baseline a person has without a queue: one run started on each GPU as one ends,
in the order they were written down. Both against the ideal packing's lower bound (the mean
load, the longest run, the two that must share a GPU). The lengths are known to the simulation
only; the queue sees them where they were given (`--expect`), and the last row shows it
without them. The e2e test (tests/e2e/test_e2e_queue.py) measures the real thing on the
testbed, with the runs' real start-up in their lengths."""

from __future__ import annotations

import heapq
import random

from bench.common import Config, Table
from fleet.nodeside.shared.queue_rules import Slots, Spec, place

TARGET = 1.15  # makespan / ideal, at most, with --expect


def ideal(lengths: list[float], slots: int) -> float:
    s = sorted(lengths, reverse=True)
    pair = s[slots - 1] + s[slots] if len(s) > slots else 0.0
    return max(sum(s) / slots, s[0], pair)


def simulate(lengths: list[float], hosts: int, gpus: int, expect: bool) -> float:
    """The makespan when the runner places these single-GPU runs as GPUs free up."""
    specs = [Spec(f"r-{i}", "sw", 1, 0, length if expect else None, float(i), 1,
                  tuple(f"h{k}" for k in range(hosts)))
             for i, length in enumerate(lengths)]
    order = [f"h{k}" for k in range(hosts)]
    free = {h: set(range(gpus)) for h in order}
    waiting, ends, now = list(specs), [], 0.0
    length = {s.run: lengths[i] for i, s in enumerate(specs)}
    while waiting or ends:
        agents = {h: Slots(tuple(range(gpus)), set(free[h])) for h in order}
        for spec, host, got in place(waiting, agents, order):
            waiting.remove(spec)
            free[host] -= set(got)
            heapq.heappush(ends, (now + length[spec.run], host, got))
        now, host, got = heapq.heappop(ends)
        free[host] |= set(got)
    return now


def by_hand(lengths: list[float], slots: int) -> float:
    """One run started on the first GPU to free up, in the order written down."""
    ends = [0.0] * slots
    for length in lengths:
        heapq.heapreplace(ends, ends[0] + length)
    return max(ends)


def run(cfg: Config) -> list[Table]:
    table = Table("The queue's packing (simulated, the runner's own placement rule)",
                  ["runs", "lengths", "GPUs", "ideal >=", "by hand / ideal", "queue / ideal",
                   "queue without --expect / ideal"])
    rng = random.Random(42)
    cases = [(24, (10, 40), 3, 4), (60, (60, 3600), 3, 4), (200, (30, 600), 8, 8)]
    for n, (lo, hi), hosts, gpus in cases[:2] if cfg.quick else cases:
        lengths = [rng.uniform(lo, hi) for _ in range(n)]
        slots = hosts * gpus
        best = ideal(lengths, slots)
        queued = simulate(lengths, hosts, gpus, True)
        blind = simulate(lengths, hosts, gpus, False)
        table.add(n, f"{lo}-{hi} s", f"{hosts}x{gpus}", f"{best:.0f} s",
                  f"{by_hand(lengths, slots) / best:.3f}x", f"{queued / best:.3f}x",
                  f"{blind / best:.3f}x")
        if queued / best > TARGET:
            table.problems.append(f"{n} runs: {queued / best:.3f}x the ideal (target "
                                  f"{TARGET}x)")
    table.notes.append("by hand: a run started on each GPU as one ends, in the order written "
                       "down; queue: longest expected first (fleet sweep --expect), each on "
                       "the fullest host it fits")
    return [table]
