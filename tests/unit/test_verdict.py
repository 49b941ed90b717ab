"""The laptop's record is the history: a run's verdict is read strictly (fleet.run.verdict), the
first one kept stands, the parts never seen to end are named (fleet.lifecycle.history), and
`status`/`ps` answer a finished run from the record without asking any host, while a live run's
silent host is said unreachable within the bound (fleet.backends.hosts.recorded.ask)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleet.config.inventory import Host
from fleet.errors import DamagedRecord
from fleet.lifecycle import attempts, history
from fleet.run import outcomes, verdict
from fleet.run import record as state
from fleet.run.verdict import Lost, Verdict
from fleet.states import NodeOutcome, NodeStatus, RunStatus
from tests.conftest import InProcessCLI

V = Verdict(RunStatus.SUCCEEDED, 0, "fleet up", 1700000000.5, "run r succeeded in 3s",
            (Lost(1, "r", "n2"),))


def test_a_verdict_reads_back_as_it_was_written() -> None:
    assert verdict.parse(verdict.dumps(V)) == V


@pytest.mark.parametrize("change", [
    {"status": "running"},  # no end
    {"status": "won"},
    {"code": "0"}, {"code": True}, {"code": 300},
    {"at": "yesterday"},
    {"by": 3},
    {"lost": {"n2": 1}},
    {"lost": [{"attempt": 0, "run_id": "r", "node": "n2"}]},
    {"lost": [{"attempt": 1, "run_id": "../x", "node": "n2"}]},
    {"lost": [{"attempt": 1, "run_id": "r", "node": ""}]},
    {"lost": ["n2"]},
])
def test_a_damaged_verdict_is_refused(change: dict[str, object]) -> None:
    data = {**verdict.as_json(V), **change}
    with pytest.raises((ValueError, KeyError, TypeError)):
        verdict.parse(json.dumps(data))


def test_a_damaged_file_names_its_path(tmp_path: Path) -> None:
    (tmp_path / verdict.FILE).write_text("{not json")
    with pytest.raises(DamagedRecord, match=str(tmp_path / verdict.FILE)):
        verdict.read(tmp_path)
    (tmp_path / verdict.FILE).write_text("[]")
    with pytest.raises(DamagedRecord, match="verdict is damaged"):
        verdict.read(tmp_path)


def test_the_first_verdict_stands(tmp_path: Path) -> None:
    assert verdict.read(tmp_path) is None
    assert verdict.record(tmp_path, V) == V
    later = dataclasses.replace(V, status=RunStatus.STOPPED, code=4, by="fleet stop")
    assert verdict.record(tmp_path, later) == V
    assert verdict.read(tmp_path) == V
    gone = tmp_path / "gone"
    assert verdict.record(gone, V) == V and not gone.exists()


# ---- a run recorded here, on hosts that are never reached --------------------------------------

def save(run_id: str, nodes: tuple[str, ...], parent: str = "") -> state.RunRecord:
    rec = state.RunRecord(run_id, "job.toml", time.time(), tuple(
        state.NodeRecord(Host(n, "192.0.2.1", connect_timeout=30), i, f"/r/{run_id}/{n}", i, 1)
        for i, n in enumerate(nodes)), parent=parent)
    rec.dir.mkdir(parents=True)
    state.write_atomic(rec.dir / "run.json", json.dumps(dataclasses.asdict(rec)) + "\n")
    return rec


def ended(rec: state.RunRecord, node: str, status: NodeStatus, code: int) -> None:
    rank = next(n.node_rank for n in rec.nodes if n.host.name == node)
    outcomes.note(rec.dir, NodeOutcome(node, rank, status, code), "fleet up")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InProcessCLI:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / ".fleet"))
    return InProcessCLI(tmp_path)


class Asked(list[str]):
    """The hosts fleet would connect to (none is: each one asked stays silent until the test
    releases it, or for 30 s, longer than any bound); `answered` is set once a silent host's
    question has returned."""

    def __init__(self) -> None:
        super().__init__()
        self.release, self.answered = threading.Event(), threading.Event()


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> Iterator[Asked]:
    seen = Asked()

    def on_nodes(rec: state.RunRecord, fn: object, only: set[str] | None = None,
                 wait: object = None) -> dict[str, object]:
        names = [n.host.name for n in rec.nodes if only is None or n.host.name in only]
        seen.extend(names)
        seen.release.wait(30)
        seen.answered.set()
        return {}

    monkeypatch.setattr("fleet.backends.hosts.recorded.on_nodes", on_nodes)
    monkeypatch.setattr("fleet.backends.hosts.recorded.ASK_S", 0.5)
    yield seen
    seen.release.set()


def test_a_finished_run_is_said_from_its_record_whatever_host_is_down(
        cli: InProcessCLI, asked: Asked) -> None:
    rec = save("r", ("n1", "n2"))
    ended(rec, "n2", NodeStatus.SUCCEEDED, 0)  # n1, the master, was never seen to end
    assert history.keep("r", RunStatus.SUCCEEDED, 0, "fleet up", "run r succeeded")
    st = cli("status", "r", timeout=5)
    assert st.returncode == 0, st.stdout + st.stderr
    assert st.stdout.splitlines()[0].endswith(": succeeded"), st.stdout
    assert "  as fleet saw it end: exit 0, by fleet up at " in st.stdout, st.stdout
    assert "n1's part of attempt 1 (r) was never seen to end; `fleet stop r` once it answers" \
        in st.stdout, st.stdout
    ps = cli("ps", timeout=5)
    assert ps.stdout.splitlines()[1].startswith("r ") and \
        " succeeded; attempt 1 may still run on n1 " in ps.stdout, ps.stdout
    js = json.loads(cli("status", "r", "--json", timeout=5).stdout)
    assert js["verdict"]["not_seen_to_end"] == [{"attempt": 1, "run_id": "r", "node": "n1"}]
    assert asked == []  # no host asked


def test_a_restarted_run_names_its_lost_part_and_a_later_end_kept_clears_it(
        cli: InProcessCLI, asked: Asked) -> None:
    first, second = save("r", ("n1", "n2")), save("r-a2", ("n1", "n3"), parent="r")
    for node in ("n1", "n3"):
        ended(second, node, NodeStatus.SUCCEEDED, 0)
    ended(first, "n1", NodeStatus.STOPPED, 143)
    items = [attempts.Attempt(1, "r", ["n1", "n2"], 0.0, 1.0, RunStatus.UNKNOWN,
                              "n2 was lost", replaced={"n2": "n3"}, lost=["n2"]),
             attempts.Attempt(2, "r-a2", ["n1", "n3"], 2.0, 3.0, RunStatus.SUCCEEDED)]
    (first.dir / attempts.FILE).write_text(json.dumps(
        {"max": 1, "attempts": [attempts.as_dict(a) for a in items]}))
    kept = history.keep("r-a2", RunStatus.SUCCEEDED, 0, "fleet up", "run r succeeded")
    assert kept is not None and kept.lost == (Lost(1, "r", "n2"),)
    st = cli("status", "r", timeout=5)
    assert st.returncode == 0 and "  n2's part of attempt 1 (r) was never seen to end" \
        in st.stdout, st.stdout
    assert "n3               node rank 1 (rank 1)  succeeded (exit 0)" in st.stdout, st.stdout
    assert "; attempt 1 may still run on n2 " in cli("ps", timeout=5).stdout
    ended(first, "n2", NodeStatus.STOPPED, 143)  # a later `fleet stop`, once n2 answered
    assert "never seen" not in cli("status", "r", timeout=5).stdout
    assert asked == []


def test_no_verdict_for_a_state_that_is_no_end(cli: InProcessCLI) -> None:
    save("r", ("n1",))
    assert history.keep("r", RunStatus.UNKNOWN, 3, "fleet up", "lost sight") is None
    assert history.keep("r", RunStatus.NEVER_STARTED, 1, "fleet status", "") is None
    assert history.keep("nope", RunStatus.FAILED, 1, "fleet up", "") is None  # never raises
    assert verdict.read(state.state_dir() / "r") is None


def test_a_live_runs_silent_host_is_said_unreachable_within_the_bound(
        cli: InProcessCLI, asked: Asked) -> None:
    rec = save("r", ("n1", "n2"))
    ended(rec, "n1", NodeStatus.SUCCEEDED, 0)
    st = cli("status", "r", timeout=10)
    assert st.returncode == 3, st.stdout + st.stderr
    assert "n1               node rank 0 (rank 0)  succeeded (exit 0)" in st.stdout, st.stdout
    assert "n2               node rank 1 (rank 1)  unreachable (may still be running): n2: " \
           "no answer to fleet's question (connection and run state) after 0.5s" in st.stdout, \
        st.stdout
    # kept ends are not asked; the bound held: status ended while n2's question still waited
    assert asked == ["n2"] and not asked.answered.is_set()
    assert outcomes.ended(rec.dir) == {"n1": NodeOutcome("n1", 0, NodeStatus.SUCCEEDED, 0)}
    assert verdict.read(rec.dir) is None


def test_rm_forget_drops_the_record_and_says_what_may_be_left(
        cli: InProcessCLI, asked: Asked) -> None:
    save("r", ("n1", "n2"))
    save("r-a2", ("n1", "n3"), parent="r")
    out = cli("rm", "--forget", "r", timeout=5)
    assert out.returncode == 0, out.stderr
    assert "n2 (192.0.2.1): /r/r/n2 may be left (attempt 1)" in out.stderr, out.stderr
    assert "n3 (192.0.2.1): /r/r-a2/n3 may be left (attempt 2)" in out.stderr, out.stderr
    assert "run r forgotten" in out.stderr
    assert not (state.state_dir() / "r").exists() and not (state.state_dir() / "r-a2").exists()
    assert asked == []


def test_stop_and_logs_keep_no_verdict_while_the_up_that_watches_the_run_lives(
        cli: InProcessCLI, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.lifecycle.answers import keep_seen

    rec = save("r", ("n1",))
    monkeypatch.setattr("fleet.backends.for_record", lambda r: SimpleNamespace(
        describe=lambda r: (RunStatus.STOPPED, []), take_healed=lambda r: None))
    keep_seen(dataclasses.replace(rec, controller=state.controller_id()), rec, "fleet stop")
    assert verdict.read(rec.dir) is None  # that `fleet up` may start another attempt
    keep_seen(rec, rec, "fleet logs -f")  # no controller known: what the stop saw is kept
    kept = verdict.read(rec.dir)
    assert kept is not None and (kept.status, kept.by) == (RunStatus.STOPPED, "fleet logs -f")


def test_diff_of_a_restarted_run_compares_its_last_attempt_and_says_so(
        cli: InProcessCLI, tmp_path: Path) -> None:
    from fleet import manifest
    from tests.unit.test_setup_manifest import a_manifest

    for run_id, lr in (("a", "0.1"), ("b", "0.1"), ("b-a2", "0.3")):
        rec = save(run_id, ("n1",), parent="b" if run_id == "b-a2" else "")
        m = a_manifest(tmp_path, run_id, LR=lr)
        (rec.dir / "manifest.json").write_text(manifest.dumps(m))
    out = cli("diff", "a", "b", timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == "b: comparing its last attempt, 2/2 (b-a2)", out.stdout
    assert "0.3" in out.stdout, out.stdout  # attempt 2's env, not attempt 1's (the same as a's)
