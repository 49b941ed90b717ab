"""`fleet up` (and logs, status, stop, ps) on a Slurm cluster: the same run as on hosts, through
the login node: sync the code to the shared filesystem, submit the sbatch script that `fleet
export slurm` prints (plus a log per node), stream every node's log tagged by node and rank, and
one guard so that every way out (the job's end, an error, Ctrl-C) leaves the Slurm job finished
or cancelled, recorded locally so that `fleet logs/status/stop RUN` find it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from fleet import manifest
from fleet.backends.checks import Check, Status, connection_checks
from fleet.backends.slurm.cluster import Cluster, Script, argv, env_file_text, env_of, nproc, render
from fleet.config.inventory import Host
from fleet.config.job import Job
from fleet.console import Console
from fleet.errors import (
    DamagedRecord,
    FleetError,
    Interrupted,
    JobFailed,
    RemoteCommandError,
    RunStopped,
    UsageError,
)
from fleet.facts import failure, stacks
from fleet.facts import slurm as sj
from fleet.facts.diagnose import diagnose, format_diagnoses
from fleet.facts.probe import probe, python_problem
from fleet.plan import SITE, new_run_id
from fleet.render import NODESIDE
from fleet.run import hang
from fleet.run import record as state
from fleet.run.logs import Tagger
from fleet.run.signals import SignalGuard
from fleet.run.states import RunStatus
from fleet.shell import quote, sh
from fleet.transport import Partial, Transport, open_transport
from fleet.transport.group import reason
from fleet.transport.sync import scan
from fleet.transport.transfer import sync_dir

RECORD = "slurm.json"  # beside run.json in the run's local record
POLL_S = 1.0
CANCEL_WAIT_S = 60.0
DETACH_WAIT_S = 600.0  # how long `fleet up --detach` waits for every node to start


@dataclass(frozen=True)
class SlurmRecord:
    """What later commands need to find a run on Slurm again."""

    run_id: str
    job: str
    login: Host
    run_dir: str  # on the shared filesystem, as the login node sees it
    job_id: str | None = None
    nproc: int | str = 1
    static: bool = True  # ranks known from the node rank (a static rendezvous)
    final: str = ""  # Slurm's last word, once fleet saw the job end


def _record_dir(run_id: str) -> Path:
    return state.state_dir() / run_id


def save(rec: SlurmRecord, started: float) -> None:
    d = _record_dir(rec.run_id)
    try:
        d.mkdir(parents=True, exist_ok=True)
        # A run.json with no host nodes: `fleet ps` lists it; the rest is in slurm.json.
        state.write_atomic(d / "run.json", json.dumps(dataclasses.asdict(state.RunRecord(
            rec.run_id, rec.job, started, ()))) + "\n")
        state.write_atomic(d / RECORD, json.dumps(dataclasses.asdict(rec), indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"cannot record the run in {d}: {e}; set FLEET_STATE_DIR (or "
                         "XDG_STATE_HOME) to a writable directory") from e


def load(rec: state.RunRecord) -> SlurmRecord | None:
    """The Slurm side of a recorded run; None for a run on hosts."""
    path = rec.dir / RECORD
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return SlurmRecord(**{**data, "login": Host(**data["login"])})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedRecord(f"{path}: the record of run {rec.run_id} is damaged ({e})") from e


# ---- facts through the login node ---------------------------------------------------------
def job_info(t: Transport, job_id: str) -> sj.JobInfo | None:
    return sj.parse_job(t.run(sj.job_script(job_id), timeout=60, what="ask Slurm").out, job_id)


def node_infos(t: Transport, run_dir: str) -> dict[str, sj.NodeInfo]:
    return sj.parse_nodes(t.run(sj.nodes_script(run_dir), timeout=60,
                                what="list the nodes' logs").out)


def cancel(t: Transport, job_id: str, console: Console) -> sj.JobInfo | None:
    """scancel, then wait until Slurm says the job ended (its processes are gone then)."""
    r = t.run(sj.cancel_script(job_id), timeout=60, what="scancel")
    if not r.ok:
        raise RemoteCommandError(t.host.name, f"scancel {job_id}", r.code, r.out + r.err)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while True:
        info = job_info(t, job_id)
        if info is None or info.status.is_terminal:
            return info
        if time.monotonic() > deadline:
            console.info(f"Slurm job {job_id} is still {info.state} {CANCEL_WAIT_S:.0f}s "
                         "after scancel")
            return info
        time.sleep(0.5)


# ---- following the nodes' logs ------------------------------------------------------------
class Follower:
    """One log file on the shared filesystem, streamed through the login node from its first
    line; after the job ended, `drain` prints what the stream had not yet delivered."""

    def __init__(self, t: Transport, path: str, on_line: TaggedSink) -> None:
        self.t, self.path, self.on_line = t, path, on_line
        self.count = 0
        self.last = time.monotonic()  # when its last line came (the hang watchdog's clock)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _lines(self, lines: list[str]) -> None:
        with self.lock:
            if self.stop.is_set():
                return
            self.count += sum(not isinstance(line, Partial) for line in lines)  # log lines
            self.last = time.monotonic()
            for line in lines:
                self.on_line(line)

    def _run(self) -> None:
        # exec: the stream's kill reaches tail itself, never leaving it behind
        with contextlib.suppress(FleetError, OSError):
            self.t.stream("exec " + sh("tail", "-n", "+1", "-F", "-s", "0.2", self.path)
                          + " 2>/dev/null", self._lines, self.stop)

    def drain(self) -> None:
        with self.lock:
            self.stop.set()
        self.thread.join(timeout=10)
        r = self.t.run(sh("tail", "-n", f"+{self.count + 1}", self.path) + " 2>/dev/null",
                       timeout=60, what="read the end of a log")
        for line in r.out.splitlines():
            self.on_line(line)


class TaggedSink:
    """A node's lines to the console, tagged `node rN` once its first line said its rank."""

    def __init__(self, console: Console, node: str, index: int, nproc: int | str,
                 static: bool, only_rank: int | None = None) -> None:
        self.console, self.node, self.index = console, node, index
        self.nproc, self.static, self.only_rank = nproc, static, only_rank
        self.tagger: Tagger | None = None
        self.node_rank: int | None = None
        self.shown = 0

    def __call__(self, line: str) -> None:
        if self.tagger is None:
            m = sj.ANNOUNCE.search(line)
            if m:
                self.node_rank = int(m.group(2))
            base = self.node_rank * self.nproc if self.node_rank is not None and \
                self.static and isinstance(self.nproc, int) else None
            self.tagger = Tagger(self.node, base)
        tagged = self.tagger(line)
        if self.only_rank is None or tagged.rank == self.only_rank:
            self.shown += 1
            self.console.line(tagged.tag, self.index, tagged.text)


