"""The monitor of a running job, the same for every backend: it follows the backend's events,
fails fast (the first node that fails or is lost stops every other one), and keeps the hang
watchdog (no line from any node for hang_timeout: every rank's stack, then a stop)."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Generator
from dataclasses import dataclass

from fleet import phrases
from fleet.backends.base import Event, NodeEnded, Quiet, Run
from fleet.console import Console
from fleet.errors import JobFailed
from fleet.lifecycle.guard import Guard
from fleet.run import hang, outcomes
from fleet.states import NodeOutcome, NodeStatus, RunStatus, StopCause, overall


@dataclass(frozen=True)
class RunState:
    """Where a running job stands after an event: each node's outcome so far, whether a stop
    of every node is under way, and the watchdog's verdict where it stopped the run. A policy
    (a restart, say) decides on it in one place."""

    outcomes: dict[str, NodeOutcome]
    stopping: bool
    hang: str | None
    first: str | None = None  # the node whose end set off the fail-fast
    stopped_at: float | None = None  # when fleet began to stop the run (time.time())

    @property
    def status(self) -> RunStatus:
        return overall(o.status for o in self.outcomes.values())


def watch(run: Run, guard: Guard, console: Console) -> Generator[RunState, None, None]:
    """The run's state after each of its events, until every part of the job has ended."""
    m = Monitor(run, guard, console)
    with contextlib.closing(run.events()) as events:  # closed on any way out: its threads end
        for event in events:
            m.on(event)
            yield RunState(dict(m.outcomes), m.stopping, guard.hang, m.first, m.stopped_at)


def monitor(run: Run, guard: Guard, console: Console) -> RunState:
    """Until every part of the job has ended: the run's last state (each node's outcome, the
    last word for each)."""
    last = collections.deque(watch(run, guard, console), maxlen=1)
    return last[0] if last else RunState({}, False, guard.hang)


class Monitor:
    """What the events so far mean: the outcomes, and whether a stop is under way."""

    def __init__(self, run: Run, guard: Guard, console: Console) -> None:
        self.run, self.guard, self.console = run, guard, console
        self.outcomes: dict[str, NodeOutcome] = {}
        self.stopping = False
        self.first: str | None = None
        self.stopped_at: float | None = None

    def ended(self) -> set[str]:
        return {n for n, o in self.outcomes.items() if o.status.is_terminal}

    def on(self, event: Event) -> None:
        if isinstance(event, Quiet):
            limit = self.run.job.watchdog.hang_timeout
            if limit and not self.stopping and event.silent > limit:
                self.stopping, self.stopped_at = True, time.time()
                self.guard.hang = on_hang(self.run, self.console, event.silent, self.ended())
            return
        assert isinstance(event, NodeEnded)
        # History from here: `fleet status` takes it from the record, whatever the node says
        # later (an end seen already stands).
        o = outcomes.note(self.run.record_dir, event.outcome, "fleet up")
        self.outcomes[o.name] = o
        self.console.event(NodeEnded(o))
        if o.status is NodeStatus.SUCCEEDED or self.stopping:
            return
        self.stopping, self.first, self.stopped_at = True, o.name, time.time()
        if o.status is NodeStatus.STOPPED:
            by = o.detail or "a stop"
            self.console.info(f"{o.name} (node rank {o.node_rank}) was stopped by {by}; "
                              "stopping the job on every other node")
        else:
            by = StopCause.FAIL_FAST.says(f"{o.name} {o.status.value}")
            self.console.info(f"{o.name} (node rank {o.node_rank}) {o.describe()}; stopping "
                              "the job on every other node")
        # Every node not known to have ended, the unreachable ones too.
        self.run.stop(by, skip=self.ended())


def on_hang(run: Run, console: Console, silent: float, skip: set[str]) -> str:
    """No node printed for hang_timeout: take every rank's stack, say which rank is different
    (or, before any rank started, which node has not joined), keep it, stop the run; returns
    the verdict."""
    limit = run.job.watchdog.hang_timeout
    console.event(Quiet(silent))
    console.info(f"hang: no node has printed anything for {silent:.0f}s (hang_timeout = "
                 f"{limit:g}s); taking every rank's stack")
    with console.waiting("taking every rank's stack"):
        lines, problems = run.stacks(True, skip)
    for line in lines + problems:
        console.info(f"  {line}")
    saved = hang.save(run.record_dir, f"hang of run {run.run_id}: no output for "
                      f"{silent:.0f}s", lines + problems)
    left = run.stop(StopCause.WATCHDOG.says(f"no output for {limit:g}s (a hang)"), skip=skip)
    verdict = f"{lines[0] if lines else 'no stack could be taken'} (stacks kept in {saved})"
    if left:  # not stopped: the guard's teardown tries again, and fleet ends
        raise JobFailed(f"run {run.run_id} hung: {verdict}; {phrases.halted(run.halted())}")
    return verdict
