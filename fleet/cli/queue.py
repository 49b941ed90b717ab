"""`fleet submit`, `fleet sweep` and `fleet queue`: runs queued on the inventory's hosts, placed
on free GPUs by a runner on one of them, going on with this machine gone (fleet.backends'
queue; the records in fleet.run.sweeps). fleet.cli adds them to the app."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleet.cli.app import ExcludeOpt, ExtraArgs, InvOpt, JobArg, NodeOpt, echo, selected
from fleet.errors import ExitCode, Interrupted, UsageError

if TYPE_CHECKING:
    from fleet.backends import Queue
    from fleet.config.job import Job
    from fleet.console import Console
    from fleet.run.sweeps import SweepRecord

FOLLOW_EVERY_S = 2.0
PriorityOpt = Annotated[int, typer.Option(
    "--priority", min=-1000, max=1000,
    help="Higher runs first (default 0); a run of lower priority never takes what a waiting "
         "run of higher priority could use.")]
DetachOpt = Annotated[bool, typer.Option(
    "--detach", "-d", help="Return once queued: the queue goes on without this machine.")]


def _queue(inventory: Path) -> Queue:
    from fleet import backends

    return backends.for_inventory(inventory).queue(inventory)


def _head(job: Job) -> str:
    from fleet.config.select import load_selected

    return load_selected(job.inventory, job.selection).hosts[0].name


def submit(job_path: JobArg, extra: ExtraArgs = None, inventory: InvOpt = None,
           node: NodeOpt = None, exclude: ExcludeOpt = None, priority: PriorityOpt = 0,
           expect: Annotated[str | None, typer.Option(
               "--expect", metavar="DURATION",
               help="How long it should take (40m): the queue starts longer runs first.")
           ] = None) -> None:
    """Queue one run of the job; it starts on free GPUs without you."""
    from fleet.config.job import load_job, with_extra_args
    from fleet.console import Console
    from fleet.lifecycle import sweep

    job = selected(with_extra_args(load_job(job_path, inventory), extra or []), node, exclude)
    rec, runs = sweep.new_sweep(job, job.inventory, _head(job), "submit",
                                [({}, job, priority, sweep.expected(expect, {}))])
    _submitted(rec, runs, Console())
    echo(f"queued {runs[0].run_id}: `fleet queue` shows where it stands, `fleet sweep status "
         f"{rec.sweep_id}` how it went")


def sweep(what: Annotated[list[str], typer.Argument(
              metavar="JOB | status [SWEEP] | stop SWEEP",
              help="A job file to sweep, or `status` (default: the latest sweep) or `stop`.")],
          grid: Annotated[list[str] | None, typer.Option(
              "--grid", metavar="NAME=V1,V2",
              help="A parameter and its values (repeat: every combination runs once).")] = None,
          how: Annotated[str, typer.Option(
              "--as", metavar="args|env",
              help="Give the values as `--NAME VALUE` arguments (default) or as environment "
                   "variables NAME=VALUE.")] = "args",
          inventory: InvOpt = None, node: NodeOpt = None, exclude: ExcludeOpt = None,
          priority: PriorityOpt = 0, detach: DetachOpt = False,
          expect: Annotated[str | None, typer.Option(
              "--expect", metavar="DURATION",
              help="Each run's expected time, may use the grid's names ({epochs}m): the queue "
                   "starts longer runs first.")] = None,
          as_json: Annotated[bool, typer.Option("--json", help="status: as JSON.")] = False,
          ) -> None:
    """Queue a grid's every combination; or see or stop a sweep."""
    from fleet.console import Console

    if what[0] in ("status", "stop"):
        if len(what) > 2 or (what[0] == "stop" and len(what) != 2):
            raise UsageError(f"fleet sweep {what[0]} {'SWEEP' if what[0] == 'stop' else '[SWEEP]'}")
        if what[0] == "status":
            return _status(what[1] if len(what) > 1 else None, as_json)
        return _stop(what[1], Console())
    if len(what) != 1:
        raise UsageError("fleet sweep JOB --grid NAME=V1,V2 ... (one job file)")
    if how not in ("args", "env"):
        raise UsageError(f"--as {how!r}: args or env")
    from fleet.config.job import load_job
    from fleet.lifecycle import sweep as sweeps_

    job = selected(load_job(Path(what[0]), inventory), node, exclude)
    combos = sweeps_.combos(sweeps_.parse_grid(grid or []))
    runs = [(p, sweeps_.with_params(job, p, how), priority, sweeps_.expected(expect, p))
            for p in combos]
    console = Console()
    rec, queued = sweeps_.new_sweep(job, job.inventory, _head(job), "sweep", runs)
    _submitted(rec, queued, console)
    if detach:
        echo(f"sweep {rec.sweep_id}: {len(queued)} runs queued; `fleet sweep status` shows them")
        return None
    return _follow(rec, console)


