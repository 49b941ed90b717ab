"""The commands that start from a job or an inventory: up, plan, check, trust, export slurm."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from pathlib import Path
from typing import Annotated

import typer

from fleet.cli.app import (
    WAIT_FOREVER,
    ExcludeOpt,
    ExtraArgs,
    InvOpt,
    JobArg,
    NodeOpt,
    app,
    echo,
    job_given,
    selected,
    selection,
)
from fleet.errors import UsageError
from fleet.timespan import parse_duration


@app.command()
def up(job_path: JobArg, extra: ExtraArgs = None, inventory: InvOpt = None,
       node: NodeOpt = None, exclude: ExcludeOpt = None,
       detach: Annotated[bool, typer.Option("--detach", "-d",
                                            help="Return once every node has started.")] = False,
       skip_checks: Annotated[bool, typer.Option(
           "--skip-checks", help="Start even if the preflight port checks fail.")] = False,
       force: Annotated[bool, typer.Option(
           "--force", help="Start even if another fleet run still holds these hosts, or another "
                          "user's process is on the GPUs the job uses (each one said).")] = False,
       allow_mismatch: Annotated[bool, typer.Option(
           "--allow-version-mismatch",
           help="Start (with a warning) although nodes have different python/torch versions.")
       ] = False,
       debug_env: Annotated[bool, typer.Option(
           "--debug", help="Render the distributed debugging env on every node (NCCL_DEBUG=INFO, "
                           "TORCH_DISTRIBUTED_DEBUG=DETAIL, ...); `fleet --debug up` is fleet's "
                           "own traceback.")] = False,
       force_setup: Annotated[bool, typer.Option(
           "--setup", help="Run the job's setup again on every node, changed or not.")] = False,
       wait: Annotated[str | None, typer.Option(
           "--wait", metavar="[DURATION]",
           help="First wait until every GPU the job uses (no GPUs chosen: the whole host) is "
                "free of anyone's process and of other users' leases, at most DURATION (30m, "
                "4h) if given.")] = None,
       ignore_leases: Annotated[bool, typer.Option(
           "--ignore-leases", help="Start on GPUs other users leased (fleet reserve); their "
                                   "processes still need --force.")] = False,
       as_json: Annotated[bool, typer.Option(
           "--json", help="The run's events on stdout, one JSON object a line (docs/EVENTS.md),"
                          " instead of words and log lines.")] = False,
       ) -> None:
    """Start the job on every host and stream its logs.

    The master starts first; every log line is tagged by host and rank."""
    from fleet.config.job import load_job, with_extra_args
    from fleet.lifecycle.session import Session

    with Session.for_command(as_json) as session:
        job = selected(with_extra_args(load_job(job_path, inventory), extra or []), node,
                       exclude)
        # SSH and the run's machinery once the job is known good: a bad file is said at once
        from fleet import backends
        from fleet.lifecycle import runner

        if debug_env:
            job = dataclasses.replace(job, debug=True)
            session.console.banners = True  # the distributed debugging asked: all of it
        runner.up(backends.for_inventory(job.inventory), job, session.console, backends.Options(
            detach=detach, checks=not skip_checks, force=force, allow_mismatch=allow_mismatch,
            force_setup=force_setup, wait=wait_seconds(wait), ignore_leases=ignore_leases))


def wait_seconds(text: str | None) -> float | None:
    """--wait's value (fleet.cli.app.optional_values): None, math.inf, or seconds."""
    if text is None:
        return None
    if text == WAIT_FOREVER:
        return math.inf
    seconds = parse_duration(text)
    if seconds is None or seconds <= 0:
        raise UsageError(f"--wait={text}: a duration (30s, 10m, 4h, 1d), or --wait alone to "
                         "wait as long as it takes")
    return seconds


@app.command()
def plan(job_path: JobArg, extra: ExtraArgs = None, inventory: InvOpt = None,
         node: NodeOpt = None, exclude: ExcludeOpt = None,
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
         debug_env: Annotated[bool, typer.Option(
             "--debug", help="With the distributed debugging env of `fleet up --debug`.")
         ] = False,
         probe: Annotated[bool, typer.Option(
             "--probe", help="Connect (read-only) to show the detected interfaces, addresses "
                             "and paths, and what `up` would send to which node, by which "
                             "route.")] = False,
         ) -> None:
    """Show what `up` would run, without running it.

    Each node's rank, env and command, and the data to sync; without --probe nothing is
    connected to."""
    from fleet import backends
    from fleet.config.job import load_job, with_extra_args

    job = selected(with_extra_args(load_job(job_path, inventory), extra or []), node, exclude)
    if debug_env:
        job = dataclasses.replace(job, debug=True)
    shown = backends.for_inventory(job.inventory).preview(job, probe)
    if as_json:
        print(json.dumps(shown.as_json(), indent=2))
        return
    for line in shown.lines():
        echo(line)


export_app = typer.Typer(no_args_is_help=True, help="Write the job for another scheduler.")
app.add_typer(export_app, name="export")


