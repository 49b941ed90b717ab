"""The one runner without hosts or a cluster: the guard over a Slurm run (a fake login node), and
`up` with its monitor (fail-fast, the hang watchdog, the final state's exit code) over a fake
run that plays a script of events."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleet import phrases
from fleet.backends.base import Event, Final, NodeEnded, Options, Quiet, Run
from fleet.backends.slurm import jobs
from fleet.backends.slurm import run as slurm_run
from fleet.backends.slurm.cluster import Cluster
from fleet.backends.slurm.jobs import SlurmRecord, save
from fleet.backends.slurm.run import SlurmRun
from fleet.backends.slurm.script import Script
from fleet.config.inventory import Host
from fleet.config.job import Job, Watchdog
from fleet.console import Console
from fleet.errors import (
    ExitCode,
    Interrupted,
    JobFailed,
    RemoteCommandError,
    RunStopped,
    TransportError,
    WriteError,
)
from fleet.facts import slurm as sj
from fleet.lifecycle import runner
from fleet.lifecycle.guard import Guard
from fleet.lifecycle.monitor import Monitor
from fleet.reports import Detached, Forgotten, Stopped
from fleet.run import outcomes as run_outcomes
from fleet.shell import sh
from fleet.states import NodeOutcome, NodeStatus, RunStatus
from fleet.transport import Result
from fleet.transport.sync import SyncStats

S = NodeStatus
DETACHED = Detached("j-1", 3, 3)
JOB_ID = "12"
RUN_ID = "j-20260101-000000-abcd"
RUN_DIR = f"/shared/fleet/runs/{RUN_ID}"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Every run's record under tmp_path; no wait for Slurm longer than a few seconds; and no
    test leaves fleet's signal handlers behind it."""
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(jobs, "CANCEL_WAIT_S", 5.0)
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    yield
    left = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig, handler in before.items():  # one leak must not fail every later test as well
        signal.signal(sig, handler)
    assert left == before


def make_job(tmp_path: Path, hang_timeout: float | None = None) -> Job:
    workdir = tmp_path / "code"
    workdir.mkdir(exist_ok=True)
    (workdir / "t.py").write_text("print('hi')\n")
    job = Job(path=tmp_path / "j.toml", name="j", inventory=tmp_path / "cluster.toml",
              workdir=workdir, script="t.py")
    return dataclasses.replace(job, watchdog=Watchdog(hang_timeout=hang_timeout))


def console() -> Console:
    return Console(out=io.StringIO(), err=io.StringIO())


def said(c: Console) -> str:
    assert isinstance(c.err, io.StringIO)
    return c.err.getvalue()


# ---- the guard over a Slurm run --------------------------------------------------------------
def job_answer(state: str) -> str:
    """What job_script prints for a job in `state`: squeue lists it while it is active, scontrol
    knows it either way, accounting is off (as on many small clusters)."""
    queued = f"{JOB_ID}|{state}|node[1-2]|None\n" if not sj.status_of(state).is_terminal else ""
    return (f"=== squeue\n{queued}=== scontrol\nJobId={JOB_ID} JobName=job UserId=root(0) "
            f"JobState={state} Reason=None ExitCode=0:15 NodeList=node[1-2] BatchHost=node1\n"
            "=== sacct\nsacct: error: Slurm accounting storage is disabled\n=== end\n")


