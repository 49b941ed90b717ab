"""The command line: the only module that knows typer, prints errors and picks exit codes.

Commands raise FleetError subclasses; `main` is the one handler that turns them into a message
and an exit code (0 ok, 1 failed, 2 bad input, 3 hosts unreachable or state unknown, 4 stopped,
5 a host not ready for the job, 6 hosts busy with another run, 70 a bug in fleet, 130
interrupted), and never shows a Python traceback unless asked
(`--debug`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from fleet import manifest as fleet_manifest
from fleet import preview
from fleet import trust as fleet_trust
from fleet.backends.checks import Status
from fleet.backends.checks import table as checks_table
from fleet.backends.hosts import check as fleet_check
from fleet.backends.hosts import node as remote
from fleet.backends.hosts import prepare as launch
from fleet.backends.hosts import recorded
from fleet.backends.hosts import setup as fleet_setup
from fleet.backends.slurm import backend as slurm_run
from fleet.backends.slurm import cluster as slurm
from fleet.config import hostkeys
from fleet.config.inventory import Host, Inventory, load_inventory
from fleet.config.job import load_job, with_extra_args
from fleet.console import Console, printable
from fleet.errors import DamagedRecord, FleetError, Interrupted, UsageError
from fleet.facts import run_state
from fleet.plan import Plan, make_plan, masked, new_run_id, rank_span
from fleet.run import hang
from fleet.run import logs as fleet_logs
from fleet.run import record as state
from fleet.run import runner as lifecycle
from fleet.run.record import NodeRecord
from fleet.run.states import NodeStatus, RunStatus, overall
from fleet.shell import join
from fleet.transport import Transport, open_transport
from fleet.transport.group import each, reason

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run a PyTorch distributed job across the hosts of an inventory.")

JobArg = Annotated[Path, typer.Argument(help="Job file (TOML), e.g. jobs/mnist.toml.")]
InvOpt = Annotated[Path | None, typer.Option("--inventory", "-i",
                                             help="Inventory file; overrides the job's own.")]
ExtraArgs = Annotated[list[str] | None, typer.Argument(
    help="Extra arguments for the script, after --: fleet up JOB -- --resume")]
RunArg = Annotated[str | None, typer.Argument(help="Run id (default: the latest run).")]


@app.callback()
def _options(debug: Annotated[bool, typer.Option(
        "--debug", help="Show the Python traceback of an error (for reporting a bug).")
        ] = False) -> None:
    """Run a PyTorch distributed job across the hosts of an inventory."""


@app.command()
def up(job_path: JobArg, extra: ExtraArgs = None, inventory: InvOpt = None,
       detach: Annotated[bool, typer.Option("--detach", "-d",
                                            help="Return once every node has started.")] = False,
       skip_checks: Annotated[bool, typer.Option(
           "--skip-checks", help="Start even if the preflight port checks fail.")] = False,
       force: Annotated[bool, typer.Option(
           "--force", help="Start even if another fleet run still holds these hosts.")] = False,
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
       ) -> None:
    """Start the job on every host (master first) and stream all logs, tagged by host and rank."""
    job = with_extra_args(load_job(job_path, inventory), extra or [])
    if debug_env:
        job = dataclasses.replace(job, debug=True)
    if slurm.is_cluster(job.inventory):
        slurm_run.up(slurm.load_cluster(job.inventory), job, Console(), detach=detach,
                     checks=not skip_checks)
        return
    inv = load_inventory(job.inventory)
    lifecycle.up(inv, job, Console(), detach=detach, checks=not skip_checks, force=force,
                 allow_mismatch=allow_mismatch, force_setup=force_setup)


@app.command()
def plan(job_path: JobArg, extra: ExtraArgs = None, inventory: InvOpt = None,
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
         debug_env: Annotated[bool, typer.Option(
             "--debug", help="With the distributed debugging env of `fleet up --debug`.")
         ] = False,
         probe: Annotated[bool, typer.Option(
             "--probe", help="Connect (read-only) to show the detected interfaces, addresses "
                             "and paths, and what `up` would send to which node, by which "
                             "route.")] = False,
         ) -> None:
    """Dry run: each node's rank, env and command, and the data to sync; without --probe nothing
    is connected to."""
    job = with_extra_args(load_job(job_path, inventory), extra or [])
    if debug_env:
        job = dataclasses.replace(job, debug=True)
    inv = load_inventory(job.inventory)
    console = Console(out=sys.stderr)
    sources = launch.scan_sources(job, console)  # as `up` does, before any host is touched
    if probe:
        console.hosts([h.name for h in inv.hosts])
        session = launch.connect(inv, console)
        try:
            p = launch.prepare_plan(session, inv, job, new_run_id(job.name), console,
                                    create=False, allow_mismatch=True)
            setups = fleet_setup.decide(p, fleet_setup.recorded(session.t, p)
                                        if job.setup else {})
            moves = preview.preview(p, sources.code, sources.data,
                                    preview.list_nodes(session.t, p),
                                    tuple(n for n, f in session.facts.items() if not f.storage))
        finally:
            session.close()
    else:
        p = make_plan(inv, job, new_run_id(job.name))
        setups = fleet_setup.decide(p, None)
        moves = preview.preview(p, sources.code, sources.data)
    if as_json:
        print(json.dumps({**_plan_json(p), "data": preview.as_json(moves)}, indent=2))
        return
    echo(f"run {p.run_id}: {job.name}, {len(p.nodes)} node(s), rendezvous "
          f"{job.rendezvous.backend} at {p.master.master_addr}:{job.rendezvous.port}")
    for note in p.notes:
        echo(f"note: {note}")
    for group in p.storage:
        if len(group) > 1:
            echo(f"shared storage: {', '.join(group)} (one workdir; code and data synced once)")
    for n in p.nodes:
        h = n.host
        echo(f"\n[{h.name}] node rank {n.node_rank}, {h.transport} "
              f"{(h.user + '@') if h.user else ''}{h.address}"
              f"{':' + str(h.port) if h.port else ''}")
        echo(f"  interface: {n.net.interface or '-'} ({n.net.reason})")
        span = rank_span(n.rank_base, n.nproc)
        gpus = f" on GPU(s) {','.join(map(str, h.gpus))}" if h.gpus else ""
        world = f" of world size {n.world_size}" if n.world_size else ""
        echo(f"  processes: {n.nproc}{gpus}" + (f", {span}{world}" if span else world))
        echo(f"  code dir:  {n.code_dir}")
        if job.setup:
            echo(f"  setup:     {setups[h.name]}")
        echo(f"  run dir:   {n.run_dir}")
        for k, v in masked(n.env, job.secret_env).items():
            echo(f"  env {k}={v}")
        echo(f"  command:   {join(n.argv)}")
    echo("")
    for line in preview.lines(moves):
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
    """A standalone sbatch script for the job (fleet not needed to run it): one torchrun per
    node with the node rank from Slurm, fail-fast srun, the same NIC choice as fleet."""
    job = load_job(job_path, inventory)
    if debug_env:
        job = dataclasses.replace(job, debug=True)
    cluster = slurm.with_options(slurm.cluster_for(job.inventory), partition=partition,
                                 time=time_limit, account=account, nodes=nodes,
                                 gpus_per_node=gpus_per_node)
    text = slurm.export_script(job, cluster)
    if output is None:
        print(text, end="")
        return
    try:
        output.write_text(text)
        output.chmod(0o755)
    except OSError as e:
        raise UsageError(f"cannot write {output}: {e}") from e
    echo(f"fleet: wrote {output}; submit it with `sbatch {output}`", err=True)


def _plan_json(p: Plan) -> dict[str, object]:
    return {"run_id": p.run_id, "job": p.job.name, "notes": list(p.notes),
            "storage": [list(g) for g in p.storage], "nodes": [
        {"host": n.host.name, "address": n.host.address, "transport": n.host.transport,
         "node_rank": n.node_rank, "nnodes": n.nnodes, "nproc_per_node": n.nproc,
         "rank_base": n.rank_base, "world_size": n.world_size,
         "gpus": list(n.host.gpus) if n.host.gpus else None,
         "master_addr": n.master_addr, "master_port": n.master_port,
         "interface": n.net.interface, "interface_reason": n.net.reason,
         "run_dir": n.run_dir, "code_dir": n.code_dir,
         "env": masked(n.env, p.job.secret_env), "argv": list(n.argv)}
        for n in p.nodes]}


@app.command()
def check(job_path: JobArg, inventory: InvOpt = None,
          collective: Annotated[bool, typer.Option(
              "--collective", help="Also run a short all_reduce and print bandwidth per size.")
          ] = False) -> None:
    """Check every host before running: SSH, versions, GPUs, ports, names, clocks, disk (on a
    Slurm cluster: the login node, Slurm's clients, and whether Slurm would take the job)."""
    job = load_job(job_path, inventory)
    on_slurm = slurm.is_cluster(job.inventory)
    if on_slurm and collective:
        raise UsageError("--collective runs on host lists only; on Slurm, submit a job that "
                         "runs it")
    if on_slurm:
        checks = slurm_run.checks(slurm.load_cluster(job.inventory), job)
    else:
        inv = load_inventory(job.inventory)
        checks = fleet_check.run_checks(inv, job)
    echo(checks_table(checks))
    failed = [c for c in checks if c.status is Status.FAIL]
    warned = [c for c in checks if c.status is Status.WARN]
    echo(f"\n{len(failed)} failed, {len(warned)} warning(s), "
          f"{len(checks) - len(failed) - len(warned)} passed")
    if failed:
        raise typer.Exit(1)
    if collective:
        lifecycle.up(inv, fleet_check.collective_job(job), Console())


@app.command()
def trust(inventory_path: Annotated[Path, typer.Argument(help="Inventory file (TOML).")],
          accept: Annotated[bool, typer.Option(
              "--accept", help="Record the NEW keys shown (a CHANGED key never is).")] = False,
          to: Annotated[str, typer.Option(
              "--to", help="Where to record: known_hosts (the file fleet reads for the host: "
                           "the inventory's `known_hosts`, else ssh_config's "
                           "UserKnownHostsFile, else ~/.ssh/known_hosts) or inventory (pin "
                           "`host_key` per host).")
          ] = "known_hosts") -> None:
    """Show each host's key fingerprint, and with --accept record the new ones."""
    if to not in ("known_hosts", "inventory"):
        raise UsageError("--to must be known_hosts or inventory")
    cluster = slurm.is_cluster(inventory_path)
    if cluster:  # a Slurm cluster: its login node, the one host fleet connects to
        login = slurm.load_cluster(inventory_path).login
        inv = Inventory(inventory_path, (login,) if login is not None else ())
        if login is None or login.transport != "ssh":
            echo("the login node is this machine: no host key to trust")
            return
    else:
        inv = load_inventory(inventory_path)
    statuses = fleet_trust.survey(inv)
    width = max((len(s.host) for s in statuses), default=4)
    for s in statuses:
        fp = hostkeys.fingerprint(s.key) if s.key is not None else ""
        echo(f"{s.host:<{width}}  {s.state.upper():<11} {fp} {s.detail}".rstrip())
    new = [s for s in statuses if s.state == "new"]
    if accept and new:
        if to == "inventory":
            n = fleet_trust.record_inventory(statuses, inventory_path, cluster)
            echo(f"pinned {n} key(s) in {inventory_path}")
        else:
            for path, n in fleet_trust.record_known_hosts(statuses).items():
                echo(f"recorded {n} key(s) in {path}")
        new = []
    bad = [s for s in statuses if s.state in ("changed", "unreachable")]
    if bad or new:
        if new:
            echo("check the fingerprints above, then record them with --accept", err=True)
        raise typer.Exit(1)


@app.command()
def stop(run_id: RunArg = None) -> None:
    """Stop a run on every host: SIGTERM, then SIGKILL after a grace period."""
    console = Console()
    rec = state.load(run_id)
    on_slurm = slurm_run.load(rec)
    if on_slurm is not None:
        slurm_run.stop(on_slurm, console)
        return
    console.hosts([n.host.name for n in rec.nodes])
    results = recorded.stop_recorded(rec, "fleet stop")
    bad = 0
    for name, r in results.items():
        if isinstance(r, Exception):
            bad += 1
            console.phase(name, f"could not stop: {reason(r)}; the run may still be running "
                                f"there: run `fleet stop {rec.run_id}` again once it answers")
        elif r:
            bad += 1
            console.phase(name, f"still alive after SIGKILL: {r}")
        else:
            console.phase(name, "stopped (nothing of the run left)")
    if bad:
        raise typer.Exit(3)
    console.info(f"run {rec.run_id} stopped on every node")


def _states(rec: state.RunRecord) -> dict[str, run_state.NodeState | Exception]:
    return recorded.on_nodes(rec, lambda t, d: run_state.state(t, d, rec.stop_key(t.host.name)))


def _status(r: run_state.NodeState | Exception) -> NodeStatus:
    return r.status if isinstance(r, run_state.NodeState) else NodeStatus.UNREACHABLE


@app.command()
def rm(run_id: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """Remove a finished run: its directory on every node and its local record."""
    console = Console()
    rec = state.load(run_id)
    on_slurm = slurm_run.load(rec)
    if on_slurm is not None:
        console.info(f"removed {slurm_run.remove(on_slurm)}")
        shutil.rmtree(rec.dir, ignore_errors=True)
        console.info(f"run {rec.run_id} removed")
        return
    console.hosts([n.host.name for n in rec.nodes])
    results = recorded.on_nodes(rec, remote.remove)
    bad = {name: reason(r) for name, r in results.items() if isinstance(r, Exception)}
    for name, r in results.items():
        console.phase(name, f"kept: {bad[name]}" if name in bad else f"removed {r}")
    if bad:
        console.info(f"the local record of {rec.run_id} is kept until every node is clean")
        raise typer.Exit(3)
    shutil.rmtree(rec.dir, ignore_errors=True)
    console.info(f"run {rec.run_id} removed")


@app.command()
def status(run_id: RunArg = None) -> None:
    """Each node's state for a run; exits 0 if it runs or succeeded, 1 failed, 3 unknown (a node
    could not be asked), 4 stopped."""
    rec = state.load(run_id)
    on_slurm = slurm_run.load(rec)
    if on_slurm is not None:
        word, lines = slurm_run.status(on_slurm, rec.started)
        echo("\n".join(lines))
        if word.exit_code:
            raise typer.Exit(word.exit_code)
        return
    if rec.never_started():
        echo(f"run {rec.run_id} ({rec.job}), started {time.ctime(rec.started)}: "
              f"{RunStatus.NEVER_STARTED.value}\n  the `fleet up` that prepared it ended (it was "
              "killed, or its machine stopped) before it started any node: nothing of it runs; "
              f"`fleet rm {rec.run_id}` removes what it left on the nodes")
        raise typer.Exit(RunStatus.NEVER_STARTED.exit_code)
    results = _states(rec)
    final = overall(_status(r) for r in results.values())
    echo(f"run {rec.run_id} ({rec.job}), started {time.ctime(rec.started)}: {final.value}")
    for n in rec.nodes:
        r = results[n.host.name]
        where = f"  {n.host.name:<16} {n.ranks()}"
        if isinstance(r, Exception):
            echo(f"{where}  unreachable (may still be running): {reason(r)}")
            continue
        if r.status is NodeStatus.MISSING:
            echo(f"{where}  missing (no run directory there)")
            continue
        code = f" (exit {r.code})" if r.code is not None else ""
        by = f" by {r.stopped_by}" if r.status is NodeStatus.STOPPED and r.stopped_by else \
            f": {r.own_failure} before the stop ({r.stopped_by}) reached it" if r.own_failure \
            else ""
        took = f"  {r.elapsed}s" if r.elapsed is not None else ""
        echo(f"{where}  {r.status.value}{code}{by}{took}")
    if final.exit_code:
        raise typer.Exit(final.exit_code)


@app.command()
def ps(all_runs: Annotated[bool, typer.Option("--all", help="Every recorded run, "
                                               "not only the last 10.")] = False,
       hosts: Annotated[Path | None, typer.Option(
           "--hosts", help="Instead: the runs alive on the hosts of this inventory, whoever "
                           "started them.")] = None) -> None:
    """Recorded runs, newest last, each with its state across its nodes."""
    if hosts is not None:
        _ps_hosts(hosts)
        return
    runs, damaged = state.all_runs()
    for path, why in damaged.items():
        echo(f"fleet: skipping a damaged run record {path} ({why})", err=True)
    runs = runs if all_runs else runs[-10:]
    results = each(((r.run_id, r) for r in runs), _states)
    for rec in runs:
        r = results[rec.run_id]
        word = overall(_status(s) for s in r.values()).value if isinstance(r, dict) else \
            f"unknown ({reason(r)})"
        if rec.never_started():
            word = RunStatus.NEVER_STARTED.value
        if isinstance(r, dict) and not r and (on_slurm := slurm_run.load(rec)) is not None:
            try:
                word = f"{slurm_run.status(on_slurm, rec.started)[0].value} (slurm)"
            except FleetError as e:
                word = f"unknown ({reason(e)})"
        names = ",".join(n.host.name for n in rec.nodes)
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec.started))
        echo(f"{rec.run_id:<40} {word:<12} {started}  {names}")


