"""The one teardown of a run, whatever its backend: from the moment anything may run, every way
out (success, a failing node, a lost node, an exception, any number of signals) passes through
`Guard.__exit__`, which stops what may run, or removes what was prepared where nothing ever
started (torch's elastic agent does the same with `_shutdown()` in a `finally`)."""

from __future__ import annotations

from types import TracebackType

from fleet import phrases
from fleet.backends.base import Run
from fleet.console import Console
from fleet.errors import Interrupted
from fleet.events import Phase, Step
from fleet.lifecycle.signals import SignalGuard
from fleet.transport.group import reason


class Guard(SignalGuard):
    """Signals: the first one ends the run (it raises Interrupted where the main thread is);
    any later one is only counted, so that nothing can cut the teardown short."""

    def __init__(self, run: Run, console: Console) -> None:
        super().__init__()
        self.run, self.console = run, console
        self.ended = False  # every part of the job ended by itself: nothing left to stop
        self.released = False  # detached on purpose: the run goes on without fleet
        self.hang: str | None = None  # the watchdog's verdict, where it stopped the run

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.hold()
        try:
            # Detached: the run goes on without fleet, whatever fails in confirming its start;
            # only the person's own Ctrl-C while fleet still waits for it stops it.
            if self.released and not isinstance(exc, Interrupted):
                if exc is not None:
                    rid = self.run.run_id
                    self.console.info(f"run {rid} was started and goes on without fleet: "
                                      f"`fleet status {rid}`, `fleet stop {rid}`")
                return
            if self.ended:
                if isinstance(exc, Interrupted):
                    raise Interrupted(exc.signame, "the run had already ended") from None
                return
            self.console.event(Phase(Step.STOPPING, self.run.run_id))
            if self.run.started():
                words = phrases.stopped(self.run.stopped(self.run.stop(why(exc))))
            else:  # no run ever existed: what was prepared for it goes
                words = phrases.forgotten(self.run.forget())
            if isinstance(exc, Interrupted):
                raise Interrupted(exc.signame, words) from None
            self.console.info(words)
        finally:
            self.release_signals()


def why(exc: BaseException | None) -> str:
    """Who stops the run, as its stop records say."""
    if isinstance(exc, Interrupted):
        return f"fleet up, interrupted ({exc.signame})"
    if exc is None:
        return "fleet up, which ended before the run"
    return f"fleet up, after an error: {reason(exc) if isinstance(exc, Exception) else exc}"
