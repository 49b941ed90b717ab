"""What `status`, `ps`, `stop` and `rm --forget` answer about a recorded run: a finished run
(its verdict kept) from its record alone, never asked again; a live one asked of its nodes, all
at once within a few seconds (fleet.lifecycle.history)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from fleet import waits
from fleet.cli.app import echo
from fleet.console import Console
from fleet.errors import FleetError
from fleet.states import RunStatus

if TYPE_CHECKING:
    from fleet.backends import Seen
    from fleet.lifecycle.attempts import Attempt
    from fleet.run.record import RunRecord


def status(run_id: str | None, as_json: bool) -> int:
    """`fleet status`: prints the run; its exit code."""
    from fleet.run import record as state

    rec = state.load(run_id)  # a run not recorded is said before the backends are loaded
    from fleet import backends
    from fleet.cli import run_views
    from fleet.lifecycle import attempts, history
    from fleet.run import straggler_record, watched

    with waits.shown_by(Console(live=False if as_json else None).hosts_waiting):
        backends.for_record(rec).take_healed(rec)  # a detached run that healed by itself
        found = attempts.load(rec)
        every = attempts.records(rec)
        done = history.finished(rec, every)
        if done is not None:
            final, lines = done.verdict.status, history.status_lines(every[-1], done)
        else:
            final, lines = backends.for_record(every[-1]).describe(every[-1])
            if final.is_terminal:  # seen to end now (a detached run): not asked again
                keep_seen(rec, every[-1], "fleet status", final)
    named, unread = straggler_record.of_run([r.dir for r in every])
    if as_json:
        run_views.status_json(rec, every[-1], final, lines, done, named[-1] if named else None)
        return final.exit_code
    if found:
        echo(f"run {rec.run_id}: {final.value}, {attempts.headline(*found, len(every))}")
        echo("\n".join(attempts.lines(*found)))
    if done is None and found:
        run_ids = {a.number: a.run_id for a in found[1]}
        for number, rows in not_over(every, found[1]):
            echo(f"  attempt {number}/{found[0] + 1} ({run_ids[number]}) is not over "
                 f"where fleet could not stop it (`fleet stop {rec.run_id}` once it answers):")
            echo("\n".join(f"  {row}" for row in rows))
    echo("\n".join(lines + (history.lost_lines(rec.run_id, done) if done else [])))
    numbers = {r.run_id: i + 1 for i, r in enumerate(every)} if len(every) > 1 else {}
    for one in named:
        echo(f"  {one.words(numbers.get(one.run_id))}")
    for problem in unread:
        echo(f"  straggler: {problem}")
    if watcher := watched.watched_by(every[-1], final):
        echo(watcher)
    return final.exit_code


def ps_word(rec: RunRecord) -> str:
    """A run's state in `ps`: from its record where it is finished, else asked."""
    from fleet import backends
    from fleet.lifecycle import attempts, history
    from fleet.transport.group import reason

    try:
        backends.for_record(rec).take_healed(rec)  # a detached run that healed by itself
        found = attempts.load(rec)
        every = attempts.records(rec)
        done = history.finished(rec, every)
        if done is not None:
            said, left = done.verdict.status.value, history.ps_tail(done)
        else:
            said = words(backends.for_record(every[-1]).state(every[-1]))
            left = "".join(f"; attempt {number} may still run on "
                           f"{', '.join(row.split()[0] for row in rows)}"
                           for number, rows in not_over(every, found[1] if found else []))
        if not found:
            return said + left
        return f"{said} ({attempts.headline(*found, len(every))}){left}"
    except FleetError as e:
        return words(backends.Seen(RunStatus.UNKNOWN, why=reason(e)))


def words(seen: Seen) -> str:
    """A run's state in `ps`: `running`, `unknown (node2: timed out)`, `running (slurm)`."""
    return seen.status.value + "".join(f" ({w})" for w in (seen.why, seen.by) if w)


def not_over(every: list[RunRecord], items: list[Attempt]) -> list[tuple[int, list[str]]]:
    """Of a run not known to be over: earlier attempts that lost a node (their record says
    which) whose end fleet has not seen since (its stop keeps that end), where that node does
    not say it ended either: each one's number and its rows for those nodes. Only those nodes
    are asked, bounded in time."""
    from fleet import backends
    from fleet.run import outcomes

    records = {rec.run_id: rec for rec in every[:-1]}
    found = []
    for a in items:
        rec = records.get(a.run_id)
        if rec is None or not a.lost:
            continue
        open_ = set(a.lost) - set(outcomes.ended(rec.dir))
        if open_:
            rows = backends.for_record(rec).parts_left(rec, open_)
            if rows:
                found.append((a.number, rows))
    return found


def keep_seen(run: RunRecord, last: RunRecord, by: str, final: RunStatus | None = None) -> None:
    """After `stop`, `logs -f` or `status` saw the run end (`final`, else asked of the record
    and the nodes): its verdict kept, where no `fleet up` still watches it (that one keeps its
    own, and may yet start another attempt)."""
    from fleet import backends
    from fleet.lifecycle import attempts, history
    from fleet.run.record import controller_alive

    if controller_alive(run.controller) is True:
        return
    # The nodes' watchers may have healed the run since `last` was read: its end is then no
    # end of the run (attempt 2 goes on), and nothing is kept.
    backends.for_record(run).take_healed(run)
    if attempts.records(run)[-1].run_id != last.run_id:
        return
    if final is None:
        final, _ = backends.for_record(last).describe(last)
    history.keep(run.run_id, final, final.exit_code, by, f"run {run.run_id} {final.value}")


def forget(run: RunRecord, every: list[RunRecord], console: Console) -> None:
    """`rm --forget`: the run's local record goes, the nodes are not asked; what may be left
    where is said."""
    for one in every:
        for n in one.nodes:
            who = f"{n.host.user}@{n.host.address}" if n.host.user else n.host.address
            console.info(f"{n.host.name} ({who}): {n.run_dir} may be left"
                         + (f" (attempt {every.index(one) + 1})" if len(every) > 1 else ""))
        if not one.nodes:
            console.info(f"{one.run_id}: where it ran is not in its record (`fleet show` "
                         "said it, before this)")
    for one in reversed(every):  # the first attempt's record, the run's own, goes last
        shutil.rmtree(one.dir, ignore_errors=True)
    console.info(f"run {run.run_id} forgotten: its local record is removed; nothing was asked "
                 "of its hosts, so what is named above may be left there (and may still run, "
                 "if its end was never seen)")
