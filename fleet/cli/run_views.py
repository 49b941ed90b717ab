"""What `fleet logs` and `fleet status` do beyond their options: the logs of every attempt
and the run's end (a Verdict event with --json), and the status as one JSON object."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleet.console import Console, Meaning
from fleet.errors import Interrupted, UsageError
from fleet.states import RunStatus

if TYPE_CHECKING:
    from fleet.run.logs import View
    from fleet.run.record import RunRecord


def logs(console: Console, run_id: str | None, follow: bool, node: str | None,
          rank: int | None, attempt: int | None, merge: bool, tail: int | None,
          since: str | None) -> int:
    """`fleet logs`; with `follow`, the run's exit code at its end (0 without). With `follow`
    its header comes first, and an interruption says that the run goes on."""
    from fleet.lifecycle import attempts
    from fleet.run import logs as run_logs
    from fleet.run import record as state

    view = run_logs.View(merge, tail, None if since is None
                         else run_logs.parse_since(since, time.time()))
    run = state.load(run_id)
    if follow and console.sink is None:  # at once, from the record: before any host is asked
        console.info(header(run, attempts.records(run)))
    try:
        return _logs(console, run, follow, node, rank, attempt, view)
    except Interrupted as e:
        if not follow:
            raise
        raise StoppedFollowing(e.signame, run.run_id) from None


class StoppedFollowing(Interrupted):
    """Ctrl-C (or SIGTERM) on `fleet logs -f`: fleet stops following and says that the run goes
    on. An interruption like any other (exit 130): 0 would read as the run's success."""

    def __init__(self, signame: str, run_id: str) -> None:
        super().__init__(signame)
        self.args = (f"stopped following; run {run_id} goes on (`fleet stop {run_id}` stops "
                     "it)",)


def header(run: RunRecord, every: list[RunRecord]) -> str:
    """What `logs -f` says first, from the local record alone: the run, its state as fleet saw
    it end (or that no end is recorded yet), its nodes and its start."""
    from fleet.lifecycle import history

    done = history.finished(run, every)
    state = done.verdict.status.value if done else "no end recorded yet"
    nodes = ", ".join(n.host.name for n in every[-1].nodes)
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started))
    return (f"following run {run.run_id} ({state}) on {nodes}, started {started}; Ctrl-C stops "
            "following, not the run")


def _logs(console: Console, run: RunRecord, follow: bool, node: str | None, rank: int | None,
          attempt: int | None, view: View) -> int:
    from fleet import backends
    from fleet.events import Phase, Step, Verdict
    from fleet.lifecycle import attempts
    from fleet.run import logs as run_logs
    from fleet.run import outcomes
    from fleet.transport.forward import declared, recorded

    backends.for_record(run).take_healed(run)  # a detached run that healed by itself
    by_number = attempts.numbered(run)
    every = list(by_number.values())
    console.event(Phase(Step.FOLLOWING, every[0].run_id))
    if attempt is not None and attempt not in by_number:
        held = (f"{len(by_number)} attempt(s)" if max(by_number) == len(by_number) else
                f"attempts {', '.join(map(str, by_number))} on record")
        raise UsageError(f"run {every[0].run_id} has {held}, not {attempt}")
    chosen = every if attempt is None else [by_number[attempt]]
    number = {id(one): n for n, one in by_number.items()}
    found = attempts.load(every[0])
    total = found[0] + 1 if found else max(by_number)
    last = every[-1]
    # The job's `forward` ports of the master, while -f follows (a connection of their own).
    forwards = recorded(last.dir / "manifest.json") if follow else ()
    with declared(lambda: backends.for_record(last).tunnel(last, None), forwards, console,
                  owned=True):
        for one in chosen:
            if len(every) > 1:
                console.info(f"attempt {number[id(one)]}/{total}: run {one.run_id}")
            backends.for_record(one).logs(one, console, follow and one is every[-1], node,
                                          rank, view)
    if not follow:
        return 0
    final, lines = backends.for_record(every[-1]).describe(every[-1])
    said = run_logs.final_line(every[0].run_id, final, lines)
    if final.is_terminal:
        from fleet.lifecycle.answers import keep_seen

        keep_seen(every[0], last, "fleet logs -f", final)
    if console.sink is None:
        console.info(said, _MEANING.get(final, Meaning.WARN))
    else:
        seen = outcomes.seen(last.dir)
        console.event(Verdict(every[0].run_id, final, final.exit_code, tuple(
            seen[n.host.name].outcome for n in last.nodes if n.host.name in seen), said))
    return final.exit_code


_MEANING = {RunStatus.SUCCEEDED: Meaning.OK, RunStatus.FAILED: Meaning.FAIL,
            RunStatus.NEVER_STARTED: Meaning.FAIL}
