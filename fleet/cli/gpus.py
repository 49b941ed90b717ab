"""`fleet gpus`: who uses which GPU, on every host (the leases' commands are in
fleet.cli.leases). fleet.cli adds them to the app after the commands around a run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleet.cli.app import ExcludeOpt, InvOpt, NodeOpt, job_given, selection
from fleet.errors import ExitCode, Interrupted, UsageError

if TYPE_CHECKING:  # what a command loads when it runs (the start loads none of it)
    from fleet.backends import GpuSurvey
    from fleet.console import Console
    from fleet.facts.gpus import GpuFacts


def _inventory(path: Path | None, inventory: Path | None) -> Path:
    if path is not None:
        from fleet.trust import inventory_for
        return inventory_for(path, inventory)
    if inventory is not None:
        return inventory
    raise UsageError("name the hosts: a job or inventory file (fleet gpus inventory/lab.toml), "
                     "or -i INVENTORY")


Where = Annotated[Path | None, typer.Argument(
    metavar="[JOB|INVENTORY]", callback=job_given,
    help="A job file (its inventory's hosts) or an inventory file; or give -i.")]


def gpus(path: Where = None, inventory: InvOpt = None, node: NodeOpt = None,
         exclude: ExcludeOpt = None,
         watch: Annotated[bool, typer.Option(
             "--watch", "-w", help="Refresh in place until Ctrl-C (off a terminal: a new table, "
                                   "or JSON line with --json, each time).")] = False,
         every: Annotated[float, typer.Option(
             "--every", metavar="SECONDS", min=1.0, help="How often --watch looks.")] = 5.0,
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")
                            ] = False) -> None:
    """Show every host's GPUs: memory, use, whose processes, leases.

    One command per host, all at once; a process's fleet run is named where this login may see
    it (its own, or any as root). A process running for an hour or more that holds memory on a
    GPU at 0% at this look is flagged "idle?". Exit code 3 when a host could not be asked."""
    from fleet import backends, waits
    from fleet.console import Console

    inv = _inventory(path, inventory)
    backend = backends.for_inventory(inv)
    console = Console()
    survey = backend.survey(inv, selection(node, exclude))
    watched: dict[str, float] = {}
    try:
        if not watch:
            with waits.shown_by(console.hosts_waiting):
                results = survey.look()
            _show(console, results, as_json, watched)
        else:
            results = _watch(console, survey, as_json, every, watched)
    finally:
        survey.close()
    if any(isinstance(r, str) for r in results.values()):
        raise typer.Exit(ExitCode.UNREACHABLE)


def _show(console: Console, results: dict[str, GpuFacts | str], as_json: bool,
          watched: dict[str, float]) -> None:
    from fleet.gpuview import HEADERS, rows
    from fleet.gpuview import as_json as gpus_json

    now = time.time()
    if as_json:
        print(json.dumps(gpus_json(results, now)), flush=True)
        return
    table, meanings = rows(results, now, watched)
    console.emit(console.table(HEADERS, table, meanings))


def _watch(console: Console, survey: GpuSurvey, as_json: bool, every: float,
           watched: dict[str, float]) -> dict[str, GpuFacts | str]:
    """Look every `every` seconds until Ctrl-C (which ends it with exit code 0): on a terminal
    the table is redrawn in place."""
    from rich.live import Live
    from rich.text import Text

    from fleet.console import interactive
    from fleet.gpuview import HEADERS, rows

    live = None if as_json or not interactive(sys.stdout) else Live(
        Text(""), auto_refresh=False, transient=False, redirect_stdout=False)
    results: dict[str, GpuFacts | str] = {}
    try:
        if live is not None:
            live.start()
        while True:
            results = survey.look()
            _seen_idle(results, watched, time.time())
            if live is not None:
                table, meanings = rows(results, time.time(), watched)
                stamp = time.strftime("%H:%M:%S")
                live.update(Text.from_ansi(f"{stamp}  every {every:g}s, Ctrl-C ends\n" +
                                           console.table(HEADERS, table, meanings)), refresh=True)
            else:
                _show(console, results, as_json, watched)
                if not as_json:
                    print(flush=True)
            time.sleep(every)
    except Interrupted:
        return results
    finally:
        if live is not None:
            live.stop()


def _seen_idle(results: dict[str, GpuFacts | str], watched: dict[str, float],
               now: float) -> None:
    """Since when --watch has seen each GPU hold memory at 0%, without a busy look between."""
    for host, f in results.items():
        if isinstance(f, str):
            continue
        for g in f.gpus:
            key = f"{host}/{g.index}"
            if g.util == 0 and f.on(g.index):
                watched.setdefault(key, now)
            else:
                watched.pop(key, None)