@dataclass
class FakeLogin:
    """The login node, as SlurmRun's transport: records the scripts it is sent and answers
    sbatch, scancel and the job's state as Slurm's clients print them. The job runs until
    scancel; from then on each ask of its state takes the next of `after_cancel` (the last
    one repeats)."""

    host: Host = field(default_factory=lambda: Host(name="login", address="login.example"))
    scripts: list[str] = field(default_factory=list)
    after_cancel: list[str] = field(default_factory=lambda: ["RUNNING", "CANCELLED"])
    scancel: tuple[int, str] = (0, "")
    sbatch: tuple[int, str] = (0, f"Submitted to the cluster\n{JOB_ID}\n")
    lost: bool = False  # the connection is lost: every command raises
    refuse_write: bool = False  # every file written fails (a full disk)
    delay: float = 0.0  # seconds each command takes
    cancelled: bool = False

    def run(self, script: str, timeout: float | None = 60.0, what: str = "") -> Result:
        self.scripts.append(script)
        time.sleep(self.delay)
        if self.lost:
            raise TransportError(f"{self.host.name}: the connection was lost")
        code, out = 0, ""
        if script == sj.cancel_script(JOB_ID):
            code, out = self.scancel
            self.cancelled = self.cancelled or code == 0
        elif script == sj.job_script(JOB_ID):
            state = "RUNNING"
            if self.cancelled:
                state = self.after_cancel.pop(0) if len(self.after_cancel) > 1 \
                    else self.after_cancel[0]
            out = job_answer(state)
        elif "sbatch --parsable" in script:
            code, out = self.sbatch
        return Result(what, code, out, "")

    def write(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.scripts.append(f"write {path}")
        if self.refuse_write:
            raise WriteError(f"{self.host.name}: {path}: No space left on device")

    def path(self, p: str) -> str:
        return p

    def close(self) -> None:
        pass

    # What the guard sent, by kind.
    def cancels(self) -> list[str]:
        return [s for s in self.scripts if s == sj.cancel_script(JOB_ID)]

    def asks(self) -> list[str]:
        return [s for s in self.scripts if s == sj.job_script(JOB_ID)]


def slurm_guard(tmp_path: Path, login: FakeLogin, submitted: bool = True) -> Guard:
    """A prepared Slurm run (its record saved, as prepare leaves it), submitted or not."""
    job = make_job(tmp_path)
    cluster = Cluster(path=tmp_path / "cluster.toml", login=login.host, nodes=2)
    s = Script(code_dir="/shared/fleet/code/j", run_dir=RUN_DIR, run_id=RUN_ID,
               env_file=f"{RUN_DIR}/env.sh")
    rec = SlurmRecord(RUN_ID, str(job.path), login.host, RUN_DIR,
                      job_id=JOB_ID if submitted else None, nproc=1)
    save(rec, time.time())
    c = console()
    return Guard(SlurmRun(login, cluster, job, rec, s, time.time(), c),  # type: ignore[arg-type]
                 c)


def slurm(g: Guard) -> SlurmRun:
    assert isinstance(g.run, SlurmRun)
    return g.run


def no_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """schedule's code sync (tested in test_sync) says everything was there already."""
    monkeypatch.setattr(slurm_run, "sync_dir", lambda *a, **k: SyncStats(0, 0, 1))


def signal_in(delay: float, *sigs: signal.Signals, gap: float = 0.005) -> threading.Thread:
    """A thread that sends this process `sigs`, the first after `delay`, then `gap` apart."""
    def send() -> None:
        time.sleep(delay)
        for i, sig in enumerate(sigs):
            if i:
                time.sleep(gap)
            os.kill(os.getpid(), sig)

    return threading.Thread(target=send)


@pytest.mark.parametrize("where", ["in schedule, after sbatch", "after schedule"])
def test_an_exception_after_submission_cancels_the_job_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The job is submitted by schedule itself; then a write fails (the manifest beside the
    script) or the caller fails: scancel once, then Slurm is asked until the job has ended,
    and no more."""
    no_sync(monkeypatch)
    login = FakeLogin(after_cancel=["RUNNING", "COMPLETING", "CANCELLED"],
                      refuse_write=where != "after schedule")
    g = slurm_guard(tmp_path, login, submitted=False)
    with pytest.raises((WriteError, ValueError)) as e, g:
        slurm(g).schedule(Options())
        raise ValueError("bug")
    assert isinstance(e.value, ValueError if where == "after schedule" else WriteError)
    assert slurm(g).job_id == JOB_ID
    assert len(login.cancels()) == 1
    after = login.scripts[login.scripts.index(sj.cancel_script(JOB_ID)) + 1:]
    assert after == [sj.job_script(JOB_ID)] * 3  # RUNNING, COMPLETING, then CANCELLED: done
    assert "fleet: Slurm job 12 was cancelled (CANCELLED)" in said(g.console)
    assert not any("rm -rf" in s for s in login.scripts)  # the run's directory is kept


def test_two_signals_5ms_apart_end_in_one_complete_cancel(tmp_path: Path) -> None:
    """The second SIGINT arrives while scancel (slow here: 0.2 s a command) is under way and
    must not cut the cancel, or the wait for its end, short."""
    login = FakeLogin(delay=0.2)
    g = slurm_guard(tmp_path, login)
    before = signal.getsignal(signal.SIGINT)
    sender = signal_in(0.2, signal.SIGINT, signal.SIGINT)
    with pytest.raises(Interrupted) as e, g:
        sender.start()
        time.sleep(5)
    sender.join()
    assert [s for s in g.signals if s] == [signal.SIGINT, signal.SIGINT]
    assert login.cancels() == [sj.cancel_script(JOB_ID)]
    assert login.scripts[-1] == sj.job_script(JOB_ID) and login.after_cancel == ["CANCELLED"]
    assert str(e.value) == "interrupted (SIGINT): Slurm job 12 was cancelled (CANCELLED)"
    assert e.value.exit_code == ExitCode.INTERRUPTED
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("login", [
    FakeLogin(scancel=(1, "scancel: error: Kill job error on job id 12: Access/permission "
                          "denied\n")),
    FakeLogin(lost=True),
], ids=["scancel refused", "login node lost"])
def test_an_interrupt_never_claims_a_cancel_that_failed(tmp_path: Path,
                                                        login: FakeLogin) -> None:
    g = slurm_guard(tmp_path, login)
    sender = signal_in(0.05, signal.SIGTERM)
    with pytest.raises(Interrupted) as e, g:
        sender.start()
        time.sleep(5)
    sender.join()
    words = str(e.value)
    assert words.startswith("interrupted (SIGTERM): Slurm job 12 could not be cancelled (")
    assert words.endswith(f"; finish with `fleet stop {RUN_ID}`")
    assert "was cancelled" not in words
    assert ("Access/permission denied" if not login.lost else "connection was lost") in words
    assert len(login.cancels()) == 1 and login.asks() == []


def test_a_cancel_whose_end_is_never_seen_is_not_claimed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "CANCEL_WAIT_S", 0.3)
    login = FakeLogin(after_cancel=["RUNNING"])  # scancel accepted; the job never ends
    g = slurm_guard(tmp_path, login)
    sender = signal_in(0.05, signal.SIGINT)
    with pytest.raises(Interrupted) as e, g:
        sender.start()
        time.sleep(5)
    sender.join()
    assert "still RUNNING" in said(g.console)
    assert "was cancelled" not in str(e.value)


def test_a_refused_sbatch_leaves_nothing_behind(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    no_sync(monkeypatch)
    login = FakeLogin(sbatch=(1, "sbatch: error: Batch job submission failed: Invalid account "
                                 "or account/partition combination specified\n"))
    g = slurm_guard(tmp_path, login, submitted=False)
    assert slurm(g).record_dir.is_dir()
    with pytest.raises(RemoteCommandError, match="Invalid account"), g:
        slurm(g).schedule(Options())
    assert slurm(g).job_id is None
    assert login.cancels() == [] and login.scripts[-1] == sh("rm", "-rf", RUN_DIR)
    assert not slurm(g).record_dir.exists()
    assert "fleet: nothing had been submitted to Slurm" in said(g.console)


def test_nothing_submitted_nothing_cancelled_nothing_kept(tmp_path: Path) -> None:
    login = FakeLogin()
    g = slurm_guard(tmp_path, login, submitted=False)
    assert slurm(g).record_dir.is_dir()
    sender = signal_in(0.05, signal.SIGINT)
    with pytest.raises(Interrupted) as e, g:
        sender.start()
        time.sleep(5)
    sender.join()
    assert str(e.value) == "interrupted (SIGINT): nothing had been submitted to Slurm"
    assert login.scripts == [sh("rm", "-rf", RUN_DIR)]
    assert not slurm(g).record_dir.exists()


def test_an_ended_or_detached_slurm_run_is_left_alone(tmp_path: Path) -> None:
    ended_login, detached_login, late_login = FakeLogin(), FakeLogin(), FakeLogin()
    g = slurm_guard(tmp_path, ended_login)
    with g:
        g.ended = True
    d = slurm_guard(tmp_path, detached_login)
    with d:
        d.released = True
    late = slurm_guard(tmp_path, late_login)  # a signal after the job's end: nothing to cancel
    sender = signal_in(0.05, signal.SIGINT)
    with pytest.raises(Interrupted) as e, late:
        late.ended = True
        sender.start()
        time.sleep(5)
    sender.join()
    assert str(e.value) == "interrupted (SIGINT): the run had already ended"
    assert ended_login.scripts == detached_login.scripts == late_login.scripts == []
    assert slurm(g).record_dir.is_dir()


# ---- the runner and its monitor over a fake run ----------------------------------------------
def ended(name: str, status: NodeStatus, detail: str = "") -> NodeEnded:
    rank = int(name[1:]) - 1
    return NodeEnded(NodeOutcome(name, rank, status, 1 if status is S.FAILED else None,
                                 detail))


class FakeRun(Run):
    """A run whose events are `script`, played in order. Every call the runner makes is
    recorded in `calls`, in order; the events' end (the generator's `finally`) too."""

    def __init__(self, job: Job, record_dir: Path, script: list[Event] | None = None,
                 final: Final | None = None, starts: bool = True,
                 schedule_error: Exception | None = None,
                 says: Detached | None = DETACHED,
                 on_stacks: Any = None, stop_error: Exception | None = None) -> None:
        self.run_id, self.job, self.record_dir = "j-1", job, record_dir
        record_dir.mkdir(parents=True, exist_ok=True)
        self.script = script or []
        self.final = final or Final(RunStatus.SUCCEEDED, "on all 3 node(s)")
        self.starts, self.schedule_error, self.says = starts, schedule_error, says
        self.on_stacks, self.stop_error = on_stacks, stop_error
        self.may_run = False
        self.calls: list[tuple[Any, ...]] = []

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == name]

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]

    def schedule(self, options: Options) -> None:
        self.calls.append(("schedule", options))
        self.may_run = self.starts
        if self.schedule_error is not None:
            raise self.schedule_error

    def started(self) -> bool:
        return self.may_run

    def detached(self) -> Detached | None:
        self.calls.append(("detached",))
        return self.says

    def events(self) -> Generator[Event, None, None]:
        self.calls.append(("events",))
        try:
            yield from self.script
        finally:
            self.calls.append(("events closed",))

    def stop(self, by: str, skip: set[str] | None = None) -> dict[str, str]:
        self.calls.append(("stop", by, skip))
        if self.stop_error is not None:
            e, self.stop_error = self.stop_error, None  # once: the guard's own stop works
            raise e
        return {}

    def forget(self) -> Forgotten:
        self.calls.append(("forget",))
        return Forgotten()

    def stopped(self, problems: dict[str, str]) -> Stopped:
        return Stopped(self.run_id, tuple(problems.items()))

    def stacks(self, hung: bool, skip: set[str]) -> tuple[list[str], list[str]]:
        self.calls.append(("stacks", hung, skip))
        if self.on_stacks is not None:
            self.on_stacks()
        return ["rank 3 is in all_reduce, every other rank in barrier"], ["n2: no py-spy"]

    def halted(self) -> Stopped:
        return Stopped(self.run_id)

    def report(self, outcomes: dict[str, NodeOutcome]) -> Final:
        self.calls.append(("report", outcomes))
        return self.final

    def tunnel(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def close(self) -> None:
        self.calls.append(("close",))


@dataclass
class FakeBackend:
    """Only what `up` asks of a backend: prepare."""

    run: FakeRun | None = None
    error: BaseException | None = None

    def prepare(self, job: Job, console: Console, options: Options) -> FakeRun:
        if self.error is not None:
            raise self.error
        assert self.run is not None
        return self.run


def up(run: FakeRun, options: Options | None = None) -> tuple[str, Console]:
    c = console()
    return runner.up(FakeBackend(run), run.job, c, options), c  # type: ignore[arg-type]


@pytest.mark.parametrize(("first", "by", "skip"), [
    (ended("n2", S.FAILED), "fail-fast: n2 failed", {"n1", "n2"}),
    # A lost node is not known to have ended: it is stopped too, once it answers.
    (ended("n2", S.UNREACHABLE, "no answer for 10s"), "fail-fast: n2 unreachable", {"n1"}),
    (ended("n2", S.STOPPED, "fleet stop"), "fleet stop", {"n1", "n2"}),
])
def test_the_first_failing_node_stops_every_other_once(tmp_path: Path, first: NodeEnded,
                                                       by: str, skip: set[str]) -> None:
    run = FakeRun(make_job(tmp_path), tmp_path / "record",
                  [ended("n1", S.SUCCEEDED), Quiet(1.0), first, ended("n3", S.FAILED),
                   ended("n2", S.FAILED), ended("n3", S.STOPPED)],
                  Final(RunStatus.FAILED))
    with pytest.raises(JobFailed):
        up(run)
    assert run.named("stop") == [("stop", by, skip)]
    (_, outcomes), = run.named("report")
    # The end seen first stands for each node (history); a loss is no end: its later word is.
    n2 = first.outcome.status if first.outcome.status.is_terminal else S.FAILED
    want = {"n1": S.SUCCEEDED, "n2": n2, "n3": S.FAILED}
    assert {n: o.status for n, o in outcomes.items()} == want
    kept = run_outcomes.seen(run.record_dir)  # in the run's record, as fleet saw them
    assert {n: s.outcome.status for n, s in kept.items()} == want
    assert {s.by for s in kept.values()} == {"fleet up"}


def test_nodes_that_succeed_stop_nothing(tmp_path: Path) -> None:
    run = FakeRun(make_job(tmp_path, hang_timeout=30), tmp_path / "record",
                  [ended("n1", S.SUCCEEDED), Quiet(2.0), ended("n2", S.SUCCEEDED),
                   ended("n3", S.SUCCEEDED)])
    run_id, c = up(run)
    assert run_id == "j-1"
    assert run.kinds() == ["schedule", "events", "events closed", "report", "close"]
    assert "fleet: run j-1 succeeded on all 3 node(s)" in said(c)


def test_silence_past_hang_timeout_takes_the_stacks_keeps_them_and_stops(
        tmp_path: Path) -> None:
    run = FakeRun(make_job(tmp_path, hang_timeout=30), tmp_path / "record",
                  [Quiet(5.0), ended("n1", S.SUCCEEDED), Quiet(30.0), Quiet(31.4), Quiet(45.0),
                   ended("n2", S.STOPPED, "watchdog"), ended("n3", S.STOPPED, "watchdog")],
                  Final(RunStatus.STOPPED, " by watchdog"))
    with pytest.raises(JobFailed) as e:
        up(run)
    assert run.named("stacks") == [("stacks", True, {"n1"})]
    assert run.named("stop") == [("stop", "watchdog: no output for 30s (a hang)", {"n1"})]
    saved, = (tmp_path / "record").glob("stacks-*.txt")
    assert saved.read_text().splitlines() == [
        "hang of run j-1: no output for 31s",
        "rank 3 is in all_reduce, every other rank in barrier", "n2: no py-spy"]
    assert str(e.value) == (
        "run j-1 hung: rank 3 is in all_reduce, every other rank in barrier (stacks kept in "
        f"{saved}); it was stopped on every node (logs: `fleet logs j-1`)")
    assert e.value.exit_code == ExitCode.FAILED
    # The watchdog's stop was the teardown: the guard stopped nothing more.
    assert run.kinds()[-4:] == ["stop", "events closed", "report", "close"]


@pytest.mark.parametrize("limit", [0, None])
def test_silence_without_a_hang_timeout_does_nothing(tmp_path: Path,
                                                     limit: float | None) -> None:
    run = FakeRun(make_job(tmp_path, hang_timeout=limit), tmp_path / "record",
                  [Quiet(1e6), ended("n1", S.SUCCEEDED)])
    assert up(run)[0] == "j-1"
    assert run.named("stacks") == run.named("stop") == []
    assert not list((tmp_path / "record").glob("stacks-*"))


@pytest.mark.parametrize(("final", "error", "words", "code"), [
    (Final(RunStatus.STOPPED, " by fleet stop"), RunStopped,
     "run j-1 was stopped by fleet stop", ExitCode.STOPPED),
    (Final(RunStatus.FAILED, ": Slurm job 12 FAILED"), JobFailed,
     "run j-1 failed: Slurm job 12 FAILED (logs: `fleet logs j-1`)", ExitCode.FAILED),
    (Final(RunStatus.UNKNOWN), JobFailed,
     "run j-1 ended in an unknown state: fleet lost sight of a node (logs: `fleet logs j-1`)",
     ExitCode.UNREACHABLE),
])
def test_the_final_state_is_the_exit_code(tmp_path: Path, final: Final,
                                          error: type[Exception], words: str,
                                          code: ExitCode) -> None:
    run = FakeRun(make_job(tmp_path), tmp_path / "record", [ended("n1", S.SUCCEEDED)], final)
    with pytest.raises(error) as e:
        up(run)
    assert str(e.value) == words and e.value.exit_code == code  # type: ignore[attr-defined]
    assert run.named("stop") == [] and run.kinds()[-1] == "close"


def test_an_interrupted_prepare_started_nothing(tmp_path: Path) -> None:
    with pytest.raises(Interrupted) as e:
        runner.up(FakeBackend(error=Interrupted("SIGINT")), make_job(tmp_path),  # type: ignore[arg-type]
                  console())
    assert str(e.value) == "interrupted (SIGINT): nothing had been started on any node"


@pytest.mark.parametrize("starts", [False, True], ids=["before any start", "after a start"])
def test_an_exception_in_schedule_propagates_after_the_teardown(tmp_path: Path,
                                                                starts: bool) -> None:
    run = FakeRun(make_job(tmp_path), tmp_path / "record", starts=starts,
                  schedule_error=ValueError("bug"))
    with pytest.raises(ValueError, match="^bug$"):
        up(run)
    if starts:
        assert run.kinds() == ["schedule", "stop", "close"]
        assert run.named("stop") == [("stop", "fleet up, after an error: ValueError: bug", None)]
    else:
        assert run.kinds() == ["schedule", "forget", "close"]


def test_a_detached_run_is_left_to_itself(tmp_path: Path) -> None:
    run = FakeRun(make_job(tmp_path), tmp_path / "record",
                  says=Detached("j-1", 3, 3, 30.0, "12"))
    run_id, c = up(run, Options(detach=True))
    assert run_id == "j-1"
    assert run.kinds() == ["schedule", "detached", "close"]
    assert ("fleet: run j-1 submitted, every node (3) started; follow it with "
            "`fleet logs -f j-1`") in said(c)


def test_a_detached_run_that_already_ended_is_reported_as_an_attached_one(
        tmp_path: Path) -> None:
    run = FakeRun(make_job(tmp_path), tmp_path / "record", says=None,
                  final=Final(RunStatus.FAILED, ": Slurm job 12 FAILED"))
    with pytest.raises(JobFailed, match="^run j-1 failed: Slurm job 12 FAILED"):
        up(run, Options(detach=True))
    assert run.kinds() == ["schedule", "detached", "report", "close"]  # ended: nothing stopped
    assert run.named("report") == [("report", {})]


def interrupt_here() -> None:
    """A SIGINT that lands while the monitor handles an event."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)


