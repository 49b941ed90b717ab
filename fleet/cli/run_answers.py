"""What `status` and `rm --forget` print about a recorded run (the answers themselves are
fleet.lifecycle.answers: a finished run from its record alone, never asked again; a live one
asked of its nodes, all at once within a few seconds)."""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from fleet import waits
from fleet.cli.app import echo
from fleet.console import Console

if TYPE_CHECKING:
    from fleet.run.record import RunRecord


def status(run_id: str | None, as_json: bool) -> int:
    """`fleet status`: prints the run; its exit code."""
    from fleet.run import record as state

    rec = state.load(run_id)  # a run not recorded is said before the backends are loaded
    from fleet.lifecycle import answers, attempts, history
    from fleet.run import watched

    with waits.shown_by(Console(live=False if as_json else None).hosts_waiting):
        seen = answers.look(rec)
    every, found, done, final = seen.every, seen.found, seen.done, seen.final
    if as_json:
        import json

        print(json.dumps(answers.status_object(seen), ensure_ascii=False))
        return final.exit_code
    if found:
        echo(f"run {rec.run_id}: {final.value}, {attempts.headline(*found, len(every))}")
        echo("\n".join(attempts.lines(*found)))
    if done is None and found:
        run_ids = {a.number: a.run_id for a in found[1]}
        for number, rows in answers.not_over(every, found[1]):
            echo(f"  attempt {number}/{found[0] + 1} ({run_ids[number]}) is not over "
                 f"where fleet could not stop it (`fleet stop {rec.run_id}` once it answers):")
            echo("\n".join(f"  {row}" for row in rows))
    echo("\n".join(seen.lines + (history.lost_lines(rec.run_id, done) if done else [])))
    numbers = {r.run_id: i + 1 for i, r in enumerate(every)} if len(every) > 1 else {}
    for one in seen.named:
        echo(f"  {one.words(numbers.get(one.run_id))}")
    for problem in seen.unread:
        echo(f"  straggler: {problem}")
    if watcher := watched.watched_by(every[-1], final):
        echo(watcher)
    return final.exit_code


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