def _ps_hosts(path: Path) -> None:
    inv = load_inventory(path)

    def alive(h: Host) -> list[str]:
        with open_transport(h) as t:
            return run_state.held_by(t, f"{t.path(t.host.workdir)}/runs")

    results = each(((h.name, h) for h in inv.hosts), alive)
    bad = 0
    for name, r in results.items():
        if isinstance(r, Exception):
            bad += 1
            echo(f"{name}: unreachable: {reason(r)}", err=True)
            continue
        for held in r:
            run_id, _, node = held.partition("/")
            echo(f"{run_id:<40} running      {name} (as node {node})")
    if bad:
        raise typer.Exit(3)


@app.command()
def logs(run_id: RunArg = None,
         follow: Annotated[bool, typer.Option("--follow", "-f",
                                              help="Keep following a live run.")] = False,
         node: Annotated[str | None, typer.Option("--node", help="Only this host.")] = None,
         rank: Annotated[int | None, typer.Option("--rank", help="Only this global rank.")] = None,
         ) -> None:
    """Print a run's logs from the nodes, from the start; -f follows a live run to its end."""
    console = Console()
    rec = state.load(run_id)
    on_slurm = slurm_run.load(rec)
    if on_slurm is not None:
        shown = slurm_run.logs(on_slurm, console, follow, node, rank)
        if rank is not None and not shown:
            raise UsageError(f"run {rec.run_id}: no log line of global rank {rank}")
        return
    if node is not None and node not in {n.host.name for n in rec.nodes}:
        raise UsageError(f"run {rec.run_id} has no node {node!r}")
    keep = rec.dir if node is None and rank is None else None
    problems, shown = fleet_logs.attach(rec, console, follow, node, rank, keep)
    for name, why in problems.items():
        console.phase(name, f"unreachable: {why}")
    if problems:
        raise typer.Exit(3)
    if rank is not None and not shown:
        raise UsageError(f"run {rec.run_id}: no log line of global rank {rank}"
                         + (f" on {node}" if node else "") + " (lines that workers did not "
                         "print through the launcher carry no rank)")