@pytest.mark.parametrize("way", ["the end", "a failing stop", "a signal", "a hang"])
def test_the_events_are_closed_on_every_way_out(tmp_path: Path, way: str) -> None:
    """Before anything else happens (the guard's stop, the report): a backend's events own
    threads and connections that must end first."""
    script: list[Event] = [ended("n1", S.SUCCEEDED), Quiet(40.0), ended("n2", S.FAILED),
                           ended("n3", S.STOPPED), Quiet(1.0)]
    run = FakeRun(make_job(tmp_path, hang_timeout=30 if way in ("a hang", "a signal") else 0),
                  tmp_path / "record", script, Final(RunStatus.FAILED),
                  on_stacks=interrupt_here if way == "a signal" else None,
                  stop_error=RuntimeError("stop broke") if way == "a failing stop" else None)
    expected: type[BaseException] = {"a failing stop": RuntimeError,
                                      "a signal": Interrupted}.get(way, JobFailed)
    with pytest.raises(expected) as e:
        up(run)
    kinds = run.kinds()
    assert kinds.count("events closed") == 1 and kinds[-1] == "close"
    closed = kinds.index("events closed")
    assert "report" not in kinds[:closed]
    if way == "a failing stop":
        # the fail-fast stop raised; the guard's stop came after the events were closed
        assert kinds[closed - 1:] == ["stop", "events closed", "stop", "close"]
        assert run.named("stop")[1][1] == "fleet up, after an error: RuntimeError: stop broke"
    if way == "a signal":
        assert kinds[closed - 1:] == ["stacks", "events closed", "stop", "close"]
        assert run.named("stop") == [("stop", "fleet up, interrupted (SIGINT)", None)]
        assert str(e.value) == "interrupted (SIGINT): the job was stopped on every node"
    if way == "a hang":
        assert str(e.value).startswith("run j-1 hung: ")


def test_a_hang_verdict_never_claims_a_cancel_that_failed(tmp_path: Path) -> None:
    login = FakeLogin(scancel=(1, "scancel: error: Kill job error on job id 12: Access/"
                                  "permission denied\n"))
    g = slurm_guard(tmp_path, login)
    run = slurm(g)
    run.job = make_job(tmp_path, hang_timeout=30)
    with pytest.raises(JobFailed) as e:  # not stopped: the guard's teardown tries again
        Monitor(run, g, g.console).on(Quiet(31.0))  # the stacks: srun answers nothing here
    assert len(login.cancels()) == 1
    assert str(e.value).startswith(f"run {RUN_ID} hung: ") and "was cancelled" not in str(e.value)
    assert "could not be cancelled" in str(e.value)
    assert "was cancelled" not in phrases.halted(run.halted())
