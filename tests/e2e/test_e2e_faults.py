"""Faults at every phase boundary of `fleet up`, end to end through the real CLI on hosts with
PID namespaces of their own: the controller killed, one SIGINT, two SIGINTs 5 ms apart, a
SIGTERM, an exception inside fleet, a node's link cut, a node's sshd killed. After each, the
hosts themselves are asked what is left (nothing, or, for what fleet could not reach, nothing
once a later `fleet stop RUN` from another directory has run), no output carries a Python
traceback of fleet's, and `status`, `ps` and the exit code tell the truth."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_lifetime import long_job, wait_for
from tests.e2e.test_e2e_up import assert_nothing_left
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

STARTED = ("master-start", "worker-start", "stream", "stop")  # phases after a start


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(2) as t:
        yield t


_ports = iter(range(29700, 29800))


def up(cli: CLI, tmp_path: Path, fault: str, **env: object) -> subprocess.CompletedProcess[str]:
    cli.env["FLEET_FAULT"] = fault
    try:
        return cli("up", str(long_job(tmp_path, next(_ports), TICK_S=0.2, **env)), timeout=240)
    finally:
        del cli.env["FLEET_FAULT"]


def recorded(cli: CLI) -> str | None:
    if "FLEET_STATE_DIR" in cli.env:
        runs = Path(cli.env["FLEET_STATE_DIR"]) / "runs"
    else:
        runs = Path(cli.env["XDG_STATE_HOME"]) / "fleet" / "runs"
    found = sorted(p.name for p in runs.iterdir()) if runs.exists() else []
    return found[-1] if found else None


def from_elsewhere(cli: CLI, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI run from another directory (same user, same state directory)."""
    other = tmp_path / "elsewhere"
    other.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "fleet", *args], cwd=other, env=cli.env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback (most recent call last)" not in r.stderr, r.stderr


CASES = [
    ("connect", "int"), ("probe", "raise"), ("preflight", "int2"), ("upload", "int"),
    ("upload", "raise"),
    ("master-start", "int2"), ("master-start", "raise"), ("worker-start", "int"),
    ("worker-start", "term"), ("stream", "int2"), ("stream", "raise"),
]


@pytest.mark.parametrize(("phase", "action"), CASES, ids=[f"{p}-{a}" for p, a in CASES])
def test_fault_in_fleet_itself(cli: CLI, tb: Testbed, tmp_path: Path, phase: str,
                               action: str) -> None:
    tb.inventory(tmp_path / "inv.toml")
    r = up(cli, tmp_path, f"{phase}:{action}")
    no_traceback(r)
    if action == "raise":
        assert r.returncode == 70, r.stderr
        assert f"internal error: RuntimeError: injected fault at {phase}" in r.stderr
    else:
        assert r.returncode == 130, r.stderr
        sig = "SIGTERM" if action == "term" else "SIGINT"
        assert f"fleet: interrupted ({sig})" in r.stderr, r.stderr
    run_id = recorded(cli)
    if phase not in STARTED:
        # Nothing was started: nothing is left, not even a record or a run directory.
        assert run_id is None, run_id
        assert "nothing had been started on any node" in r.stderr or phase == "probe", r.stderr
        for h in tb.hosts:
            runs = h.home / "fleet" / "runs"
            assert not (list(runs.iterdir()) if runs.exists() else []), f"{h.name}: run dir left"
        return
    assert run_id is not None
    assert "the job was stopped on every node" in r.stderr, r.stderr
    assert_nothing_left(tb, run_id)
    st = from_elsewhere(cli, tmp_path, "status", run_id)
    assert st.returncode == 4, st.stdout + st.stderr
    assert re.search(rf"^run {run_id} .*: stopped$", st.stdout, re.M), st.stdout
    by = "after an error" if action == "raise" else "interrupted"
    for h in tb.hosts:
        # The master may have been stopped before it ever started its workers: by then it is
        # "stopped", with the same words.
        assert re.search(rf"{h.name} .*stopped.* by fleet up, {by}", st.stdout), st.stdout
    ps = from_elsewhere(cli, tmp_path, "ps")
    assert re.search(rf"^{run_id}\s+stopped\s", ps.stdout, re.M), ps.stdout


