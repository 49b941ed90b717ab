"""A run on a Slurm cluster behind the backend seam: prepare (the script, the preflight, the
record), schedule (sync the code to the shared filesystem, submit), follow the job, cancel
it, report."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from collections.abc import Generator

from fleet import manifest, nodeside
from fleet.backends.base import Event, Final, Options, Run
from fleet.backends.slurm import manifest as slurm_manifest
from fleet.backends.slurm.cluster import Cluster
from fleet.backends.slurm.jobs import (
    CANCEL_WAIT_S,
    SlurmRecord,
    cancel,
    preflight,
    record_dir,
    save,
    take_stacks,
)
from fleet.backends.slurm.report import keep_allocation, report
from fleet.backends.slurm.script import Script, argv, env_file_text, env_of, nproc, render
from fleet.backends.slurm.watch import DETACH_WAIT_S, Announcer, Watch, wait_started
from fleet.config.job import Job, RendezvousBackend
from fleet.console import Console
from fleet.errors import (
    FleetError,
    JobFailed,
    RemoteCommandError,
    UsageError,
)
from fleet.facts import slurm as sj
from fleet.nodeside.shared import nodemap
from fleet.plan import SITE, new_run_id
from fleet.reports import Detached, Forgotten, Stopped
from fleet.shell import sh
from fleet.states import NodeOutcome, RunStatus, StopCause
from fleet.transport import Transport, open_transport
from fleet.transport.forward import Tunnel
from fleet.transport.group import reason
from fleet.transport.sync import scan
from fleet.transport.transfer import sync_dir


def prepare(cluster: Cluster, job: Job, console: Console, options: Options) -> SlurmRun:
    """The run directory on the shared filesystem with the script, its env and fleet's
    sitecustomize; Slurm's preflight (sbatch --test-only); the record. Nothing is submitted
    yet, and a refused preflight leaves nothing behind."""
    assert cluster.login is not None and cluster.workdir is not None
    run_id = new_run_id(job.name)
    console.hosts(["slurm", "login"])
    console.info(f"run {run_id}: {job.name} on Slurm, {cluster.nodes} node(s) through "
                 f"{cluster.login.address}")
    t = open_transport(cluster.login)
    try:
        workdir = t.path(cluster.workdir).rstrip("/") or "/"
        run_dir = nodemap.run_dir(workdir, run_id)
        code_dir = nodemap.code_dir(workdir, job.slot)
        data_dir = nodemap.data_dir(workdir, job.data_slot)
        s = Script(code_dir=code_dir, data_dir=data_dir, run_dir=run_dir, run_id=run_id,
                   env_file=f"{run_dir}/env.sh")
        text = render(job, cluster, s)
        rec = SlurmRecord(run_id, str(job.path), cluster.login, run_dir,
                          nproc=nproc(job, cluster),
                          static=job.rendezvous.backend == RendezvousBackend.STATIC)
        try:
            t.run(sh("mkdir", "-p", f"{run_dir}/{SITE}"), timeout=60,
                  what="make the run directory").check(t.host.name)
            t.write(f"{run_dir}/env.sh", env_file_text(job, cluster, s).encode(), 0o600)
            # fleet's sitecustomize: each worker's rank and stack dump (fleet dump, the watchdog)
            t.write(f"{run_dir}/{SITE}/sitecustomize.py",
                    (nodeside.text("sitecustomize.py") + "\n").encode(), 0o644)
            t.write(f"{run_dir}/job.sbatch", text.encode(), 0o700)
            if options.checks:
                preflight(t, run_dir, console)
            started = time.time()
            save(rec, started)
        except BaseException:  # a refused preflight, an error, Ctrl-C: nothing is left
            with contextlib.suppress(FleetError):
                t.run(sh("rm", "-rf", run_dir), timeout=60)
            shutil.rmtree(record_dir(run_id), ignore_errors=True)
            raise
    except BaseException:
        t.close()
        raise
    return SlurmRun(t, cluster, job, rec, s, started, console)


class SlurmRun(Run):
    def __init__(self, t: Transport, cluster: Cluster, job: Job, rec: SlurmRecord, s: Script,
                 started: float, console: Console) -> None:
        self.t, self.cluster, self.job, self.rec, self.script = t, cluster, job, rec, s
        self.run_id, self.started_at, self.console = rec.run_id, started, console
        self.record_dir = record_dir(rec.run_id)
        self.announce: Announcer | None = None
        self.info: sj.JobInfo | None = None
        self.cancelled: sj.JobInfo | None = None  # Slurm's word after fleet's scancel
        self.problems: dict[str, str] = {}  # what the last cancel could not do
        self.submitting = False  # sbatch asked, no answer yet: a job may exist, its id unknown

    @property
    def job_id(self) -> str | None:
        return self.rec.job_id

    def schedule(self, options: Options) -> None:
        t, rec, job, console = self.t, self.rec, self.job, self.console
        s = self.script
        code = scan(job.workdir, job.exclude, ignore_files=True, never=job.unsent)
        stats = sync_dir(t, t.host.python, code, s.code_dir, rec.run_id, console)
        console.phase("login", f"code: {stats.files} file(s) sent, {stats.unchanged} unchanged "
                               f"({s.code_dir})")
        if job.data is not None and s.data_dir is not None:
            stats = sync_dir(t, t.host.python, scan(job.data, (), never=job.unsent),
                             s.data_dir, rec.run_id, console)
            console.phase("login", f"data: {stats.files} file(s) sent")
        self.submitting = True
        save(dataclasses.replace(rec, submitting=True), self.started_at)
        r = t.run(sj.submit_script(rec.run_dir, "job.sbatch"), timeout=60, what="sbatch")
        job_id = sj.parse_submit(r.out) if r.ok else None
        # A refusal says no job exists; an answer fleet cannot read leaves it unknown.
        self.submitting = r.ok and job_id is None
        if job_id is None:
            raise RemoteCommandError(t.host.name, "sbatch", r.code, r.out + r.err)
        self.rec = rec = dataclasses.replace(rec, job_id=job_id)
        save(rec, self.started_at)
        console.phase("slurm", f"submitted job {job_id} ({self.cluster.nodes} node(s), "
                               "srun --kill-on-bad-exit=1)")
        m = slurm_manifest.record_slurm(
            job, self.cluster, rec.run_id, job_id, f"{rec.run_dir}/job.sbatch",
            env_of(job, self.cluster, s.run_id, s.data_dir),
            [w for group in argv(job, self.cluster, s) for w in group], self.record_dir)
        t.write(f"{rec.run_dir}/manifest.json", manifest.dumps(m).encode(), 0o600)
        self.announce = Announcer(console, job_id)

    def started(self) -> bool:
        return self.job_id is not None

    def detached(self) -> Detached | None:
        assert self.job_id is not None and self.announce is not None
        nodes = self.cluster.nodes
        self.info, started = wait_started(self.t, self.rec, nodes, self.announce)
        info = self.info
        if info is not None and info.status.is_terminal:
            return None  # reported as an attached run's end, exit code too
        if info is None:
            raise JobFailed(f"Slurm does not know job {self.job_id} (squeue, scontrol and sacct "
                            f"do not list it): the run's state is unknown; see `fleet status "
                            f"{self.run_id}`", exit_code=3)
        keep_allocation(self.t, self.rec, info, self.console)
        return Detached(self.run_id, started, nodes, DETACH_WAIT_S, str(self.job_id),
                        info.status is RunStatus.STARTING)

    def events(self) -> Generator[Event, None, None]:
        w = Watch(self.t, self.rec, self.console, announce=self.announce)
        yield from w.events()
        self.info = w.info
        if self.info is None or not self.info.status.is_terminal:
            raise JobFailed(f"fleet lost sight of Slurm job {self.job_id}", exit_code=3)

    def stop(self, by: str, skip: set[str] | None = None) -> dict[str, str]:
        """scancel (srun's --kill-on-bad-exit already ended the other nodes of a failed one:
        the whole job is what fleet cancels), then wait until Slurm says it ended."""
        assert self.job_id is not None
        if StopCause.of(by) is StopCause.WATCHDOG:
            self.console.info(f"{by}: cancelling Slurm job {self.job_id}")
        else:
            self.console.info(f"cancelling Slurm job {self.job_id}")
        try:
            self.cancelled = info = cancel(self.t, self.job_id, self.console)
        except FleetError as e:
            self.problems = {"slurm": reason(e)}
        else:
            self.problems = {} if info is None or info.status.is_terminal else {
                "slurm": f"it is still {info.state} {CANCEL_WAIT_S:g}s after scancel"}
        return self.problems

    def stopped(self, problems: dict[str, str]) -> Stopped:
        info = self.cancelled
        return Stopped(self.run_id, tuple(problems.items()), str(self.job_id),
                       info.state if info else "")

    def forget(self) -> Forgotten:
        if self.submitting:  # sbatch said nothing fleet could read: the job may exist
            return Forgotten("Slurm", self.job.name, self.rec.run_dir)
        with contextlib.suppress(FleetError):
            self.t.run(sh("rm", "-rf", self.rec.run_dir), timeout=60)
        shutil.rmtree(self.record_dir, ignore_errors=True)
        return Forgotten("Slurm")

    def halted(self) -> Stopped:
        return Stopped(self.run_id, tuple(self.problems.items()), str(self.job_id))

    def stacks(self, hung: bool, skip: set[str]) -> tuple[list[str], list[str]]:
        return take_stacks(self.t, self.rec, hung)

    def report(self, outcomes: dict[str, NodeOutcome]) -> Final:
        info = self.info
        assert info is not None
        keep_allocation(self.t, self.rec, info, self.console)
        save(dataclasses.replace(self.rec, final=info.state), self.started_at)
        final, first = report(self.t, self.rec, info, self.console)
        if final is RunStatus.SUCCEEDED:
            return Final(final, f"(Slurm job {self.job_id})")
        if final is RunStatus.STOPPED:
            return Final(final, f": Slurm job {self.job_id} {info.state}")
        return Final(RunStatus.FAILED, f": Slurm job {self.job_id} {info.state}" + (
            f" ({info.reason})" if info.reason and info.reason != "None" else ""),
            tuple(first))

    def tunnel(self) -> Tunnel:
        raise UsageError(NO_DECLARED_FORWARD)

    def close(self) -> None:
        self.t.close()


# Why a job's `forward` is refused on Slurm (`fleet forward RUN PORT` works there).
NO_DECLARED_FORWARD = (
    "the job's `forward` is for host lists: on Slurm the master is known only once the queue "
    "starts the job; once it runs, `fleet forward RUN PORT` forwards through the login node")
