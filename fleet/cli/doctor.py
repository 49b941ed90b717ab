"""`fleet doctor`: the hosts and the links between them measured side by side, and the one
that is well below its peers named (fleet.doctor)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from fleet.cli.app import ExcludeOpt, InvOpt, NodeOpt, echo, job_given, selection
from fleet.errors import ExitCode, UsageError

Where = Annotated[Path | None, typer.Argument(
    metavar="JOB|INVENTORY", callback=job_given,
    help="A job file (its inventory's hosts) or an inventory file; or give -i.")]


def _inventory(path: Path | None, inventory: Path | None) -> Path:
    if path is not None:
        from fleet.trust import inventory_for
        return inventory_for(path, inventory)
    if inventory is not None:
        return inventory
    raise UsageError("name the hosts: a job or inventory file (fleet doctor inventory/lab.toml)")


def doctor(path: Where = None, inventory: InvOpt = None, node: NodeOpt = None,
           exclude: ExcludeOpt = None,
           quick: Annotated[bool, typer.Option(
               "--quick", help="Shorter tests: 1 s a link, a 16 MiB disk test, no all-reduce "
                               "(12 s at 8 hosts here).")] = False,
           as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")
                              ] = False) -> None:
    """Measure every host and the links between them; name the slow one.

    Links are measured from node to node on the addresses a run would use (TCP bandwidth both
    ways and round trips, in rounds of disjoint pairs at once); each host's CPUs, steal,
    memory, disk in the workdir, clock and GPUs (ECC errors, retired pages, throttling, PCIe
    link). A host or link well below the median of its peers is named with its figures; the
    bounds are the inventory's [doctor] table. Each host's figures are kept on this machine: a
    host well below what it was is named too. Exit code 5 when something is named, 3 when a
    host could not be examined, 0 when all is within bounds."""
    from fleet import backends
    from fleet.console import Console, Meaning
    from fleet.doctor import history, report
    from fleet.doctor.verdict import judge

    inv = _inventory(path, inventory)
    backend = backends.for_inventory(inv)
    console = Console()
    with console.waiting("examining the hosts") as wait:
        exam = backend.doctor(inv, selection(node, exclude), quick, progress=wait.update)
    findings = judge(exam, exam.bounds)
    kept = history.path_for(inv)
    past, now = history.load(kept), history.figures(exam)
    regressions = history.regressions(past, now, exam.bounds)
    unkept = history.keep(kept, past, now, time.time())
    if as_json:
        print(json.dumps(report.as_json(exam, findings, regressions)), flush=True)
    else:
        console.emit(console.table(report.HOST_HEADERS, report.host_rows(exam)))
        if exam.links:
            echo("")
            console.emit(console.table(report.LINK_HEADERS, report.link_rows(exam)))
        if exam.ring is not None and exam.ring.error:
            console.info(f"all-reduce: none measured: {exam.ring.error}", Meaning.WARN)
        for name, why in exam.unreached.items():
            console.info(f"{name}: not examined: {why}", Meaning.FAIL)
        for line in [f.line for f in findings] + regressions:  # the answer: on stdout
            echo(line)
        if unkept:
            console.info(unkept, Meaning.WARN)
        echo(report.summary(exam, findings, regressions))
    if findings:  # what is below its peers now; a figure below its own past is said, as news
        raise typer.Exit(ExitCode.NOT_READY)
    if exam.unreached:
        raise typer.Exit(ExitCode.UNREACHABLE)