class Announcer:
    """Says where a job stands while it is not over (PENDING and Slurm's reason, RUNNING and
    its nodes): at the first look, then only when it changes, never once per poll. The job's
    end is for the report to say."""

    def __init__(self, console: Console, job_id: str) -> None:
        self.console, self.job_id = console, job_id
        self.said = ""

    def __call__(self, info: sj.JobInfo | None) -> None:
        if info is None or info.status.is_terminal:
            return
        words = sj.state_words(info)
        if words != self.said:
            self.console.phase("slurm", f"job {self.job_id} is {words}")
            self.said = words


def watch(t: Transport, rec: SlurmRecord, console: Console, follow: bool = True,
          node: str | None = None, rank: int | None = None,
          on_silence: tuple[float, Callable[[float], None]] | None = None,
          announce: Callable[[sj.JobInfo | None], None] | None = None,
          ) -> tuple[sj.JobInfo | None, int]:
    """Print every node's log (and Slurm's own output, tagged `slurm`) from the first line; with
    `follow`, until the job ends, `announce` told of Slurm's every answer on the way.
    `on_silence` = (seconds, call): once the job has run that long without a line from anywhere,
    call(silent seconds), once (the hang watchdog). Returns Slurm's last word on the job and the
    lines shown."""
    followers: dict[str, Follower] = {}
    sinks: dict[str, TaggedSink] = {}

    def add(name: str, path: str) -> None:
        if name in followers or (node is not None and name not in (node, "slurm")):
            return
        if rank is not None and name == "slurm":
            return
        sinks[name] = TaggedSink(console, name, len(sinks), rec.nproc, rec.static, rank)
        followers[name] = Follower(t, path, sinks[name])

    add("slurm", f"{rec.run_dir}/batch.log")
    info = None
    running_since: float | None = None  # a job that waits in the queue is not silent
    try:
        while True:
            info = job_info(t, rec.job_id) if rec.job_id else None
            for name in node_infos(t, rec.run_dir):
                add(name, f"{rec.run_dir}/{name}/node.log")
            if not follow or info is None or info.status.is_terminal:
                break
            if announce is not None:
                announce(info)
            if on_silence is not None and info.status is RunStatus.RUNNING:
                now = time.monotonic()
                running_since = running_since or now
                silent = now - max([running_since, *(f.last for f in followers.values())])
                if silent > on_silence[0]:
                    on_silence[1](silent)
                    on_silence = None
            time.sleep(POLL_S)
        # The nodes whose log appeared while the job ended.
        for name in node_infos(t, rec.run_dir):
            add(name, f"{rec.run_dir}/{name}/node.log")
    finally:
        for f in followers.values():
            f.drain()
    return info, sum(s.shown for s in sinks.values())