@export_app.command("slurm")
def export_slurm(
        job_path: JobArg, inventory: InvOpt = None,
        output: Annotated[Path | None, typer.Option(
            "--output", "-o", help="Write the script to this file (default: stdout).")] = None,
        partition: Annotated[str | None, typer.Option(help="sbatch --partition.")] = None,
        time_limit: Annotated[str | None, typer.Option(
            "--time", help="sbatch --time (minutes, HH:MM:SS, D-HH:MM:SS).")] = None,
        account: Annotated[str | None, typer.Option(help="sbatch --account.")] = None,
        nodes: Annotated[int | None, typer.Option(
            help="Nodes (default: the inventory's [slurm] nodes, or its number of hosts).")
        ] = None,
        gpus_per_node: Annotated[str | None, typer.Option(
            "--gpus-per-node", help="sbatch --gpus-per-node (4, or a100:4).")] = None,
        debug_env: Annotated[bool, typer.Option(
            "--debug", help="With the distributed debugging env of `fleet up --debug`.")
        ] = False,
        ) -> None:
    """Write a standalone sbatch script for the job.

    fleet is not needed to run it: one torchrun per node with the node rank from Slurm,
    fail-fast srun, the same NIC choice as fleet."""
    from fleet import backends
    from fleet.config.job import load_job

    job = load_job(job_path, inventory)
    if debug_env:
        job = dataclasses.replace(job, debug=True)
    text = backends.named(backends.BackendKind.SLURM).export(job, dict(
        partition=partition, time=time_limit, account=account, nodes=nodes,
        gpus_per_node=gpus_per_node))
    if output is None:
        print(text, end="")
        return
    try:
        output.write_text(text)
        output.chmod(0o755)
    except OSError as e:
        raise UsageError(f"cannot write {output}: {e}") from e
    echo(f"fleet: wrote {output}; submit it with `sbatch {output}`", err=True)


@app.command()
def check(job_path: JobArg, inventory: InvOpt = None, node: NodeOpt = None,
          exclude: ExcludeOpt = None,
          collective: Annotated[bool, typer.Option(
              "--collective", help="Also run a short all_reduce and print bandwidth per size.")
          ] = False,
          verbose: Annotated[bool, typer.Option(
              "--verbose", "-v", help="Every check in its own row, host by host (by default the "
                                      "passing ones are folded into one line per host).")
          ] = False) -> None:
    """Check every host before running.

    SSH, versions, GPUs, ports, names, clocks, disk (on a Slurm cluster: the login node,
    Slurm's clients, and whether Slurm would take the job)."""
    from fleet import backends
    from fleet.config.job import load_job
    from fleet.console import Console
    from fleet.lifecycle import runner

    job = selected(load_job(job_path, inventory), node, exclude)
    backend = backends.for_inventory(job.inventory)
    console = Console()
    # The command that trusts these hosts' keys, as the user named the files here.
    trust = shlex.join(["fleet", "trust", str(job_path)]
                       + (["--inventory", str(inventory)] if inventory else []))
    with console.waiting("checking") as wait:
        checks = backend.checks(job, collective, progress=wait.update, trust=trust)
    console.emit(backends.check_view(console, checks, verbose))
    echo("\n" + backends.check_summary(checks))
    if backends.differ(checks):  # one host unlike the others: measure them side by side
        echo(f"the hosts differ ({', '.join(backends.differ(checks))}): `fleet doctor "
             f"{shlex.quote(str(job_path))}` measures every host and link side by side and "
             "names the slow one")
    if any(c.status is backends.Status.FAIL for c in checks):
        raise typer.Exit(1)
    if collective:
        runner.up(backend, backend.collective(job), console)


@app.command()
def trust(path: Annotated[Path, typer.Argument(
              metavar="JOB_OR_INVENTORY", callback=job_given,
              help="Job file, as every command takes (its inventory's hosts), or an inventory "
                   "file: a job has `script` (or `module`, `command`), an inventory `[[hosts]]` "
                   "or `[slurm]`.")],
          inventory: InvOpt = None, node: NodeOpt = None, exclude: ExcludeOpt = None,
          accept: Annotated[bool, typer.Option(
              "--accept", help="Record the NEW keys shown (a CHANGED key never is).")] = False,
          to: Annotated[str, typer.Option(
              "--to", help="Where to record: known_hosts (the file fleet reads for the host: "
                           "the inventory's `known_hosts`, else ssh_config's "
                           "UserKnownHostsFile, else ~/.ssh/known_hosts) or inventory (pin "
                           "`host_key` per host).")
          ] = "known_hosts") -> None:
    """Show each host's key fingerprint; --accept records the new ones."""
    from fleet import backends
    from fleet import trust as fleet_trust
    from fleet.config import hostkeys, select
    from fleet.trust import KeyState

    if to not in ("known_hosts", "inventory"):
        raise UsageError("--to must be known_hosts or inventory")
    inventory_path = fleet_trust.inventory_for(path, inventory)
    backend = backends.for_inventory(inventory_path)
    inv = backend.trust_inventory(inventory_path)
    if inv is None:
        echo("the login node is this machine: no host key to trust")
        return
    inv = select.narrowed(inv, selection(node, exclude))
    from fleet import waits
    from fleet.console import Console
    with waits.shown_by(Console().hosts_waiting):
        statuses = fleet_trust.survey(inv)
    width = max((len(s.host) for s in statuses), default=4)
    for s in statuses:
        fp = hostkeys.fingerprint(s.key) if s.key is not None else ""
        echo(f"{s.host:<{width}}  {s.state.value.upper():<11} {fp} {s.detail}".rstrip())
    new = [s for s in statuses if s.state is KeyState.NEW]
    if accept and new:
        if to == "inventory":
            n = backend.pin_keys(statuses, inventory_path)
            echo(f"pinned {n} key(s) in {inventory_path}")
        else:
            for where, n in fleet_trust.record_known_hosts(statuses).items():
                echo(f"recorded {n} key(s) in {where}")
        new = []
    bad = [s for s in statuses if s.state in (KeyState.CHANGED, KeyState.UNREACHABLE)]
    if bad or new:
        if new:
            echo("check the fingerprints above, then record them with --accept", err=True)
        raise typer.Exit(1)


