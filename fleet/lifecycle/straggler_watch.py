"""The straggler watch of an attached `fleet up` (`[watchdog] straggler`): a daemon thread reads
every rank's sampling through the seam (Run.ranks) every LOOK_S seconds, judges it
(fleet.run.straggler) and hands each rank it names to the monitor, which says it in its own
thread. Nothing the watch meets fails the run: a node that cannot be asked is left out of that
look, and a look that fails whole is no look."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable

from fleet.backends.answers import NodeLook
from fleet.backends.base import Run
from fleet.errors import FleetError
from fleet.lifecycle.spares import Places
from fleet.run import record, straggler
from fleet.run.straggler import Straggler

LOOK_S = 5.0  # between two looks at every rank's sampling
BLIND_LOOKS = 24  # looks with no rank judged before that is said (2 minutes)
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
        self.failed = 0  # looks that failed whole
        self.judged = False  # a look has judged two ranks or more
        self.why = ""  # why the last look judged none
        self.told = False
        self._named: queue.SimpleQueue[Straggler] = queue.SimpleQueue()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="fleet-straggler-watch",
                                       daemon=True)
        self.planned: dict[str, range] = {}  # the ranks the plan gave each node, where known
        # (a run recorded elsewhere, a test's: every rank a node claims is judged)
        with contextlib.suppress(FleetError, OSError, AttributeError):
            self.planned = straggler.spans(record.load(run.run_id).nodes)

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
            standing = straggler.judge(straggler.ranks_of(tops, self.planned), self.factor)
        except Exception as e:  # the watch is news, never the reason a run fails
            self.problem = f"{type(e).__name__}: {e}"
            self.failed += 1
            return None
        self.looks += 1
        if standing.scores:
            self.judged = True
        else:
            self.why = standing.why
        return self.watch.look(standing)

    def blind(self) -> str | None:
        """Once, where BLIND_LOOKS looks (or tries) have judged no rank: why, for a warning
        (a watch that sees nothing must not pass for one that finds nothing)."""
        if self.judged or self.told or self.looks + self.failed < BLIND_LOOKS:
            return None
        self.told = True
        why = self.problem if self.looks == 0 else self.why or self.problem
        return (f"the straggler watch has judged no rank after {BLIND_LOOKS} looks "
                f"({why or 'no answer'}): nothing is named meanwhile")

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