# ---- the guard ----------------------------------------------------------------------------
class Guard(SignalGuard):
    """From submission on, every way out that is not the job's own end or a detach cancels the
    Slurm job and waits until Slurm says it ended; the first signal ends the run, any later one
    is only counted so that nothing cuts the cancel short (as lifecycle.Guard on hosts)."""

    def __init__(self, t: Transport, rec: SlurmRecord, console: Console) -> None:
        super().__init__()
        self.t, self.rec, self.console = t, rec, console
        self.job_id: str | None = None
        self.ended = False
        self.released = False

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.hold()
        try:
            if self.ended or (self.released and exc is None):
                return
            if self.job_id is None:
                outcome = "nothing had been submitted to Slurm"
            else:
                self.console.info(f"cancelling Slurm job {self.job_id}")
                try:
                    info = cancel(self.t, self.job_id, self.console)
                    outcome = f"Slurm job {self.job_id} was cancelled" + (
                        f" ({info.state})" if info else "")
                except FleetError as e:
                    outcome = (f"Slurm job {self.job_id} could not be cancelled ({reason(e)}); "
                               f"finish with `fleet stop {self.rec.run_id}`")
            if isinstance(exc, Interrupted):
                raise Interrupted(exc.signame, outcome) from None
            self.console.info(outcome)
        finally:
            self.release_signals()


# ---- fleet up -----------------------------------------------------------------------------
def missing_clients(t: Transport) -> str | None:
    """Why the login node cannot run Slurm's clients, or None."""
    r = t.run("for c in sbatch squeue scontrol scancel srun; do command -v $c >/dev/null || "
              "echo \"missing $c\"; done; true", timeout=30, what="find the Slurm clients")
    missing = [line.split()[1] for line in r.out.splitlines() if line.startswith("missing ")]
    return f"login node {t.host.address}: no {', '.join(missing)} on PATH: is it a Slurm " \
        "login node?" if missing else None


def test_only(t: Transport, run_dir: str) -> tuple[bool, str]:
    """Would Slurm run the script in run_dir (sbatch --test-only: partition, nodes, time,
    account)? And what it said (its last line)."""
    r = t.run(sj.test_script(run_dir, "job.sbatch"), timeout=60, what="sbatch --test-only")
    return r.ok, (r.out.strip().splitlines() or ["sbatch --test-only said nothing"])[-1]


