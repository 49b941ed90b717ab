"""The run's state machine without hosts: states and what follows from them, the guard's one
teardown under exceptions and signals, skew-proof failure ordering, damaged records."""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleet.backends.hosts import node as remote
from fleet.backends.hosts.prepare import Session
from fleet.backends.hosts.run import HostsRun
from fleet.backends.hosts.stop import stop_nodes
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job, Launcher
from fleet.console import Console
from fleet.errors import DamagedRecord, Interrupted, RemoteCommandError
from fleet.facts.failure import first, parse_report
from fleet.lifecycle.guard import Guard
from fleet.plan import make_plan
from fleet.run import record as state
from fleet.states import NodeStatus, RunStatus, StopCause, by_fail_fast, overall
from fleet.transport.framing import clock_offset

S = NodeStatus


@pytest.mark.parametrize(("nodes", "run"), [
    ([S.SUCCEEDED, S.SUCCEEDED], RunStatus.SUCCEEDED),
    ([S.SUCCEEDED, S.RUNNING], RunStatus.RUNNING),
    ([S.STARTING, S.RUNNING], RunStatus.RUNNING),
    ([S.STOPPED, S.STOPPED], RunStatus.STOPPED),
    ([S.FAILED, S.STOPPED], RunStatus.FAILED),
    ([S.FAILED, S.UNREACHABLE], RunStatus.FAILED),
    ([S.STOPPED, S.UNREACHABLE], RunStatus.UNKNOWN),
    ([S.RUNNING, S.UNREACHABLE], RunStatus.UNKNOWN),
    ([S.SUCCEEDED, S.MISSING], RunStatus.UNKNOWN),
])
def test_overall(nodes: list[NodeStatus], run: RunStatus) -> None:
    assert overall(nodes) is run


def test_exit_codes_and_terminal_states() -> None:
    assert [r.exit_code for r in (RunStatus.SUCCEEDED, RunStatus.RUNNING, RunStatus.FAILED,
                                  RunStatus.UNKNOWN, RunStatus.STOPPED)] == [0, 0, 1, 3, 4]
    assert not RunStatus.RUNNING.is_terminal and RunStatus.STOPPED.is_terminal
    assert not S.UNREACHABLE.is_terminal and S.MISSING.is_terminal


@pytest.mark.parametrize(("record", "cause"), [
    ("fail-fast: n2 failed", StopCause.FAIL_FAST),
    ("watchdog: no output for 30s (a hang)", StopCause.WATCHDOG),
    ("fleet stop", StopCause.OTHER),
    ("fleet up, after an error: ValueError: fail-fast: x", StopCause.OTHER),
    ("fail-fastish: n2", StopCause.OTHER),
    ("", StopCause.OTHER),
])
def test_stop_causes_are_read_from_the_stop_records_first_word(record: str,
                                                                cause: StopCause) -> None:
    assert StopCause.of(record) is cause


def test_a_fail_fast_names_the_node_that_set_it_off() -> None:
    said = StopCause.FAIL_FAST.says("n2 unreachable")
    assert said == "fail-fast: n2 unreachable"
    assert by_fail_fast(said) and by_fail_fast(said, "n2") and not by_fail_fast(said, "n1")
    assert not by_fail_fast("fleet stop", "n2")


def test_clock_offset_is_taken_against_the_answers_arrival() -> None:
    """Slow rc files (4 s) before the stamp do not make the node look 2 s behind."""
    assert clock_offset("1004.0", 1000.0, 1004.01) == pytest.approx(-0.01)
    assert clock_offset("1010.0", 1000.0, 1000.5) == pytest.approx(9.5)
    assert clock_offset("garbage", 1.0, 2.0) == 0.0


def report(when: float, rank: int) -> str:
    return (f"=== log\nboom\n=== torchrun/r/attempt_0/0/error.json {when:.9f}\n"
            f'{{"message": {{"message": "RuntimeError: rank {rank}", "extraInfo": '
            f'{{"py_callstack": "Traceback\\nRuntimeError: rank {rank}"}}}}}}\n')


