"""The monitor of a running job, the same for every backend: it follows the backend's events,
fails fast (the first node that fails or is lost stops every other one), keeps the hang
watchdog (no line from any node for hang_timeout: every rank's stack, then a stop) and, with
`[watchdog] straggler`, says each rank the straggler watch names (and with straggler_action =
"replace" stops the attempt for a spare to take its host's place)."""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Generator
from dataclasses import dataclass

from fleet import events, phrases
from fleet.backends.base import Event, NodeEnded, Quiet, Run
from fleet.config.watchdog import StragglerAction
from fleet.console import Console, Meaning
from fleet.errors import JobFailed
from fleet.lifecycle.guard import Guard
from fleet.lifecycle.straggler_watch import SpareFor, StragglerWatch
from fleet.run import hang, outcomes, straggler_record
from fleet.run.straggler import Straggler
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
    stragglers: tuple[Straggler, ...] = ()  # the ranks the straggler watch named, in order
    replacing: Straggler | None = None  # stopped for a spare to take this one's host's place

    @property
    def status(self) -> RunStatus:
        return overall(o.status for o in self.outcomes.values())


def watch(run: Run, guard: Guard, console: Console, spare: SpareFor | None = None
          ) -> Generator[RunState, None, None]:
    """The run's state after each of its events, until every part of the job has ended.
    `spare` says which spare would take a straggler's host's place (with [restart])."""
    m = Monitor(run, guard, console, spare)
    try:
        with contextlib.closing(run.events()) as stream:  # closed on any way out: its threads end
            for event in stream:
                m.on(event)
                yield m.state()
    finally:
        m.close()


def monitor(run: Run, guard: Guard, console: Console, spare: SpareFor | None = None
            ) -> RunState:
    """Until every part of the job has ended: the run's last state (each node's outcome, the
    last word for each)."""
    last = collections.deque(watch(run, guard, console, spare), maxlen=1)
    return last[0] if last else RunState({}, False, guard.hang)


class Monitor:
    """What the events so far mean: the outcomes, and whether a stop is under way."""

    def __init__(self, run: Run, guard: Guard, console: Console,
                 spare: SpareFor | None = None) -> None:
        self.run, self.guard, self.console, self.spare = run, guard, console, spare
        self.outcomes: dict[str, NodeOutcome] = {}
        self.stopping = False
        self.first: str | None = None
        self.stopped_at: float | None = None
        self.stragglers: list[Straggler] = []
        self.replacing: Straggler | None = None
        factor = run.job.watchdog.straggler
        self.lookout = StragglerWatch(run, factor).start() if factor else None

    def state(self) -> RunState:
        return RunState(dict(self.outcomes), self.stopping, self.guard.hang, self.first,
                        self.stopped_at, tuple(self.stragglers), self.replacing)

    def ended(self) -> set[str]:
        return {n for n, o in self.outcomes.items() if o.status.is_terminal}

    def close(self) -> None:
        if self.lookout is not None:
            self.lookout.close()

    def on(self, event: Event) -> None:
        for s in self.lookout.named() if self.lookout is not None else []:
            if not self.stopping:  # a rank named as the run ends is no news
                self.named(s)
        if self.lookout is not None and not self.stopping and (blind := self.lookout.blind()):
            self.console.info(f"warning: {blind}", Meaning.WARN)
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

    def named(self, s: Straggler) -> None:
        """The straggler watch named a rank: said once (a warning on a terminal), kept in the
        attempt's record; with straggler_action = "replace", its host gives way to a spare."""
        self.stragglers.append(s)
        said = events.Straggler(s.rank, s.host, s.score, s.others_wait, s.place, s.line)
        self.console.event(said)
        why = straggler_record.keep(self.run.record_dir, said, self.run.run_id)
        if why is not None:
            self.console.info(f"warning: straggler: not kept in the run's record: {why}",
                              Meaning.WARN)
        if self.run.job.watchdog.straggler_action is StragglerAction.REPLACE:
            self.replace(s)

    def replace(self, s: Straggler) -> None:
        spare, why = self.spare(s.host) if self.spare is not None else \
            (None, "no attempt follows this one")
        if spare is None:
            self.console.info(f'straggler: {s.host} is not replaced ({why}; straggler_action = '
                              '"replace"): the run goes on', Meaning.WARN)
            return
        self.console.info(f"straggler: stopping this attempt; {s.host} gives way to spare "
                          f"{spare} in the next one")
        self.stopping, self.stopped_at, self.replacing = True, time.time(), s
        self.run.stop(StopCause.STRAGGLER.says(f"rank {s.rank} ({s.host}) is the straggler"),
                      skip=self.ended())


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
