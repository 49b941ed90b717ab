"""A stop of several nodes as it goes, from what each node's stop.sh says is still ending: one
`Stopping` event (fleet.events) each time the summary a person sees changes."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fleet.events import Ending, Stopping
from fleet.facts.stopping import StillEnding


class StopProgress:
    """Hears each node (`heard(node, what is still ending)`, then `heard(node, None)` once its
    stop is over) and emits a Stopping event where the words would change: how many nodes are
    done, and the node waited for longest with what it waits for."""

    def __init__(self, nodes: list[str], emit: Callable[[Stopping], None]) -> None:
        self.nodes, self.emit = list(nodes), emit
        self.done: set[str] = set()
        self.still: dict[str, StillEnding] = {}
        self.lock = threading.Lock()
        self.last: Stopping | None = None

    def heard(self, node: str, still: StillEnding | None) -> None:
        with self.lock:
            if node not in self.nodes:
                return  # not one of this stop's nodes: nothing a node says adds one
            if still is None:
                self.done.add(node)
                self.still.pop(node, None)
            elif node not in self.done:
                self.still[node] = still
            event = self.summary()
            if event == self.last:
                return
            self.last = event
            self.emit(event)  # in order: the last said is the last state

    def summary(self) -> Stopping:
        done, total = len(self.done), len(self.nodes)
        if not self.still:
            return Stopping(done, total)
        host = max(self.still, key=lambda n: (self.still[n].since, n))
        s = self.still[host]
        what = s.what
        count = s.workers if what is Ending.WORKERS else s.other if what is Ending.OTHER else 0
        return Stopping(done, total, host, what, float(int(s.since)), count)
