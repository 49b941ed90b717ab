"""The straggler watch of an attached `fleet up` (`[watchdog] straggler`): a daemon thread reads
every rank's sampling through the seam (Run.ranks) every LOOK_S seconds, judges it
(fleet.run.straggler) and hands each rank it names to the monitor, which says it in its own
thread. Nothing the watch meets fails the run: a node that cannot be asked is left out of that
look, and a look that fails whole is no look."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from fleet.backends.answers import NodeLook
from fleet.backends.base import Run
from fleet.lifecycle.spares import Places
from fleet.run import straggler
from fleet.run.straggler import Straggler

LOOK_S = 5.0  # between two looks at every rank's sampling
# Per straggler's host: the spare that would take its place in the next attempt, or None and
# why none would (`[watchdog] straggler_action = "replace"`).
SpareFor = Callable[[str], tuple[str | None, str]]


class StragglerWatch:
    """Looks at the run's ranks until closed; `named()` gives what it named since the last
    call. Its thread is a daemon: it never keeps fleet alive."""

    def __init__(self, run: Run, factor: float, every: float | None = None,
                 persist: int = straggler.PERSIST) -> None:
        self.run, self.factor = run, factor
        self.every = LOOK_S if every is None else every
        self.watch = straggler.Watch(persist)
        self.looks = 0  # looks judged (a failed one is not)
        self.problem = ""  # why the last look failed whole, if it did
        self._named: queue.SimpleQueue[Straggler] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="fleet-straggler-watch",
                                       daemon=True)

    def start(self) -> StragglerWatch:
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            found = self.look()
            if found is not None and not self._stop.is_set():
                self._named.put(found)

    def look(self) -> Straggler | None:
        """One look at every node: the straggler named by it, if this look names one."""
        try:
            answers = self.run.ranks()
            tops = {h: a.top for h, a in answers.items() if isinstance(a, NodeLook)}
            standing = straggler.judge(straggler.ranks_of(tops), self.factor)
        except Exception as e:  # the watch is news, never the reason a run fails
            self.problem = f"{type(e).__name__}: {e}"
            return None
        self.looks += 1
        return self.watch.look(standing)

    def named(self) -> list[Straggler]:
        """The ranks named since the last call, in order."""
        out = []
        while True:
            try:
                out.append(self._named.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """No look after this (one under way ends by itself, its answer dropped)."""
        self._stop.set()


def spare_for(places: Places, attempt: int, most: int) -> SpareFor:
    """With `[restart]`: the free spare that would take a straggler's host's place after
    attempt `attempt` (of at most `most` restarts), or why none would."""

    def spare(host: str) -> tuple[str | None, str]:
        if attempt > most:
            return None, f"no attempt left ([restart] max = {most})"
        free = places.free()
        return (free[0], "") if free else (None, "no spare is free")

    return spare