@app.command()
def show(run_id: RunArg = None,
         as_json: Annotated[bool, typer.Option("--json", help="The manifest as JSON.")] = False,
         ) -> None:
    """What exactly ran: job and inventory, each node's env, command and versions, the code's
    commit and diff, the synced files' hashes, setup (on Slurm: the job id, the script's env
    and command, the nodes)."""
    m = _manifest(state.load(run_id))
    if as_json:
        print(fleet_manifest.dumps(m), end="")
        return
    for line in fleet_manifest.show(m):
        echo(line)


@app.command("diff")
def diff_runs(run_a: Annotated[str, typer.Argument(help="The earlier run.")],
              run_b: Annotated[str, typer.Argument(help="The later run.")]) -> None:
    """What changed between two runs: code, files, hosts, env, commands, versions, setup."""
    a, b = _manifest(state.load(run_a)), _manifest(state.load(run_b))
    changes = fleet_manifest.diff(a, b)
    for line in changes or [f"no difference between {a['run_id']} and {b['run_id']}"]:
        echo(line)


def _manifest(rec: state.RunRecord) -> dict[str, Any]:
    path = rec.dir / "manifest.json"
    on_slurm = slurm_run.load(rec)
    if on_slurm is not None:
        m = slurm_run.manifest_of(rec, on_slurm, Console())
        if m is None:
            raise UsageError(f"run {rec.run_id} has no manifest ({path}): it was never "
                             "submitted to Slurm, or an older fleet started it")
        return m
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise UsageError(f"run {rec.run_id} has no manifest ({path}): it never got past its "
                         "setup, or an older fleet started it") from None
    except ValueError as e:
        raise DamagedRecord(f"{path}: cannot be read ({e})") from e