def preflight(t: Transport, run_dir: str, console: Console) -> None:
    """What can be checked before submitting: the Slurm clients on the login node, and
    whether Slurm would accept the request. (On the nodes the script checks python and torch
    itself, before anything starts.)"""
    why = missing_clients(t)
    if why:
        raise UsageError(why)
    ok, said = test_only(t, run_dir)
    if not ok:
        raise UsageError(f"Slurm would not run the job: {said}")
    console.phase("slurm", "preflight: sbatch --test-only accepts the request")


def checks(cluster: Cluster, job: Job) -> list[Check]:
    """`fleet check` on a Slurm cluster: the login node (connection, shell, Slurm's clients,
    the workdir), Slurm's answer to the request, and the python there. Nothing is submitted:
    the script goes to a scratch directory, removed at the end."""
    assert cluster.login is not None and cluster.workdir is not None
    try:
        t = open_transport(cluster.login)
    except FleetError as e:
        return [Check("login", "ssh", Status.FAIL, reason(e))]
    with t:
        out = connection_checks(t)
        why = missing_clients(t)
        out.append(Check("login", "slurm clients", Status.FAIL if why else Status.PASS,
                         why or "sbatch, squeue, scontrol, scancel, srun"))
        scratch = f"{t.path(cluster.workdir).rstrip('/')}/runs/.check-{secrets.token_hex(4)}"
        s = Script(code_dir=f"{t.path(cluster.workdir).rstrip('/')}/code/{job.slot}",
                   run_dir=scratch, run_id="check", env_file=f"{scratch}/env.sh")
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


