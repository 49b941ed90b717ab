"""What a Kubernetes backend would implement, written as a stub of the seam (not product code):
a test-only backend that takes the launch role alone is driven by the one runner (prepare,
schedule, events, report), and every other verb is refused with the one Unsupported. The roles'
abstract methods are listed here, so the seam's width is visible and a change to it is seen."""

from __future__ import annotations

import inspect
import io
import signal
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from fleet import backends
from fleet.backends.base import VERBS, Event, Final, NodeEnded, Quiet, Run
from fleet.backends.hosts.backend import HostsBackend
from fleet.backends.slurm.backend import SlurmBackend
from fleet.config.job import Job, load_job
from fleet.config.select import Selection
from fleet.console import Console
from fleet.errors import ExitCode, JobFailed, Unsupported
from fleet.events import Collected, Phase, Step, Verdict
from fleet.lifecycle import runner
from fleet.reports import Detached, Forgotten, Stopped
from fleet.states import NodeOutcome, NodeStatus, RunStatus, overall
from fleet.transport.forward import Tunnel

# The seam's width: what a backend must write for each role it takes. Before the roles, every
# backend wrote Backend's 16 and Run's 12 (28), Slurm answering 8 of them with refusals.
LAUNCH = {"prepare", "checks"}
RECORDED = {"describe", "state", "cancel", "logs", "dump", "delete", "tunnel", "manifest"}
LAB_TOOLS = {"survey", "lease", "execute", "trust_inventory", "pin_keys"}
RUN = {"schedule", "started", "detached", "events", "stop", "forget", "stopped", "stacks",
       "halted", "report", "tunnel", "close"}


def test_each_role_names_what_it_requires() -> None:
    assert backends.Backend.__abstractmethods__ == frozenset()  # each verb refused by default
    assert backends.Launch.__abstractmethods__ == LAUNCH
    assert backends.Recorded.__abstractmethods__ == RECORDED
    assert backends.LabTools.__abstractmethods__ == LAB_TOOLS
    assert Run.__abstractmethods__ == RUN
    # A backend that only launches writes 2 + 12 = 14 methods (28 before).
    assert len(LAUNCH | {f"Run.{m}" for m in RUN}) == 14
    # Every verb of the seam is a role's or an optional one, and each has its user's words;
    # `spares` and `take_healed` answer for every backend (none, nothing to take in).
    optional = ("refuse", "spares", "take_healed")
    assert set(VERBS) == {n for n, f in vars(backends.Backend).items()
                          if inspect.isfunction(f) and n not in optional}
    assert set(VERBS) >= LAUNCH | RECORDED | LAB_TOOLS


def test_the_real_backends_take_their_roles() -> None:
    assert isinstance(HostsBackend(), backends.Launch | backends.Recorded | backends.LabTools)
    assert {r for r in backends.ROLES if issubclass(HostsBackend, r)} == set(backends.ROLES)
    assert {r for r in backends.ROLES if issubclass(SlurmBackend, r)} == {
        backends.Launch, backends.Recorded}
    # The registry is keyed by the kind each backend says it is.
    for kind in backends.BackendKind:
        assert backends.named(kind).kind is kind


# ---- the stub: what a Kubernetes backend would be ---------------------------------------------
class KubeRun(Run):
    """Two pods, each its node: scheduled at once, ended as `ends` says."""

    def __init__(self, job: Job, record_dir: Path, calls: list[str],
                 ends: dict[str, NodeStatus]) -> None:
        self.run_id, self.record_dir, self.job = "kube-1", record_dir, job
        self.calls, self.ends = calls, ends
        self._started = False

    def schedule(self, options: backends.Options) -> None:
        self.calls.append("schedule")  # a real one: kubectl apply of a JobSet
        self._started = True

    def started(self) -> bool:
        return self._started

    def detached(self) -> Detached | None:
        return Detached(self.run_id, len(self.ends), len(self.ends))  # the pods run on

    def events(self) -> Generator[Event, None, None]:
        self.calls.append("events")  # a real one: the pods' watch stream
        yield Quiet(0.0)
        for rank, (pod, status) in enumerate(self.ends.items()):
            yield NodeEnded(NodeOutcome(pod, rank, status, 0 if status is NodeStatus.SUCCEEDED
                                        else 1))

    def stop(self, by: str, skip: set[str] | None = None) -> dict[str, str]:
        self.calls.append(f"stop by {by}")
        return {}

    def forget(self) -> Forgotten:
        return Forgotten()  # nothing was applied

    def stopped(self, problems: dict[str, str]) -> Stopped:
        return Stopped(self.run_id, tuple(problems.items()))  # every pod deleted

    def stacks(self, hung: bool, skip: set[str]) -> tuple[list[str], list[str]]:
        return [], []

    def halted(self) -> Stopped:
        return Stopped(self.run_id)

    def report(self, outcomes: dict[str, NodeOutcome]) -> Final:
        self.calls.append("report")
        return Final(overall(o.status for o in outcomes.values()), f" on {len(outcomes)} pods")

    def tunnel(self) -> Tunnel:
        raise Unsupported("kubernetes", "forward")

    def close(self) -> None:
        self.calls.append("close")


