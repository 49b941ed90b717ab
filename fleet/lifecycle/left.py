"""What earlier attempts of a healing run left running on the nodes they lost: stopped in the
background as soon as each node answers again (the next attempt does not wait for it), or named
at the run's end for `fleet stop`."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from fleet.backends.base import Backend
from fleet.console import Console
from fleet.run import outcomes
from fleet.run import record as state

if TYPE_CHECKING:
    from fleet.lifecycle.attempts import Attempt

LEFT_POLL_S = 5.0  # how often the nodes an attempt lost are tried again while the run goes on


class Left:
    """What earlier attempts left running on the nodes they lost: stopped as soon as each node
    answers again, tried every LEFT_POLL_S while the run goes on (a thread of its own), and
    once more at its end; what still could not be stopped then is named."""

    def __init__(self, backend: Backend, console: Console, run_id: str) -> None:
        self.backend, self.console, self.run_id = backend, console, run_id
        self.parts: dict[tuple[str, str], int] = {}  # (attempt's run id, node): its number
        self.lock = threading.Lock()  # one try at a time: the thread's or the end's
        self.done = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, attempt: Attempt) -> None:
        for node in attempt.lost:
            self.parts[(attempt.run_id, node)] = attempt.number
        if self.parts and self.thread is None:
            self.thread = threading.Thread(target=self._keep, daemon=True, name="fleet-left")
            self.thread.start()

    def _keep(self) -> None:
        while not self.done.wait(LEFT_POLL_S):
            self.sweep()

    def sweep(self) -> None:
        """One try at every part left: a node that answers has its part stopped, and says so."""
        with self.lock:
            for (run_id, node), number in list(self.parts.items()):
                if self.done.is_set() and self.thread is not None and \
                        threading.current_thread() is self.thread:
                    return  # the run's end tries once more itself
                try:
                    rec = state.load(run_id)
                    found = self.backend.stop_part(
                        rec, node, f"fleet up, once {node} answered again (attempt {number} "
                                   "had lost it)")
                except Exception:  # noqa: BLE001 - not reached yet: tried again, named at the end
                    continue
                del self.parts[(run_id, node)]
                seen = outcomes.ended(rec.dir).get(node)
                # "stopped" only where stop.sh found something of the part to stop.
                done = "was stopped" if found else "had already ended"
                self.console.info(f"{node} answered again: attempt {number}'s part there {done}"
                                  + (f" ({seen.describe()})" if seen else ""))

    def end(self) -> None:
        """At the run's end: one last try, then what could not be stopped is named."""
        self.done.set()
        if not self.parts:
            return
        self.sweep()
        for (_, node), number in sorted(self.parts.items(), key=lambda kv: kv[1]):
            self.console.info(f"{node} still does not answer: attempt {number}'s part there "
                              f"may still run; `fleet stop {self.run_id}` ends it once it "
                              "answers")

    def cancel(self) -> None:
        """The run ends at once (an interrupt): no more tries."""
        self.done.set()