def up(cluster: Cluster, job: Job, console: Console, detach: bool = False,
       checks: bool = True) -> str:
    """Run the job on the cluster; returns the run id, or raises JobFailed, RunStopped or
    Interrupted, each saying what was left where."""
    assert cluster.login is not None and cluster.workdir is not None
    run_id = new_run_id(job.name)
    console.hosts(["slurm", "login"])
    console.info(f"run {run_id}: {job.name} on Slurm, {cluster.nodes} node(s) through "
                 f"{cluster.login.address}")
    with open_transport(cluster.login) as t:
        workdir = t.path(cluster.workdir).rstrip("/") or "/"
        run_dir = f"{workdir}/runs/{run_id}"
        code_dir = f"{workdir}/code/{job.slot}"
        data_dir = f"{workdir}/data/{job.data_slot}" if job.data_slot else None
        s = Script(code_dir=code_dir, data_dir=data_dir, run_dir=run_dir, run_id=run_id,
                   env_file=f"{run_dir}/env.sh")
        text = render(job, cluster, s)
        rec = SlurmRecord(run_id, str(job.path), cluster.login, run_dir,
                          nproc=nproc(job, cluster), static=job.rendezvous.backend == "static")
        t.run(sh("mkdir", "-p", f"{run_dir}/{SITE}"), timeout=60,
              what="make the run directory").check(t.host.name)
        t.write(f"{run_dir}/env.sh", env_file_text(job, cluster, s).encode(), 0o600)
        # fleet's sitecustomize: each worker's rank and stack dump (fleet dump, the watchdog)
        t.write(f"{run_dir}/{SITE}/sitecustomize.py",
                (NODESIDE / "sitecustomize.py").read_bytes(), 0o644)
        t.write(f"{run_dir}/job.sbatch", text.encode(), 0o700)
        if checks:
            try:
                preflight(t, run_dir, console)
            except FleetError:
                t.run(sh("rm", "-rf", run_dir), timeout=60)
                raise
        started = time.time()
        save(rec, started)
        stats = sync_dir(t, t.host.python, scan(job.workdir, job.exclude), code_dir, rec.run_id,
                         console)
        console.phase("login", f"code: {stats.files} file(s) sent, {stats.unchanged} unchanged "
                               f"({code_dir})")
        if job.data is not None and data_dir is not None:
            stats = sync_dir(t, t.host.python, scan(job.data, ()), data_dir, rec.run_id,
                             console)
            console.phase("login", f"data: {stats.files} file(s) sent")
        hung: list[str] = []
        with Guard(t, rec, console) as guard:
            r = t.run(sj.submit_script(run_dir, "job.sbatch"), timeout=60, what="sbatch")
            job_id = sj.parse_submit(r.out) if r.ok else None
            if job_id is None:
                raise RemoteCommandError(t.host.name, "sbatch", r.code, r.out + r.err)
            guard.job_id = job_id
            rec = dataclasses.replace(rec, job_id=job_id)
            save(rec, started)
            console.phase("slurm", f"submitted job {job_id} ({cluster.nodes} node(s), "
                                   "srun --kill-on-bad-exit=1)")
            m = manifest.record_slurm(
                job, cluster, run_id, job_id, f"{run_dir}/job.sbatch",
                env_of(job, cluster, s.run_id, s.data_dir),
                [w for group in argv(job, cluster, s) for w in group], _record_dir(run_id))
            t.write(f"{run_dir}/manifest.json", manifest.dumps(m).encode(), 0o600)
            announce = Announcer(console, job_id)
            if detach:
                info, started_nodes = wait_started(t, rec, cluster.nodes, announce)
                # A job that already ended is reported as an attached run's end, exit code too.
                guard.ended = info is not None and info.status.is_terminal
                guard.released = not guard.ended
            else:
                watchdog = None
                if job.watchdog.hang_timeout:
                    watchdog = (job.watchdog.hang_timeout,
                                lambda silent: hung.append(on_hang(t, rec, job, silent,
                                                                   console)))
                info, _ = watch(t, rec, console, on_silence=watchdog, announce=announce)
                guard.ended = info is not None and info.status.is_terminal
                if not guard.ended:
                    raise JobFailed(f"fleet lost sight of Slurm job {job_id}", exit_code=3)
        if info is not None:
            keep_allocation(t, rec, info, console)
        if guard.released:
            if info is None:
                raise JobFailed(f"Slurm does not know job {job_id} (squeue, scontrol and sacct "
                                f"do not list it): the run's state is unknown; see `fleet "
                                f"status {run_id}`", exit_code=3)
            if info.status is RunStatus.STARTING:
                where = f"Slurm job {job_id} had not started after {DETACH_WAIT_S:.0f}s"
            elif started_nodes < cluster.nodes:
                where = (f"{started_nodes} of {cluster.nodes} node(s) had started after "
                         f"{DETACH_WAIT_S:.0f}s")
            else:
                where = f"every node ({cluster.nodes}) started"
            console.info(f"run {run_id} submitted, {where}; follow it with `fleet logs -f "
                         f"{run_id}`")
            return run_id
        assert info is not None
        save(dataclasses.replace(rec, final=info.state), started)
        final = report(t, rec, info, console)
    if hung:
        raise JobFailed(f"run {run_id} hung: {hung[0]}; Slurm job {job_id} was cancelled "
                        f"(logs: `fleet logs {run_id}`)")
    if final is RunStatus.SUCCEEDED:
        console.info(f"run {run_id} succeeded (Slurm job {job_id})")
        return run_id
    if final is RunStatus.STOPPED:
        raise RunStopped(f"run {run_id} was stopped: Slurm job {job_id} {info.state}")
    raise JobFailed(f"run {run_id} failed: Slurm job {job_id} {info.state}"
                    + (f" ({info.reason})" if info.reason and info.reason != "None" else "")
                    + f" (logs: `fleet logs {run_id}`)")


# ---- the manifest: the nodes, once Slurm ran the job ---------------------------------------
def allocation(t: Transport, rec: SlurmRecord, m: dict[str, Any],
               info: sj.JobInfo | None) -> dict[str, Any]:
    """The run's manifest with the nodes Slurm ran it on, each node's rank (its log's first
    line) and versions (the script's preflight), as far as they are known now."""
    log = t.run(sj.preflight_script(rec.run_dir), timeout=60,
                what="read the preflight's lines").out
    entries = sj.node_entries(node_infos(t, rec.run_dir), log, rec.nproc)
    # Slurm forgetting the job (None) means it ended long ago: nothing more will come.
    complete = info is None or info.status.is_terminal
    return manifest.with_allocation(m, info.nodes if info else "",
                                    info.state if info else rec.final, entries, complete)