class KubeBackend(backends.Launch):
    """The launch role alone: recorded runs and the lab's tools are refused, uniformly."""

    kind = "kubernetes"  # type: ignore[assignment]  # not a kind fleet has: a stub

    def __init__(self, record_dir: Path, ends: dict[str, NodeStatus]) -> None:
        self.record_dir, self.ends, self.calls = record_dir, ends, []

    def prepare(self, job: Job, console: Console, options: backends.Options) -> KubeRun:
        self.calls.append("prepare")
        return KubeRun(job, self.record_dir, self.calls, self.ends)

    def checks(self, job: Job, collective: bool, progress: Callable[[str], None],
               trust: str) -> list[backends.Check]:
        return [backends.Check("cluster", "kubectl", backends.Status.PASS, "v1.31")]


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Job:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "inv.toml").write_text('[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n')
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.toml").write_text('inventory = "inv.toml"\nscript = "train.py"\n')
    (tmp_path / "record").mkdir()
    return load_job(tmp_path / "job.toml")


def quiet() -> Console:
    return Console(out=io.StringIO(), err=io.StringIO())


def test_the_runner_drives_a_launch_only_backend(job: Job, tmp_path: Path) -> None:
    kube = KubeBackend(tmp_path / "record", {"pod-0": NodeStatus.SUCCEEDED,
                                             "pod-1": NodeStatus.SUCCEEDED})
    seen = Collected()
    console = Console(out=io.StringIO(), err=io.StringIO(), sink=seen)
    assert runner.up(kube, job, console, backends.Options()) == "kube-1"
    assert kube.calls == ["prepare", "schedule", "events", "report", "close"]
    # The runner's own phases, in order, whatever the backend (which may add its own steps
    # inside scheduling: SSH hosts say uploading, setup, starting).
    steps = [e.step for e in seen.events if isinstance(e, Phase)]
    assert steps == [Step.PREPARING, Step.SCHEDULING, Step.RUNNING, Step.REPORTING], steps
    assert isinstance(seen.events[-1], Verdict) and seen.events[-1].status is RunStatus.SUCCEEDED


def test_the_runner_fails_fast_for_it(job: Job, tmp_path: Path) -> None:
    """What is the same for every backend is the runner's: a pod that fails stops the rest."""
    kube = KubeBackend(tmp_path / "record", {"pod-0": NodeStatus.FAILED,
                                             "pod-1": NodeStatus.SUCCEEDED})
    with pytest.raises(JobFailed) as e:
        runner.up(kube, job, quiet(), backends.Options())
    assert e.value.exit_code == ExitCode.FAILED and "run kube-1 failed on 2 pods" in str(e.value)
    assert kube.calls[:3] == ["prepare", "schedule", "events"]
    assert any(c.startswith("stop by ") for c in kube.calls) and kube.calls[-1] == "close"


def dummy(verb: Callable[..., Any]) -> list[Any]:
    return [None] * (len(inspect.signature(verb).parameters))


