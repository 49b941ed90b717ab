"""`fleet exec`: a command on every host of an inventory (or a job's), at once, its output
grouped by what the hosts said. fleet.cli adds it to the app after the other commands, so that
`fleet --help` lists it after them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fleet.cli.app import ExcludeOpt, InvOpt, job_given, selection
from fleet.errors import Interrupted, UsageError


def execute(path: Annotated[Path, typer.Argument(
                metavar="JOB|INVENTORY", callback=job_given,
                help="A job file: the command runs in the job's directory on each host, with the "
                     "job's env; or an inventory file: in each host's home, with no env added.")],
            command: Annotated[list[str] | None, typer.Argument(
                metavar="-- CMD...",
                help="The command and its arguments, after --: each argument reaches the host "
                     "as one word (for pipes or globs: -- sh -c 'df -h | tail -n 1').")] = None,
            inventory: InvOpt = None,
            node: Annotated[list[str] | None, typer.Option(
                "--node", metavar="NODE",
                help="Only on this host (repeat for more); default: every host.")] = None,
            exclude: ExcludeOpt = None,
            timeout: Annotated[float | None, typer.Option(
                "--timeout", metavar="SECONDS", min=0.1,
                help="Give up on a host whose command has not ended after this long (it may "
                     "still run there); default: wait.")] = None) -> None:
    """Run a command on every host at once; same output is shown once.

    Hosts that gave the same output (stdout and stderr) and exit status are listed under one
    header; exit code 0 when every host's command exited 0, 1 when one failed (or could not
    run), 3 when a host gave no answer."""
    from fleet import backends, waits
    from fleet import trust as fleet_trust
    from fleet.config.job import load_job
    from fleet.console import Console
    from fleet.grouped import block, exit_code, groups, summary

    if not command:
        raise UsageError("give the command after --, e.g. fleet exec inventory.toml -- hostname")
    inventory_path = fleet_trust.inventory_for(path, inventory)
    job = None if inventory_path == path else load_job(path, inventory)
    console = Console()
    backend = backends.for_inventory(inventory_path)
    try:
        with waits.shown_by(console.hosts_waiting):
            outcomes = backend.execute(inventory_path, job, command, selection(node, exclude),
                                       timeout)
    except Interrupted as e:
        # Without a terminal on the node, nothing ends a command when its connection goes.
        raise Interrupted(e.signame, "a command that had started on a host goes on there "
                                     "(fleet exec stops nothing)") from None
    for g in groups(outcomes):
        # painted text is printable already (Console.paint): echo would show its colours' ESC
        print("\n".join(console.paint(text, meaning, err=False) for text, meaning in block(g)),
              flush=True)
    for text, meaning in summary(outcomes):
        console.info(text, meaning)
    code = exit_code(outcomes)
    if code:
        raise typer.Exit(code)