@app.command()
def dump(run_id: RunArg = None) -> None:
    """Every rank's Python stack on every node of a running run, grouped (the rank that is
    different named first); the run goes on. Kept in the run's record too."""
    rec = state.load(run_id)
    on_slurm = slurm_run.load(rec)
    if on_slurm is not None:
        lines, problems = slurm_run.dump(on_slurm)
    else:
        lines, problems = _dump_hosts(rec)
    for line in lines + problems:
        echo(line)
    saved = hang.save(rec.dir, f"fleet dump of run {rec.run_id}", lines + problems)
    echo(f"(kept in {saved})", err=True)
    if problems:
        raise typer.Exit(3)


def _dump_hosts(rec: state.RunRecord) -> tuple[list[str], list[str]]:
    def connect(n: NodeRecord) -> Transport:
        return open_transport(n.host)

    opened = each(((n.host.name, n) for n in rec.nodes), connect)
    try:
        nodes = {n.host.name: (t, t.path(n.run_dir)) for n in rec.nodes
                 if isinstance(t := opened[n.host.name], Transport)}
        lines, problems = hang.take(nodes, rec.run_id, rec.dir)
    finally:
        for t in opened.values():
            if isinstance(t, Transport):
                t.close()
    return lines, [f"{name}: unreachable: {reason(r)}" for name, r in opened.items()
                   if isinstance(r, Exception)] + problems