def test_signal_during_the_fail_fast_stop(cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    """Two SIGINTs while fleet is stopping the others after a rank failed: the teardown still
    completes on every node, and nothing claims more than happened."""
    tb.inventory(tmp_path / "inv.toml")
    r = up(cli, tmp_path, "stop:int2", FAIL_RANK=1)
    no_traceback(r)
    assert r.returncode == 130, r.stderr
    assert "the job was stopped on every node" in r.stderr, r.stderr
    run_id = recorded(cli)
    assert run_id is not None
    assert_nothing_left(tb, run_id)
    st = from_elsewhere(cli, tmp_path, "status", run_id)
    assert st.returncode == 1, st.stdout  # rank 1 failed by itself: the run failed
    assert re.search(r"node2 .*failed \(exit 1\)", st.stdout), st.stdout


def test_controller_killed_while_uploading(cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    """Nothing runs anywhere; `fleet stop RUN` still ends the run's record truthfully."""
    tb.inventory(tmp_path / "inv.toml")
    r = up(cli, tmp_path, "upload:kill")
    assert r.returncode == -signal.SIGKILL
    run_id = recorded(cli)
    assert run_id is not None
    assert_nothing_left(tb, run_id, timeout=1)
    stop = from_elsewhere(cli, tmp_path, "stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    st = from_elsewhere(cli, tmp_path, "status", run_id)
    # Killed before it started any node: `status` says the run never started (its `fleet up`
    # is gone, nothing was launched), neither "starting" forever nor a guess.
    assert st.returncode == 1, st.stdout
    assert f"run {run_id} " in st.stdout and ": never started" in st.stdout, st.stdout


@pytest.mark.parametrize("phase", ["master-start", "worker-start", "stream"])
def test_controller_killed_then_stop_from_elsewhere(cli: CLI, tb: Testbed, tmp_path: Path,
                                                    phase: str) -> None:
    """SIGKILL leaves fleet no chance to clean up: the run goes on (a detached run survives its
    laptop by design), is listed on the hosts by `ps --hosts`, and `fleet stop RUN` from any
    directory ends it everywhere. The record is where XDG says, whatever the directory."""
    del cli.env["FLEET_STATE_DIR"]
    cli.env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    inv = tb.inventory(tmp_path / "inv.toml")
    r = up(cli, tmp_path, f"{phase}:kill")
    assert r.returncode == -signal.SIGKILL
    run_id = recorded(cli)
    assert run_id is not None
    alive = from_elsewhere(cli, tmp_path, "ps", "--hosts", str(inv))
    assert alive.returncode == 0, alive.stderr
    assert re.search(rf"^{run_id}\s+running\s+node1", alive.stdout, re.M), alive.stdout
    stop = from_elsewhere(cli, tmp_path, "stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert_nothing_left(tb, run_id, timeout=5)
    st = from_elsewhere(cli, tmp_path, "status", run_id)
    assert "fleet stop" in st.stdout and "running" not in st.stdout, st.stdout


def sshd_pids(tb: Testbed, name: str) -> list[int]:
    """Every sshd of the host: the listener and each connection's own."""
    out = []
    for pid in tb.pids(tb.host(name).ns):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                out.append(pid)
        except OSError:
            continue
    return out


@pytest.mark.parametrize("fault", ["link", "sshd"])
def test_node_lost_while_starting(cli: CLI, tmp_path: Path, fault: str) -> None:
    """node2 is lost after the master started and before node2 is started: fleet stops the
    master, says that node2 may hold a process and how to finish; with node2 back, `fleet stop
    RUN` from another directory leaves nothing anywhere."""
    _need_testbed()
    with Testbed(2) as tb:
        tb.inventory(tmp_path / "inv.toml")
        resume = tmp_path / "resume"
        cli.env.update(FLEET_FAULT="master-start:pause", FLEET_FAULT_RESUME=str(resume))
        proc = cli.popen("up", str(long_job(tmp_path, next(_ports), TICK_S=0.2)))
        node2 = tb.hosts[1]
        try:
            wait_for(lambda: recorded(cli) is not None, 120, "the run to be recorded")
            pid = tb.hosts[0].home / "fleet" / "runs" / str(recorded(cli)) / "node1" / "pid"
            wait_for(pid.exists, 120, "the master to start")
            time.sleep(0.5)  # fleet pauses right after it learnt the master's pid
            if fault == "link":
                subprocess.run(["ip", "link", "set", node2.veth, "down"], check=True)
            else:
                for pid in sshd_pids(tb, "node2"):
                    os.kill(pid, signal.SIGKILL)
            resume.touch()
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
            subprocess.run(["ip", "link", "set", node2.veth, "up"], check=True)
            if fault == "sshd":
                tb.host("node2").sshd_pid = 0
                tb.start_sshd("node2")
        run_id = recorded(cli)
        assert run_id is not None
        assert "Traceback (most recent call last)" not in err, err
        assert proc.returncode == 3, err
        assert "starting the job failed on 1 host(s):" in err and "node2" in err, err
        assert f"could not be stopped on node2 (it may still run there); finish the stop with " \
               f"`fleet stop {run_id}`" in err, err
        assert not tb.run_processes("node1", run_id), "the master was left running"
        stop = from_elsewhere(cli, tmp_path, "stop", run_id)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert_nothing_left(tb, run_id, timeout=5)


def test_sshd_killed_mid_run_job_survives_until_stopped(cli: CLI, tmp_path: Path) -> None:
    """A node whose sshd dies (every sshd process) but whose job goes on: fleet calls it
    unreachable, stops the others, exits 3 and says how to finish; `status` exits 3 saying so;
    once sshd is back, `fleet stop RUN` from elsewhere ends the survivor."""
    _need_testbed()
    with Testbed(2) as tb:
        tb.inventory(tmp_path / "inv.toml")
        # Ranks that never talk: fleet gives node2 unreachable_after (10 s), then as long again
        # for its stop, and a gloo job there would die of node1's stop meanwhile.
        (tmp_path / "ticks.py").write_text("import time\nfor i in range(1200):\n"
                                           "    print(f'tick {i}', flush=True)\n"
                                           "    time.sleep(0.2)\n")
        job = tmp_path / "ticks.toml"
        job.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                       'command = ["{python}", "ticks.py"]\n'
                       f"[rendezvous]\nport = {next(_ports)}\n")
        proc = cli.popen("up", str(job))
        runs = cli.cwd / ".fleet" / "runs"
        try:
            wait_for(lambda: any("tick 3" in p.read_text() for p in runs.glob("*/node2.log")),
                     120, "the job to run")
            run_id = recorded(cli)
            assert run_id is not None
            for pid in sshd_pids(tb, "node2"):
                os.kill(pid, signal.SIGKILL)
            tb.host("node2").sshd_pid = 0
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 3, err
        assert "Traceback (most recent call last)" not in err
        assert re.search(r"node2 \(node rank 1\) is unreachable", err), err
        assert tb.run_processes("node2", run_id), "node2's job should have survived its sshd"
        assert not tb.run_processes("node1", run_id), "node1 was not stopped"
        st = from_elsewhere(cli, tmp_path, "status", run_id)
        assert st.returncode == 3 and "unreachable (may still be running)" in st.stdout, \
            st.stdout
        tb.start_sshd("node2")
        stop = from_elsewhere(cli, tmp_path, "stop", run_id)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert_nothing_left(tb, run_id, timeout=5)