def _submitted(rec: SweepRecord, runs: list, console: Console) -> None:  # type: ignore[type-arg]
    from fleet import waits
    from fleet.run import sweeps

    sweeps.save(rec)  # before any host: what was asked is history even if queueing fails
    with waits.shown_by(console.hosts_waiting):
        sweeps.save(_queue(Path(rec.inventory)).submit(rec, runs, console))


def _follow(rec: SweepRecord, console: Console) -> None:
    """Until every run ended: each start and end said as it is seen; Ctrl-C stops the sweep."""
    from fleet.lifecycle import sweep as sweeps_
    from fleet.lifecycle.sweepview import line

    q = _queue(Path(rec.inventory))
    said: dict[str, str] = {}
    try:
        while True:
            rec = sweeps_.seen(rec, q.look())
            for r in rec.runs:
                if said.get(r.run_id) != r.state:
                    said[r.run_id] = r.state
                    echo(line(r))
            if sweeps_.done(rec):
                break
            time.sleep(FOLLOW_EVERY_S)
    except (KeyboardInterrupt, Interrupted):
        echo(f"stopping sweep {rec.sweep_id} (--detach leaves a sweep going)", err=True)
        _stop(rec.sweep_id, console)
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if any(r.state != "succeeded" for r in rec.runs):
        raise typer.Exit(ExitCode.FAILED)
    return None


def _status(sweep_id: str | None, as_json: bool) -> None:
    from fleet.lifecycle import sweep as sweeps_
    from fleet.lifecycle.sweepview import as_dict, table
    from fleet.run import sweeps

    rec = sweeps.load(sweep_id)
    note = ""
    if not sweeps_.done(rec):
        try:
            rec = sweeps_.seen(rec, _queue(Path(rec.inventory)).look())
        except Exception as e:  # noqa: BLE001 - the record is still shown, with why it is old
            note = f"(the queue could not be asked: {e}; shown as last seen)"
    if as_json:
        print(json.dumps(as_dict(rec)), flush=True)
    else:
        for row in table(rec):
            echo(row)
    if note:
        echo(note, err=True)


def _stop(sweep_id: str, console: Console) -> None:
    from fleet.lifecycle import sweep as sweeps_
    from fleet.run import sweeps

    rec = sweeps.load(sweep_id)
    look = _queue(Path(rec.inventory)).cancel([rec.sweep_id], console)
    rec = sweeps_.seen(rec, look)
    left = [r.run_id for r in rec.runs if not r.ended_state]
    echo(f"sweep {rec.sweep_id}: stopped" + (f"; not ended yet: {', '.join(left)}" if left
                                             else ""))
    if left:
        raise typer.Exit(ExitCode.FAILED)


def queue(inventory: Annotated[Path | None, typer.Option(
              "--inventory", "-i", metavar="INVENTORY",
              help="The inventory whose queue to show; default: the latest sweep's.")] = None,
          as_json: Annotated[bool, typer.Option("--json", help="As JSON.")] = False) -> None:
    """List the queued and running runs, and what each one waits for."""
    from fleet.lifecycle.sweepview import queue_rows
    from fleet.run import sweeps

    if inventory is None:
        inventory = Path(sweeps.load().inventory)
    look = _queue(inventory).look()
    if as_json:
        print(json.dumps({"alive": look.alive, "runs": {
            k: {"state": r.state, "host": r.host, "gpus": list(r.gpu_ids), "why": r.why,
                "attempt": r.attempt} for k, r in look.runs.items()
            if r.state in ("queued", "running")}}), flush=True)
        return
    for row in queue_rows(look):
        echo(row)
    sys.stdout.flush()
