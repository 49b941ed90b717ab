"""A transfer's progress on the console: bytes in place on the nodes, the rate, the time left."""

from __future__ import annotations

import time
from collections.abc import Callable

from fleet.console import Console
from fleet.transport.transfer.report import NodeState, human

PROGRESS_LINE_S = 10.0  # without a terminal, a progress line this often


class Bar:
    """Progress: bytes in place on the nodes against what they place, the rate and the time
    left; where a person watches (`Console.live`) one line redrawn, else a line now and then."""

    def __init__(self, console: Console, total: int, states: dict[str, NodeState],
                 order: list[str], clock: Callable[[], float] = time.monotonic,
                 label: str = "data") -> None:
        self.console, self.total, self.states, self.order = console, total, states, order
        self.label = label  # what moves: "data" to the nodes, "pulled" from one
        self.clock = clock
        self.tty = console.live
        self.t0 = clock()
        self.shown = self.t0

    def tick(self) -> None:
        now = self.clock()
        every = 0.25 if self.tty else PROGRESS_LINE_S
        if now - self.shown < every or self.total < (8 << 20):
            return
        self.shown = now
        text = self.text(now)
        if self.tty:
            self.console.redraw(f"fleet: {text}")
        else:
            self.console.info(text)

    def text(self, now: float) -> str:
        want = sum(s.expected for s in self.states.values()) or 1
        at = sum(min(s.at, s.expected) for s in self.states.values())
        rate = at / max(now - self.t0, 1e-6)
        eta = (want - at) / rate if rate > 0 else 0.0
        per = {n: s.at * 100 // max(s.expected, 1) for n, s in self.states.items()
               if s.expected}
        nodes = ""
        if len(set(per.values())) > 1:
            nodes = "  " + " ".join(f"{n} {p}%" for n, p in per.items())
        # Before 1% is in place the rate is mostly the start (receivers, first reads): a time
        # left from it would be hours off.
        left = f"{eta:.0f}s left" if at * 100 >= want else "time left: estimating"
        each = {s.expected for s in self.states.values() if s.expected}
        many = sum(1 for s in self.states.values() if s.expected)
        if many > 1 and len(each) == 1:  # one copy sent to N nodes: said once, not N times
            # (fits 80 columns: "data 40.0 MiB of 48.0 MiB on each of 2 nodes, 2.0 MiB/s, 9s left";
            # where the nodes differ, the mean, each node's share after it: the words that
            # matter, the time left, are never the ones cut at the terminal's edge)
            where = f"on each of {many} nodes"
            return (f"{self.label} {human(at // many)} of {human(want // many)} {where}, "
                    f"{human(int(rate / many))}/s, {left}{nodes}")
        return (f"{self.label} {human(at)} of {human(want)} in place, {human(int(rate))}/s, "
                f"{left}{nodes}")

    def end(self) -> None:
        self.console.settle()