def test_first_failure_is_ordered_by_corrected_clocks() -> None:
    """node2's clock is 5 s fast: its error file, stamped 3 s later than node1's by its own
    clock, was in truth written 2 s earlier. The root cause is node2's rank."""
    node1 = parse_report(report(1000.0, 0), "node1", 0, clock_offset=0.0)
    node2 = parse_report(report(1003.0, 2), "node2", 1, clock_offset=5.0)
    assert node1 is not None and node2 is not None
    root = first([node1, node2])
    assert root is node2 and "rank 2" in root.traceback


# ---- the guard ------------------------------------------------------------------------------
@dataclass
class FakeTransport:
    """Records the scripts a node was sent; stop.sh says nothing is left."""

    name: str
    scripts: list[str] = field(default_factory=list)
    fail: bool = False
    delay: float = 0.0

    def run(self, script: str, timeout: float | None = 60.0, what: str = "") -> Any:
        self.scripts.append(script)
        time.sleep(self.delay)
        if self.fail:
            raise RemoteCommandError(self.name, what, 255, "connection lost")
        out = "marked\n" if "echo marked" in script else "left=\n"
        return type("R", (), {"out": out, "ok": True, "code": 0, "err": ""})()

    def stream(self, script: str, on_lines: Any, stop: Any = None, received: Any = None) -> int:
        on_lines(self.run(script).out.splitlines())
        return 0

    def close(self) -> None:
        pass


def guard_for(tmp_path: Path, fail: set[str] | None = None,
              delay: float = 0.0) -> Guard:
    hosts = tuple(Host(name=f"n{i}", address=f"10.0.0.{i}") for i in (1, 2, 3))
    inv = Inventory(tmp_path / "inv.toml", hosts)
    job = Job(path=tmp_path / "j.toml", name="j", inventory=inv.path, workdir=tmp_path,
              script="t.py")
    plan = make_plan(inv, job, "j-1")
    session = Session({h.name: FakeTransport(h.name, fail=h.name in (fail or set()),
                                             delay=delay)
                       for h in hosts})  # type: ignore[dict-item]
    console = Console(out=io.StringIO(), err=io.StringIO())
    return Guard(HostsRun(session, plan, console, tmp_path / "record"), console)


def hosts(g: Guard) -> HostsRun:
    assert isinstance(g.run, HostsRun)
    return g.run


def stops(g: Guard) -> list[str]:
    return [n for n, t in hosts(g).session.transports.items()
            if any("stop.sh" in s for s in t.scripts)]  # type: ignore[attr-defined]


def test_an_exception_stops_every_node_once_any_may_run(tmp_path: Path) -> None:
    """n3 was never started: it is marked stopped too, so that it says why it never ran."""
    g = guard_for(tmp_path)
    with pytest.raises(ValueError), g:
        hosts(g).may_run.update({"n1", "n2"})
        raise ValueError("bug")
    assert stops(g) == ["n1", "n2", "n3"]
    assert any("fleet up, after an error: ValueError: bug" in s
               for s in hosts(g).session.transports["n1"].scripts)  # type: ignore[attr-defined]


def test_two_signals_5ms_apart_end_in_one_complete_teardown(tmp_path: Path) -> None:
    """What `timeout` or a terminal multiplexer sends: the second arrives while the teardown
    (slow here: every node takes 0.2 s to answer) is under way, and must not cut it short."""
    g = guard_for(tmp_path, delay=0.2)
    before = signal.getsignal(signal.SIGINT)

    def send() -> None:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=send)
    with pytest.raises(Interrupted) as e, g:
        hosts(g).may_run.update({"n1", "n2", "n3"})
        sender.start()
        time.sleep(5)
    sender.join()
    assert [s for s in g.signals if s] == [signal.SIGINT, signal.SIGINT]
    assert stops(g) == ["n1", "n2", "n3"]
    assert str(e.value) == "interrupted (SIGINT): the job was stopped on every node"
    assert signal.getsignal(signal.SIGINT) is before