def keep_allocation(t: Transport, rec: SlurmRecord, info: sj.JobInfo,
                    console: Console) -> None:
    """Record in the manifest (here and beside the script) what allocation() knows now; a
    failure is said, never the run's end."""
    path = _record_dir(rec.run_id) / "manifest.json"
    try:
        m = allocation(t, rec, json.loads(path.read_text()), info)
        state.write_atomic(path, manifest.dumps(m))
        t.write(f"{rec.run_dir}/manifest.json", manifest.dumps(m).encode(), 0o600)
    except (FleetError, OSError, ValueError) as e:
        console.info(f"the manifest of run {rec.run_id} ({path}) lacks the job's nodes: "
                     f"{reason(e) if isinstance(e, FleetError) else e}")


def manifest_of(rec: state.RunRecord, on_slurm: SlurmRecord,
                console: Console) -> dict[str, Any] | None:
    """A Slurm run's manifest for `fleet show`/`fleet diff`; where it was recorded before the
    job ended (a detached run), the nodes are asked for through the login node first. None
    for a run never submitted."""
    path = rec.dir / "manifest.json"
    try:
        m: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise DamagedRecord(f"{path}: cannot be read ({e})") from e
    if m.get("slurm", {}).get("complete") or on_slurm.job_id is None:
        return m
    try:
        with open_transport(on_slurm.login) as t:
            m = allocation(t, on_slurm, m, job_info(t, on_slurm.job_id))
            state.write_atomic(path, manifest.dumps(m))
            t.write(f"{on_slurm.run_dir}/manifest.json", manifest.dumps(m).encode(), 0o600)
    except (FleetError, OSError) as e:
        console.info(f"run {rec.run_id}: the login node could not be asked for the job's "
                     f"nodes ({reason(e) if isinstance(e, FleetError) else e}); shown as "
                     "recorded")
    return m


def on_hang(t: Transport, rec: SlurmRecord, job: Job, silent: float, console: Console) -> str:
    """No node printed for hang_timeout: take every rank's stack, say which rank is different,
    keep it, cancel the job (as the watchdog does on hosts); returns the verdict."""
    limit = job.watchdog.hang_timeout
    console.info(f"hang: no node has printed anything for {silent:.0f}s (hang_timeout = "
                 f"{limit:g}s); taking every rank's stack")
    lines, problems = take_stacks(t, rec, hung=True)
    for line in lines + problems:
        console.info(f"  {line}")
    saved = hang.save(_record_dir(rec.run_id), f"hang of run {rec.run_id}: no output for "
                      f"{silent:.0f}s", lines + problems)
    console.info(f"watchdog: no output for {limit:g}s (a hang): cancelling Slurm job "
                 f"{rec.job_id}")
    assert rec.job_id is not None
    cancel(t, rec.job_id, console)
    return f"{lines[0] if lines else 'no stack could be taken'} (stacks kept in {saved})"


def take_stacks(t: Transport, rec: SlurmRecord,
                hung: bool = False) -> tuple[list[str], list[str]]:
    """Every rank's stack on every node of the running job, through a job step on each node
    (slurmjob.step_script: no SSH to the nodes needed), reported as on hosts (fleet.facts.stacks).
    (the report's lines, problems) The NCCL flight recorder is refused on Slurm (check_job)."""
    assert rec.job_id is not None
    r = t.run(sj.step_script(rec.job_id, rec.run_dir, stacks.dump_script(".", rec.run_id)),
              timeout=sj.STEP_TIMEOUT_S + 30, what="take the stacks (srun --overlap)")
    outs, other = sj.parse_step(r.out)
    if not outs:
        return [], [f"no node of Slurm job {rec.job_id} could be asked (srun exit {r.code}): "
                    + (" / ".join(other[-3:]) or "it printed nothing")]
    return stacks.report([stacks.parse_dump(name, out) for name, out in sorted(outs.items())],
                         hung), []


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