def echo(text: str, err: bool = False) -> None:
    """Print for a person, on stdout (stderr with `err`): any text may hold what a node said (a
    host key's error, a run state, a stack), so control characters are shown, never obeyed."""
    print(printable(text, lines=True), file=sys.stderr if err else sys.stdout)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def main() -> None:
    """The one handler: every FleetError becomes its message and exit code; anything else is a
    bug in fleet, said in one line (with the traceback under --debug)."""
    args = sys.argv[1:]
    # fleet's own --debug comes before the command (`fleet up --debug` is the job's debug env)
    lead = list(itertools.takewhile(lambda a: a.startswith("-") and a != "--", args))
    debug = "--debug" in lead
    debug = debug or bool(os.environ.get("FLEET_DEBUG"))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        app()
    except Interrupted as e:
        _trace(debug)
        echo(f"fleet: {e}", err=True)
        sys.exit(e.exit_code)
    except FleetError as e:
        _trace(debug)
        echo(f"fleet: error: {e}", err=True)
        sys.exit(e.exit_code)
    except Exception as e:
        _trace(debug)
        echo(f"fleet: internal error: {type(e).__name__}: {e} (a bug in fleet; `fleet --debug "
             "...` shows where)", err=True)
        sys.exit(70)


def _trace(debug: bool) -> None:
    if debug:
        traceback.print_exc()