def test_an_interrupt_never_claims_a_stop_that_failed(tmp_path: Path) -> None:
    g = guard_for(tmp_path, fail={"n2"})
    with pytest.raises(Interrupted) as e, g:
        hosts(g).may_run.update({"n1", "n2"})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert "could not be stopped on n2 (it may still run there)" in str(e.value)
    assert "`fleet stop j-1`" in str(e.value)


def test_an_interrupted_setup_is_stopped_before_its_directories_go(tmp_path: Path) -> None:
    """No job process started, but a setup (pip, say) may still run on the nodes."""
    g = guard_for(tmp_path)
    hosts(g).record_dir.mkdir()
    with pytest.raises(Interrupted) as e, g:
        hosts(g).setting_up.update({"n1", "n2", "n3"})
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert sorted(stops(g)) == ["n1", "n2", "n3"]
    assert "nothing had been started on any node" in str(e.value)
    for t in hosts(g).session.transports.values():
        stop_at = next(i for i, s in enumerate(t.scripts) if "stop.sh" in s)
        assert any("rm -rf" in s for s in t.scripts[stop_at:])  # removed after the stop
    assert not hosts(g).record_dir.exists()


def test_nothing_started_nothing_stopped_nothing_kept(tmp_path: Path) -> None:
    g = guard_for(tmp_path)
    hosts(g).record_dir.mkdir()
    with pytest.raises(Interrupted) as e, g:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert stops(g) == []
    assert "nothing had been started on any node" in str(e.value)
    removed = [n for n, t in hosts(g).session.transports.items()
               if any("rm -rf" in s for s in t.scripts)]
    assert removed == ["n1", "n2", "n3"] and not hosts(g).record_dir.exists()


def test_a_node_that_cannot_be_stopped_is_named_only_if_it_may_run(tmp_path: Path) -> None:
    g = guard_for(tmp_path, fail={"n2", "n3"})
    with pytest.raises(Interrupted) as e, g:
        hosts(g).may_run.update({"n1", "n2"})
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    assert "could not be stopped on n2 (it may still run there)" in str(e.value)


def test_an_ended_or_detached_run_is_left_alone(tmp_path: Path) -> None:
    g = guard_for(tmp_path)
    with g:
        hosts(g).may_run.update({"n1"})
        g.ended = True
    d = guard_for(tmp_path)
    with d:
        hosts(d).may_run.update({"n1"})
        d.released = True
    assert stops(g) == [] and stops(d) == []


