"""A stop of several nodes as it goes, from fleet's own steps of each node's stop (its
connection, the stop's record) and what each node's stop.sh then says is still ending: one
`Stopping` event (fleet.events) each time the summary a person sees changes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from fleet.events import Ending, Stopping
from fleet.facts.stopping import StillEnding, StopStep
from fleet.waits import SLOW_S

TICK_S = 0.25  # how often the seconds of a slow step are looked at again


class StopProgress:
    """Hears each node (`heard(node, fleet's step or what stop.sh says is still ending)`, then
    `heard(node, None)` once its stop is over) and emits a Stopping event where the words would
    change: how many nodes are done, and the node waited for longest with what it waits for (a
    step of fleet's own once it has taken SLOW_S; a node connected to again is not done).
    Held (`with`), it looks again as the seconds go, so that a node slow to connect is named
    while nothing else changes."""

    def __init__(self, nodes: list[str], emit: Callable[[Stopping], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nodes, self.emit, self.clock = list(nodes), emit, clock
        self.done: set[str] = set()
        self.still: dict[str, StillEnding] = {}
        self.steps: dict[str, tuple[Ending, float]] = {}  # fleet's own step, and its start
        self.lock = threading.Lock()
        self.last: Stopping | None = None
        self._over = threading.Event()
        self._ticker: threading.Thread | None = None

    def heard(self, node: str, said: StopStep | None) -> None:
        with self.lock:
            if node not in self.nodes:
                return  # not one of this stop's nodes: nothing a node says adds one
            if said is Ending.CONNECTING:
                self.done.discard(node)  # its stop tried again, on a fresh connection
            if said is None:
                self.done.add(node)
                self.still.pop(node, None)
                self.steps.pop(node, None)
            elif node in self.done:
                return
            elif isinstance(said, StillEnding):
                self.still[node] = said
                self.steps.pop(node, None)
            elif node not in self.still:
                self.steps[node] = (said, self.clock())
            self._said()

    def tick(self) -> None:
        """The summary again, as the seconds of a slow step go."""
        with self.lock:
            self._said()

    def _said(self) -> None:
        event = self.summary()
        if event != self.last:
            self.last = event
            self.emit(event)  # in order (under the lock): the last said is the last state

    def summary(self) -> Stopping:
        done, total, now = len(self.done), len(self.nodes), self.clock()
        waits: list[tuple[float, str, Ending, StillEnding | None]] = [
            (s.since, host, s.what, s) for host, s in self.still.items()]
        waits += [(now - since, host, step, None) for host, (step, since) in self.steps.items()
                  if now - since >= SLOW_S]
        if not waits:
            return Stopping(done, total)
        secs, host, what, s = max(waits, key=lambda w: (w[0], w[1]))
        count = 0 if s is None else \
            s.workers if what is Ending.WORKERS else s.other if what is Ending.OTHER else 0
        return Stopping(done, total, host, what, float(int(secs)), count)

    def __enter__(self) -> StopProgress:
        self._ticker = threading.Thread(target=self._tick, daemon=True, name="fleet-stopping")
        self._ticker.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._over.set()
        if self._ticker is not None:
            self._ticker.join()

    def _tick(self) -> None:
        while not self._over.wait(TICK_S):
            self.tick()