def wait_started(t: Transport, rec: SlurmRecord, nodes: int,
                 announce: Callable[[sj.JobInfo | None], None],
                 timeout: float = DETACH_WAIT_S) -> tuple[sj.JobInfo | None, int]:
    """Until every node has started its part of the job (its log's first line: the script's
    preflight passed there), or the job ended, or `timeout` passed (Slurm keeping the job
    pending, a node slow to start); `announce` told of Slurm's every answer on the way.
    Returns Slurm's last word and how many nodes had started."""
    assert rec.job_id is not None
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(t, rec.job_id)
        announce(info)
        running = info is not None and info.status is RunStatus.RUNNING
        started = len(node_infos(t, rec.run_dir)) if running else 0
        if info is None or info.status.is_terminal or started >= nodes or \
                time.monotonic() > deadline:
            return info, started
        time.sleep(0.5)


def report(t: Transport, rec: SlurmRecord, info: sj.JobInfo, console: Console) -> RunStatus:
    """Per node how it ended; for a failure the first failing rank, its traceback and the
    hints for known failures; which nodes Slurm ended as a consequence."""
    nodes = node_infos(t, rec.run_dir)
    log = t.run(sh("tail", "-n", "200", f"{rec.run_dir}/batch.log") + " 2>/dev/null",
                timeout=60).out
    cancelled = info.status is RunStatus.STOPPED
    # A node failed by itself where it ended non-zero without Slurm signalling it; srun's own
    # verdicts ("Exited with exit code") stand in for a node that recorded no exit code.
    said = {e.node for e in sj.parse_srun(log) if e.by_itself}
    failed = [n for n in nodes.values() if not n.signalled and not cancelled and
              (n.code not in (0, None) or (n.code is None and n.name in said))]
    for n in sorted(nodes.values(), key=lambda n: (n.node_rank is None, n.node_rank, n.name)):
        if n.code == 0:
            words = "succeeded (exit 0)"
        elif n in failed:
            words = f"failed (exit {n.code})"
        elif cancelled:
            words = f"stopped by scancel (exit {n.code})" if n.code is not None else \
                "stopped by scancel"
        else:
            words = "stopped by Slurm (fail-fast: srun --kill-on-bad-exit)" + (
                f" (exit {n.code})" if n.code is not None else "")
        console.phase(n.name, f"node rank {n.node_rank if n.node_rank is not None else '?'}: "
                              f"{words}")
    console.phase("slurm", f"job {info.job_id} {info.state}"
                  + (f", exit code {info.exit_code}" if info.exit_code is not None else ""))
    if info.status is not RunStatus.FAILED:
        return info.status
    causes = []
    for n in failed:
        with contextlib.suppress(FleetError):
            found = failure.explain(t, n.name, n.node_rank or 0, f"{rec.run_dir}/{n.name}")
            if found is not None:
                causes.append(found)
    root = failure.first(causes)
    refused = sj.parse_preflight(log)
    if refused and not nodes:
        console.info("preflight failed: nothing of the job started on any node")
        for name, why in sorted(refused.items()):
            console.phase(name, why)
    elif root is not None:
        for line in failure.summary(root):
            console.info(line)
    else:
        tail = "\n".join(log.strip().splitlines()[-10:])
        console.info(f"first failure: no node's error report found; Slurm's output ends:\n{tail}")
        for line in format_diagnoses(diagnose(log)):
            console.info(line)
    collateral = [n.name for n in nodes.values() if n not in failed and n.code != 0]
    if collateral:
        console.info("stopped as a consequence (srun --kill-on-bad-exit): "
                     + ", ".join(collateral))
    return info.status


# ---- the run commands ---------------------------------------------------------------------
def stop(rec: SlurmRecord, console: Console) -> None:
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


def remove(rec: SlurmRecord) -> str:
    with open_transport(rec.login) as t:
        info = job_info(t, rec.job_id) if rec.job_id else None
        if info is not None and not info.status.is_terminal:
            raise UsageError(f"Slurm job {rec.job_id} is still {info.state}: stop it first")
        t.run(sh("rm", "-rf", rec.run_dir), timeout=60, what=f"remove {rec.run_dir}"
              ).check(t.host.name)
    return quote(rec.run_dir)