# ---- records --------------------------------------------------------------------------------
def test_damaged_record_is_named_and_skipped(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    bad = tmp_path / "runs" / "r-1"
    bad.mkdir(parents=True)
    (bad / "run.json").write_text('{"run_id": "r-1", "nod')  # truncated
    with pytest.raises(DamagedRecord, match="run.json: the record of run r-1 is damaged"):
        state.load("r-1")
    runs, damaged = state.all_runs()
    assert runs == [] and list(damaged) == [str(bad / "run.json")]


def test_state_dir_follows_xdg_wherever_fleet_runs(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.delenv("FLEET_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    assert state.state_dir() == tmp_path / "xdg" / "fleet" / "runs"


def test_stop_reason_reaches_stop_sh() -> None:
    t = FakeTransport("n1")
    assert remote.stop(t, "/w/runs/r/n1", "fail-fast: n2 failed",  # type: ignore[arg-type]
                       "k1") == remote.Stopped([], True)
    assert "'fail-fast: n2 failed'" in t.scripts[0]


def test_every_node_is_marked_before_any_is_signalled(tmp_path: Path) -> None:
    """A node decides whether its own part had failed when its stop is recorded: no node may
    be signalled before every node's record is written (its peers' end would decide it)."""
    g = guard_for(tmp_path, delay=0.05)
    order: list[str] = []
    lock = threading.Lock()
    for t in hosts(g).session.transports.values():
        run = t.run

        def logged(script: str, timeout: float | None = 60.0, what: str = "",
                   run: Any = run) -> Any:
            with lock:
                order.append("mark" if "echo marked" in script else "stop")
            return run(script, timeout, what)

        t.run = logged  # type: ignore[method-assign]
    run = hosts(g)
    assert stop_nodes(run.session, run.plan.nodes, g.console, "fleet stop", run.key,
                      lambda host: None) == {}
    assert order == ["mark"] * 3 + ["stop"] * 3


def test_a_stop_whose_connection_the_heartbeat_replaced_goes_on_the_new_one(
        tmp_path: Path) -> None:
    """A heartbeat found n1's connection slow (a loaded laptop driving 64 hosts) and put a
    fresh one in place, closing the old one under the stop: the stop goes on the one in
    place at once, is said as what happened (never "lost"), and no other connection is made
    (the streams already went on from the new one)."""
    from fleet.errors import TransportError
    from fleet.transport.link import Link

    g = guard_for(tmp_path)
    run = hosts(g)
    fresh = FakeTransport("n1")
    made: list[str] = []

    def connect(old: Any, timeout: float) -> Any:
        made.append("fresh")
        return FakeTransport("n1")

    link = Link(run.session.transports, "n1", 10, connect=connect)  # type: ignore[arg-type]
    old = run.session.transports["n1"]
    plain = old.run

    def closed_under_the_stop(script: str, timeout: float | None = 60.0, what: str = "") -> Any:
        if "echo marked" in script:
            return plain(script, timeout, what)
        with link.cond:  # what Link.fresh does once a fresh connection answered
            link.transports["n1"] = fresh  # type: ignore[assignment]
            link.generation += 1
        raise TransportError("connection to 10.0.0.1 was lost")

    old.run = closed_under_the_stop  # type: ignore[method-assign]
    problems = stop_nodes(run.session, run.plan.nodes, g.console, "fail-fast: n2 failed",
                          run.key, lambda host: None, links={"n1": link}, retry_for=10)
    said = g.console.err.getvalue()  # type: ignore[attr-defined]
    assert problems == {} and made == [], said
    assert any("stop.sh" in s for s in fresh.scripts), fresh.scripts
    assert "n1  its connection was replaced during the stop; stopping it on the one in place" \
        in said, said
    assert "no stop on its connection" not in said and "lost" not in said, said


def test_stop_where_the_scripts_never_arrived(tmp_path: Path) -> None:
    import subprocess
    run_dir = tmp_path / "runs" / "r" / "n1"
    run_dir.mkdir(parents=True)
    out = subprocess.run(["sh", "-c", remote.stop_script(str(run_dir), "fleet stop", "k1")],
                         capture_output=True, text=True, timeout=30).stdout
    assert remote.parse_stop(out) == []
    assert (run_dir / "stopped").read_text() == "fleet stop\nkey=k1\n"


# ---- run.sh under stop.sh's signals ----------------------------------------------------------
CHILD = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda *a: os._exit(7))
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_run_sh_records_the_childs_own_exit_code_under_signals(tmp_path: Path,
                                                               shell: str) -> None:
    """stop.sh signals run.sh and torchrun together. run.sh must record torchrun's own exit code
    (7 here, after its own shutdown), never the 143 of its interrupted `wait`: 20 tries."""
    import subprocess
    import sys

    for attempt in range(20):
        node = _rendered_node(tmp_path, (sys.executable, "-c", CHILD), f"j-{shell}-{attempt}")
        log = open(Path(node.run_dir) / "node.log", "w")  # noqa: SIM115
        wrapper = subprocess.Popen([shell, "run.sh"], cwd=node.run_dir, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        while "ready" not in (Path(node.run_dir) / "node.log").read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.01)
        child = int(subprocess.run(["pgrep", "-P", str(wrapper.pid)], capture_output=True,
                                   text=True).stdout.split()[0])
        os.kill(wrapper.pid, signal.SIGTERM)
        os.kill(child, signal.SIGTERM)
        assert wrapper.wait(timeout=20) == 7
        log.close()
        assert (Path(node.run_dir) / "exit_code").read_text().strip() == "7", attempt


# ---- following a node's log until its wrapper ends -------------------------------------------
def _rendered_node(tmp_path: Path, command: tuple[str, ...], run_id: str,
                   grace: int | None = None) -> Any:
    """A `command` job's node on this machine, its run directory written as `fleet up` would
    (`grace`: stop.sh's seconds between TERM and KILL, fleet's own by default)."""
    from fleet.render import STOP_GRACE_S, render_node
    host = Host(name="local", address="localhost", transport="local", workdir=str(tmp_path))
    inv = Inventory(tmp_path / "inv.toml", (host,))
    job = Job(path=tmp_path / "j.toml", name="j", inventory=inv.path, workdir=tmp_path,
              script=None, launcher=Launcher.COMMAND, command=command)
    plan = make_plan(inv, job, run_id)
    node = plan.nodes[0]
    Path(node.run_dir).mkdir(parents=True)
    Path(node.code_dir).mkdir(parents=True, exist_ok=True)
    for name, (text, _mode) in render_node(plan, node, grace or STOP_GRACE_S).files.items():
        (Path(node.run_dir) / name).parent.mkdir(exist_ok=True)
        (Path(node.run_dir) / name).write_text(text)
    return node


def test_follow_ends_when_the_wrapper_ends_even_as_an_unreaped_zombie(tmp_path: Path) -> None:
    """run.sh's end is seen through its lock: the follower ends with every line although the
    wrapper's pid still exists (a zombie nobody reaps: `kill -0` succeeds on it, which is what
    a pid watch alone would wait on). Without the lock file the follower would wait forever."""
    import subprocess
    import sys

    lines = 2000
    node = _rendered_node(tmp_path, (sys.executable, "-c",
                                     f"import time\nfor i in range({lines}): print('line', i)\n"
                                     "time.sleep(0.5)\nprint('last')"), "j-follow")
    log = open(Path(node.run_dir) / "node.log", "w")  # noqa: SIM115
    # Not waited for until the follower has ended: the wrapper stays a zombie after it exits.
    wrapper = subprocess.Popen(["sh", "run.sh"], cwd=node.run_dir, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "FLEET_RUN_ID": "j-follow"})
    try:
        deadline = time.monotonic() + 20
        while not (Path(node.run_dir) / "pid").exists():
            assert time.monotonic() < deadline, "run.sh never started"
            time.sleep(0.01)
        assert (Path(node.run_dir) / "locked").exists(), "flock is part of util-linux"
        follower = subprocess.run(["sh", "-c", remote.follow_script(node.run_dir, wrapper.pid)],
                                  capture_output=True, text=True, timeout=60)
        status = Path(f"/proc/{wrapper.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert status == "Z", "the wrapper should still be an unreaped zombie here"
    finally:
        wrapper.wait(timeout=30)
        log.close()
    out = follower.stdout.splitlines()
    assert out == [f"line {i}" for i in range(lines)] + ["last"]
    assert (Path(node.run_dir) / "exit_code").read_text().strip() == "0"


def test_follow_without_the_lock_watches_the_pid(tmp_path: Path) -> None:
    """A run whose run.sh took no lock (a job's own run.sh template, a node without flock): the
    follower watches the wrapper's pid, and ends once it is gone."""
    import subprocess

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "node.log").write_text("a\nb\n")
    sleeper = subprocess.Popen(["sleep", "0.5"])
    follower = subprocess.Popen(["sh", "-c", remote.follow_script(str(run_dir), sleeper.pid)],
                                stdout=subprocess.PIPE, text=True)
    sleeper.wait(timeout=10)
    out, _ = follower.communicate(timeout=30)
    assert out.splitlines() == ["a", "b"]