@pytest.mark.parametrize("verb", sorted(set(VERBS) - LAUNCH))
def test_every_other_verb_is_refused_alike(verb: str, tmp_path: Path) -> None:
    kube = KubeBackend(tmp_path, {})
    method = getattr(kube, verb)
    with pytest.raises(Unsupported) as e:
        method(*dummy(method))
    assert str(e.value) == f"the kubernetes backend does not support {VERBS[verb]}"
    assert e.value.exit_code == ExitCode.BAD_INPUT == 2
    assert kube.spares(tmp_path) == []  # no spares: not a refusal (a restart finds none)


def test_the_cli_says_the_refusal(job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Through the real command (in-process): the refusal, its exit code, nothing on stdout."""
    from fleet import cli

    monkeypatch.setattr(backends, "for_inventory", lambda path: KubeBackend(tmp_path, {}))
    monkeypatch.setattr(sys, "argv", ["fleet", "gpus", str(tmp_path / "inv.toml")])
    kept = {sig: signal.getsignal(sig) for sig in cli.SIGNALS}
    try:
        with pytest.raises(SystemExit) as e:
            cli.main()
    finally:  # main leaves its own handlers behind: this process is pytest's
        for sig, handler in kept.items():
            signal.signal(sig, handler)
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    assert err == "fleet: error: the kubernetes backend does not support fleet gpus\n"


def test_slurm_refuses_with_what_to_do_instead(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[slurm]\nlogin = "hpc.example.org"\nnodes = 2\n')
    slurm = backends.for_inventory(cluster)
    with pytest.raises(Unsupported, match=r"^the slurm backend does not support fleet exec: it "
                                          "runs on the hosts of a host list only"):
        slurm.execute(cluster, None, ["hostname"], Selection(), None)
    with pytest.raises(Unsupported, match=r"^the slurm backend does not support stopping one "
                                          "node's part of a run$"):
        slurm.stop_part(None, "n1", "fleet up")  # type: ignore[arg-type]
    assert slurm.spares(cluster) == []
    assert RunStatus.SUCCEEDED.exit_code == 0


def test_a_record_naming_an_unknown_backend_is_damaged(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """RunRecord.backend is a BackendKind: a word fleet does not know is a damaged record,
    named by its file, in `load` and in the list `ps` reads."""
    import json

    from fleet.config.inventory import BackendKind, TransportKind
    from fleet.errors import DamagedRecord
    from fleet.run import record

    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    tmp_path = tmp_path / "runs"
    host = {"name": "a", "address": "10.0.0.1", "transport": "ssh"}
    good = {"run_id": "r1", "job": "j", "started": 1.0, "backend": "hosts",
            "nodes": [{"host": host, "node_rank": 0, "run_dir": "/x", "rank_base": 0}]}
    for run_id, data in (("r1", good), ("r2", {**good, "run_id": "r2", "backend": "k8s"})):
        (tmp_path / run_id).mkdir(parents=True)
        (tmp_path / run_id / "run.json").write_text(json.dumps(data))
    rec = record.load("r1")
    assert rec.backend is BackendKind.HOSTS and rec.nodes[0].host.transport is TransportKind.SSH
    path = tmp_path / "r2" / "run.json"
    with pytest.raises(DamagedRecord, match=f"^{path}: run r2 names a backend fleet does not "
                                            "know \\('k8s'\\)$"):
        record.load("r2")
    runs, damaged = record.all_runs()
    assert [r.run_id for r in runs] == ["r1"] and "'k8s'" in damaged[str(path)]
    (tmp_path / "r1" / "run.json").write_text(json.dumps(
        {**good, "nodes": [{**good["nodes"][0], "host": {**host, "transport": "rsh"}}]}))
    with pytest.raises(DamagedRecord, match="r1/run.json: the record of run r1 is damaged"):
        record.load("r1")


def test_ps_says_the_typed_state_in_the_words_it_always_had() -> None:
    """The seam answers `ps` with data (Seen); the CLI says it, as before the seam was typed."""
    from fleet.lifecycle.answers import words

    assert words(backends.Seen(RunStatus.RUNNING)) == "running"
    assert words(backends.Seen(RunStatus.NEVER_STARTED)) == "never started"
    assert words(backends.Seen(RunStatus.RUNNING, by="slurm")) == "running (slurm)"
    assert words(backends.Seen(RunStatus.UNKNOWN, why="a: timed out")) == \
        "unknown (a: timed out)"
