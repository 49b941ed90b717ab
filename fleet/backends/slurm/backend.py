"""The Slurm backend: runs submitted through a login node (fleet.backends.slurm.run), and what
later commands ask of a recorded run there, through the login node."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.backends.answers import Seen
from fleet.backends.base import Launch, Options, Recorded
from fleet.backends.checks import Check, Status, connection_checks, ssh_failed
from fleet.backends.slurm.cluster import (
    Cluster,
    cluster_for,
    load_cluster,
    placed,
    with_options,
)
from fleet.backends.slurm.jobs import (
    SlurmRecord,
    cancel,
    job_info,
    load,
    missing_clients,
    node_address,
    node_infos,
    take_stacks,
    test_only,
)
from fleet.backends.slurm.report import manifest_of
from fleet.backends.slurm.run import NO_DECLARED_FORWARD, SlurmRun, prepare
from fleet.backends.slurm.script import Script, export_script, render
from fleet.backends.slurm.watch import Announcer, watch
from fleet.config.inventory import BackendKind, Inventory, TransportKind
from fleet.config.job import Job
from fleet.console import Console
from fleet.errors import (
    ConfigError,
    FleetError,
    JobFailed,
    NotEveryNode,
    UsageError,
)
from fleet.facts import slurm as sj
from fleet.facts.probe import probe, python_problem
from fleet.nodeside.shared import nodemap
from fleet.run.logs import View
from fleet.run.record import RunRecord, controller_alive
from fleet.shell import quote, sh
from fleet.states import RunStatus
from fleet.transport import open_transport
from fleet.transport.forward import Tunnel
from fleet.transport.group import reason
from fleet.trust import KeyStatus, record_inventory


def checks(cluster: Cluster, job: Job, trust: str) -> list[Check]:
    """`fleet check` on a Slurm cluster: the login node (connection, shell, Slurm's clients,
    the workdir), Slurm's answer to the request, and the python there. Nothing is submitted:
    the script goes to a scratch directory, removed at the end."""
    assert cluster.login is not None and cluster.workdir is not None
    try:
        t = open_transport(cluster.login)
    except FleetError as e:
        return [ssh_failed(cluster.login, e, trust, label="login")]
    with t:
        out = connection_checks(t)
        why = missing_clients(t)
        out.append(Check("login", "slurm clients", Status.FAIL if why else Status.PASS,
                         why or "sbatch, squeue, scontrol, scancel, srun"))
        workdir = t.path(cluster.workdir)
        scratch = nodemap.run_dir(workdir, f".check-{secrets.token_hex(4)}")
        s = Script(code_dir=nodemap.code_dir(workdir, job.slot), run_dir=scratch,
                   run_id="check", env_file=f"{scratch}/{nodemap.ENV_FILE}")
        try:
            t.run(sh("mkdir", "-p", scratch), timeout=60, what="make a scratch directory"
                  ).check(t.host.name)
            t.write(f"{scratch}/job.sbatch", render(job, cluster, s).encode(), 0o700)
            out.append(Check("login", "workdir", Status.PASS,
                             f"{t.path(cluster.workdir)} writable"))
        except FleetError as e:
            return [*out, Check("login", "workdir", Status.FAIL, reason(e))]
        try:
            if not why:
                ok, said = test_only(t, scratch)
                out.append(Check("slurm", "request", Status.PASS if ok else Status.FAIL,
                                 f"sbatch --test-only: {said}",
                                 "" if ok else "the [slurm] partition, nodes, time or account"))
        finally:
            t.run(sh("rm", "-rf", scratch), timeout=60)
        facts = probe(t, None, create=False, python=cluster.python)
        problem = python_problem(dataclasses.replace(t.host, python=cluster.python), facts)
        out.append(Check("login", "python", Status.WARN if problem else Status.PASS,
                         f"{problem} (on the login node; the job checks every node itself "
                         "before it starts)" if problem else
                         f"{cluster.python}: python {facts.python_version}, torch "
                         f"{facts.torch_version} (on the login node)"))
    return out





def dump(rec: SlurmRecord) -> tuple[list[str], list[str]]:
    """`fleet dump` of a run on Slurm: its stacks while it runs; it goes on."""
    if rec.job_id is None:
        raise UsageError(f"run {rec.run_id} was never submitted to Slurm: no stack to take")
    with open_transport(rec.login) as t:
        info = job_info(t, rec.job_id)
        if info is None or info.status is not RunStatus.RUNNING:
            # as on hosts: said, not an error
            return [f"the run is not running (Slurm job {rec.job_id} is "
                    f"{info.state if info else 'gone'}): no stack to take"], []
        return take_stacks(t, rec)




# ---- the run commands ---------------------------------------------------------------------
def stop(rec: SlurmRecord, console: Console) -> None:
    if rec.job_id is None and rec.submitting:
        raise NotEveryNode(f"run {rec.run_id}: sbatch gave no job id, so fleet cannot tell which "
                           "Slurm job to cancel: find it with `squeue --me` on the login node "
                           "and cancel it with scancel")
    if rec.job_id is None:
        console.info(f"run {rec.run_id} was never submitted to Slurm: nothing to stop")
        return
    with open_transport(rec.login) as t:
        info = job_info(t, rec.job_id)
        if info is not None and info.status.is_terminal:
            console.info(f"run {rec.run_id}: Slurm job {rec.job_id} had already ended "
                         f"({info.state})")
            return
        info = cancel(t, rec.job_id, console)
    if info is not None and not info.status.is_terminal:
        raise JobFailed(f"Slurm job {rec.job_id} is still {info.state} after scancel; run "
                        f"`fleet stop {rec.run_id}` again", exit_code=3)
    console.phase("slurm", f"job {rec.job_id} cancelled ({info.state if info else 'gone'})")
    console.info(f"run {rec.run_id} stopped")


def unsubmitted(rec: RunRecord, srec: SlurmRecord) -> tuple[RunStatus, list[str]] | None:
    """A run whose `fleet up` has not submitted it (yet, or ever: it was killed): what Slurm
    never had is not asked about."""
    if srec.job_id is not None or rec.launched:
        return None
    head = f"run {rec.run_id} ({rec.job}), started {time.ctime(rec.started)}: "
    unknown = f"{head}{RunStatus.UNKNOWN.value}\n  "
    if srec.submitting:
        return RunStatus.UNKNOWN, [f"{unknown}sbatch was asked to submit it and gave no job id: "
                                   "Slurm may have queued it (`squeue --me` on the login node)"]
    alive = controller_alive(rec.controller)
    if alive is None:
        return RunStatus.UNKNOWN, [f"{unknown}its record has no Slurm job, and the `fleet up` "
                                   "that made it cannot be asked (another machine, a restart "
                                   "of this one, or an older fleet): it was most likely never "
                                   "submitted"]
    if not alive:
        return RunStatus.NEVER_STARTED, [
            f"{head}{RunStatus.NEVER_STARTED.value}\n  the `fleet up` that prepared it ended (it "
            "was killed, or its machine stopped) before it submitted the job to Slurm: nothing "
            f"of it runs; `fleet rm {rec.run_id}` removes its directory on the login node"]
    return RunStatus.STARTING, [f"{head}{RunStatus.STARTING.value}\n  its `fleet up` has not "
                                "submitted it to Slurm yet (it is sending the code and data)"]


def status(rec: SlurmRecord, started: float) -> tuple[RunStatus, list[str]]:
    """The run's state from Slurm (the recorded last word where Slurm forgot the job), and
    lines saying it per node."""
    with open_transport(rec.login) as t:
        info = job_info(t, rec.job_id) if rec.job_id else None
        nodes = node_infos(t, rec.run_dir)
    word = info.state if info else rec.final
    final = sj.status_of(word) if word else RunStatus.UNKNOWN
    lines = [f"run {rec.run_id} ({rec.job}), started {time.ctime(started)}: {final.value}",
             f"  slurm job {rec.job_id or '-'}: " + (
                 f"{info.state}" + (f", exit code {info.exit_code}"
                                    if info.exit_code is not None else "")
                 + (f" on {info.nodes}" if info.nodes else "") + f" ({info.source})"
                 if info else f"{rec.final or 'unknown'} (Slurm no longer knows the job; "
                              "as fleet last saw it)")]
    for n in sorted(nodes.values(), key=lambda n: (n.node_rank is None, n.node_rank)):
        ended = f"exit {n.code}" if n.code is not None else "no exit code yet"
        lines.append(f"  {n.name:<16} node rank {n.node_rank}  {ended}")
    return final, lines


def logs(rec: SlurmRecord, console: Console, follow: bool, node: str | None,
         rank: int | None) -> int:
    with open_transport(rec.login) as t:
        announce = Announcer(console, rec.job_id) if follow and rec.job_id else None
        _, shown = watch(t, rec, console, follow, node, rank, announce=announce)
    return shown


def refuse(view: View) -> None:
    """What `fleet logs` cannot do for a Slurm run, said before anything is read."""
    if view.merge or view.since is not None:
        raise UsageError("--merge and --since read the times fleet keeps beside each node's log "
                         "on a host list; a Slurm run's node logs are its batch script's output "
                         "on the shared filesystem, without times: leave them out")
    if view.tail is not None:
        raise UsageError("--tail: on Slurm, each node's log says the node's rank on its first "
                         "line, and every line's tag needs it, so fleet reads the logs from "
                         "their first line: leave --tail out (or pipe through `tail`)")


def remove(rec: SlurmRecord) -> str:
    if rec.job_id is None and rec.submitting:
        raise UsageError(f"run {rec.run_id}: sbatch gave no job id, and a job Slurm may have "
                         f"queued needs {rec.run_dir}: check `squeue --me` on the login node, "
                         "then remove that directory and this run's record yourself")
    with open_transport(rec.login) as t:
        info = job_info(t, rec.job_id) if rec.job_id else None
        if info is not None and not info.status.is_terminal:
            raise UsageError(f"Slurm job {rec.job_id} is still {info.state}: stop it first")
        t.run(sh("rm", "-rf", rec.run_dir), timeout=60, what=f"remove {rec.run_dir}"
              ).check(t.host.name)
    return quote(rec.run_dir)


NO_GPU_SHARING = ("they are for host lists; Slurm allocates a cluster's GPUs itself (sinfo -O "
                  "Gres,GresUsed and squeue show who has them; scontrol create reservation "
                  "reserves them)")


class SlurmBackend(Launch, Recorded):
    """Launches and answers for recorded runs; a lab's tools are for host lists (but trust:
    the login node's key)."""

    kind = BackendKind.SLURM
    instead = {
        "collective": "submit a job that runs it",
        "survey": NO_GPU_SHARING, "lease": NO_GPU_SHARING,
        # Which compute nodes a job gets is Slurm's choice, made per job, and fleet holds no
        # connection to them (only to the login node, where no job runs).
        "execute": "it runs on the hosts of a host list only (Slurm picks a job's compute "
                   "nodes when it starts it, and fleet reaches only the login node). On the "
                   "cluster, run it through Slurm: srun --nodes=N CMD (or inside your job's "
                   "allocation)",
        "pull": "a Slurm run's record keeps its run directory but not the job's directory on "
                "the shared filesystem that its outputs are written in; copy them from the "
                "login node (scp) for now",
        "preview": "`fleet export slurm` writes the script a Slurm run submits"}

    def prepare(self, job: Job, console: Console, options: Options) -> SlurmRun:
        cluster = placed(load_cluster(job.inventory), job)
        if job.restart.max:
            raise ConfigError(job.path, "restart", "fleet restarts runs on host lists only; on "
                              "Slurm, leave [restart] out and ask the cluster to requeue the "
                              'job (sbatch_args = ["--requeue"] under [slurm], where its '
                              "policy allows it)")
        if job.forward:
            raise ConfigError(job.path, "forward", NO_DECLARED_FORWARD)
        if options.wait is not None:
            raise UsageError("--wait is for host lists: on Slurm the queue already waits until "
                             "the job's GPUs are free (the job is PENDING until then)")
        return prepare(cluster, job, console, options)

    def checks(self, job: Job, collective: bool, progress: Callable[[str], None],
               trust: str) -> list[Check]:
        if collective:
            raise self.refuse("collective")
        progress("checking the login node and what Slurm would say")
        return checks(placed(load_cluster(job.inventory), job), job, trust)

    def trust_inventory(self, path: Path) -> Inventory | None:
        """The login node, the one host fleet connects to; None where it is this machine."""
        login = load_cluster(path).login
        if login is None or login.transport is not TransportKind.SSH:
            return None
        return Inventory(path, (login,))

    def pin_keys(self, statuses: list[KeyStatus], path: Path) -> int:
        """Under the `[slurm]` line: the login node's key."""
        return record_inventory(statuses, path, cluster=True)

    def describe(self, rec: RunRecord) -> tuple[RunStatus, list[str]]:
        srec = load(rec)
        return unsubmitted(rec, srec) or status(srec, rec.started)

    def state(self, rec: RunRecord) -> Seen:
        srec = load(rec)
        said = unsubmitted(rec, srec) or status(srec, rec.started)
        return Seen(said[0], by="slurm")

    def cancel(self, rec: RunRecord, console: Console) -> None:
        stop(load(rec), console)

    def logs(self, rec: RunRecord, console: Console, follow: bool, node: str | None,
             rank: int | None, view: View) -> int:
        refuse(view)
        shown = logs(load(rec), console, follow, node, rank)
        if rank is not None and not shown:
            raise UsageError(f"run {rec.run_id}: no log line of global rank {rank}")
        return shown

    def dump(self, rec: RunRecord) -> tuple[list[str], list[str]]:
        return dump(load(rec))

    def delete(self, rec: RunRecord, console: Console) -> None:
        console.info(f"removed {remove(load(rec))}")

    def tunnel(self, rec: RunRecord, node: str | None) -> Tunnel:
        """Through the login node's connection to the compute node, at the address Slurm has
        for it (NodeAddr, else its name: the login node reaches the compute nodes; nothing is
        needed on them)."""
        srec = load(rec)
        t = open_transport(srec.login)
        try:
            nodes = node_infos(t, srec.run_dir)
            if not nodes:
                raise UsageError(f"run {rec.run_id} runs on no node yet (Slurm job "
                                 f"{srec.job_id or '-'}): forward once it started")
            ranked = sorted(nodes.values(), key=lambda n: (n.node_rank is None, n.node_rank))
            name = ranked[0].name if node is None else node
            if name not in nodes:
                raise UsageError(f"run {rec.run_id} has no node {node!r}; its nodes: "
                                 f"{', '.join(n.name for n in ranked)}")
            address = node_address(t, name)
        except BaseException:
            t.close()
            raise
        return Tunnel(t, name, address=address)

    def manifest(self, rec: RunRecord, console: Console) -> dict[str, Any]:
        m = manifest_of(rec, load(rec), console)
        if m is None:
            raise UsageError(f"run {rec.run_id} has no manifest ({rec.dir / 'manifest.json'}): "
                             "it was never submitted to Slurm, or an older fleet started it")
        return m

    def export(self, job: Job, settings: dict[str, Any]) -> str:
        return export_script(job, with_options(placed(cluster_for(job.inventory), job),
                                               **settings))
