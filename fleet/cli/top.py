"""`fleet top`: every rank of a run, live: its state, CPU, memory, GPU, the pace of its node's
log, where it spends its time (sampled on the node by the rank itself), and the straggler, the
rank the others wait for (fleet.run.straggler)."""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Annotated

import typer

from fleet.cli.app import RunArg, echo
from fleet.errors import ExitCode, Interrupted, UsageError

if TYPE_CHECKING:
    from fleet.backends import RankLooks
    from fleet.cli.topview import Top
    from fleet.console import Console
    from fleet.run.record import RunRecord

LIVE_MAX_S = 7 * 24 * 3600.0  # a live view ends by itself after this long


def top(run_id: RunArg = None,
        once: Annotated[bool, typer.Option(
            "--once", help="One look, then a verdict line (`straggler: ...`), and end.")
                        ] = False,
        as_json: Annotated[bool, typer.Option(
            "--json", help="One look as one JSON object (implies --once; docs/EVENTS.md).")
                           ] = False,
        interval: Annotated[float, typer.Option(
            "--interval", min=0.5, max=3600, help="Seconds between looks.")] = 2.0,
        factor: Annotated[float, typer.Option(
            "--factor", min=1.01, max=100,
            help="How much longer than the others a rank computes per step to be named.")
                          ] = 1.3) -> None:
    """Show every rank of a run, live, and name the straggler.

    Per rank: its node's state, CPU and memory, its GPU where nvidia-smi is there, the pace
    of its node's log, where it spends its time (`all_reduce() 38%`, sampled by the rank
    itself, with no change to the job), its share of time waiting in collectives, and its
    score: how much longer it computes per step than the others. A rank with a score of at
    least --factor is named: the others wait for it. Nothing is fetched but a few numbers a
    node; whole logs stay where they are. On a terminal it is redrawn in place (Ctrl-C ends
    it); piped, a table is printed per look. Exit 0, or 3 when a node could not be
    asked."""
    from fleet import backends
    from fleet.console import Console, interactive
    from fleet.lifecycle import attempts
    from fleet.run import record as state

    rec = state.load(run_id)
    every = attempts.records(rec)
    last = every[-1]
    if _ended(rec, every, as_json):
        return
    console = Console(live=False if as_json else None)
    view = backends.for_record(last).top(last)
    live = not (once or as_json) and interactive(console.out)
    try:
        began = time.monotonic()
        first = True
        while True:
            shown = _look(view, last, console, factor, as_json, live, first, not once)
            first = False
            if once or as_json or shown.status.is_terminal:
                if shown.unasked:
                    raise typer.Exit(ExitCode.UNREACHABLE)
                return
            if time.monotonic() - began > LIVE_MAX_S:
                raise UsageError("fleet top ran for a week: start it again")
            time.sleep(interval)
    except Interrupted:
        if not live:  # a live view is ended so, as top is: nothing else is said
            raise
    finally:
        view.close()


def _ended(rec: RunRecord, every: list[RunRecord], as_json: bool) -> bool:
    """A run whose end fleet saw is said from its record (history: its hosts may be gone, and
    nothing of it runs to look at); False where it must be asked."""
    from fleet.events import SCHEMA
    from fleet.lifecycle import history
    from fleet.run import straggler_record

    done = history.finished(rec, every)
    if done is None or done.open:
        return False
    word = done.verdict.status.value
    named, _ = straggler_record.of_run([r.dir for r in every])  # what fleet up's watch saw
    last = named[-1] if named else None
    said = (last.words() if last is not None else "straggler: none") + " (the run has ended)"
    if as_json:
        print(json.dumps({
            "v": SCHEMA, "run_id": rec.run_id, "status": word,
            "nodes": [{"host": n.host.name, "node_rank": n.node_rank,
                       "status": o.status.value if o else None, "log": None, "gpus": None,
                       "error": None} for n, o in done.nodes],
            "ranks": [], "verdict": said,
            "straggler": straggler_record.as_json(last) if last is not None else None},
            ensure_ascii=False))
    else:
        echo(f"run {rec.run_id}: {word}; it has ended: nothing of it runs to look at "
             f"(`fleet status {rec.run_id}` says how it ended)")
        if last is not None:
            echo(said)
    return True


def _look(view: RankLooks, rec: RunRecord, console: Console, factor: float, as_json: bool,
          live: bool, first: bool, again: bool) -> Top:
    from fleet import waits
    from fleet.cli import topview
    from fleet.console import Meaning
    from fleet.run import straggler

    # The first look's wait is drawn; a live view's later ones would only flicker below it.
    with waits.shown_by(console.hosts_waiting) if first else contextlib.nullcontext():
        states, seen = view.look(with_gpus=True)
    shown = topview.make(rec.run_id, states, seen,
                         {n.host.name: n.node_rank for n in rec.nodes}, factor,
                         straggler.spans(rec.nodes))
    if as_json:
        print(json.dumps(topview.as_json(shown), ensure_ascii=False))
        return shown
    drawn = topview.rows(shown)
    table = console.table(topview.HEADERS, [r for r, _ in drawn],
                          [Meaning.WARN if named else None for _, named in drawn])
    head = (f"run {rec.run_id}: {shown.status.value}, {len(rec.nodes)} node(s), "
            f"{time.strftime('%H:%M:%S')}")
    verdict = shown.standing.verdict()
    text = "\n".join([head, table, console.paint(
        verdict, Meaning.WARN if shown.standing.straggler else Meaning.PLAIN, err=False)])
    if live:
        console.emit("\033[H\033[2J" + text)  # the screen cleared: redrawn in place
    else:
        console.emit(text + ("\n" if again else ""))  # a blank line between looks
    return shown
