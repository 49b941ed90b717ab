"""The programs fleet runs on nodes (fleet/nodeside), each under a real `sh` (dash where it is
installed, as on Debian nodes) against a temporary directory, read back by their parsers."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fleet import nodeside
from fleet.backends.hosts import node as remote
from fleet.backends.hosts.ports import (
    LISTENER_MARK,
    connect_each_script,
    connect_script,
    listener_script,
    parse_connects,
    parse_listener,
    parse_reach_and_listen,
    reach_and_listen_script,
    reached,
)
from fleet.facts import failure, run_state
from fleet.facts import slurm as sj
from fleet.facts.probe import PythonState, parse_probe, probe_script
from fleet.run.record import Wrapper
from fleet.states import NodeStatus

SH = shutil.which("dash") or "sh"
PROGRAMS = sorted(p.name for p in nodeside.HERE.iterdir() if p.suffix in (".sh", ".py"))


def sh(script: str, env: dict[str, str] | None = None,
       timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The script as fleet's transport runs it: text on the stdin of a POSIX sh."""
    return subprocess.run([SH, "-s"], input=script, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("name", [n for n in PROGRAMS if n.endswith(".sh")])
def test_every_shell_program_parses_and_says_what_it_is(name: str) -> None:
    text = nodeside.text(name)
    assert text.startswith("# "), f"{name} opens with no comment saying what it is for"
    r = subprocess.run([SH, "-n"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_a_program_reads_its_arguments_as_data(tmp_path: Path) -> None:
    """Quoted once, through fleet.shell: a name that is shell code stays a name."""
    hostile = tmp_path / "run $(touch pwned) `id`; x"
    hostile.mkdir()
    out = sh(run_state.state_script(str(hostile))).stdout
    assert "pid=" in out and not (Path.cwd() / "pwned").exists()
    assert run_state.parse_state(out).status is NodeStatus.STARTING


# ---- a run directory's facts --------------------------------------------------------------------
def test_held_runs_are_the_live_runs_of_this_machine(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    runs = tmp_path / "fleet" / "runs"
    for rel, pid, extra in (("r1/n1", os.getpid(), {}),
                            ("r2/n1", os.getpid(), {"exit_code": "0"}),
                            ("r3/n1", gone.pid, {}),
                            ("r4/n2", os.getpid(), {"machine": "elsewhere other-boot"})):
        d = runs / rel
        d.mkdir(parents=True)
        (d / "pid").write_text(f"{pid}\n")
        for name, text in extra.items():
            (d / name).write_text(text + "\n")
    out = sh(run_state.held_script("~/fleet/runs"), env={**os.environ, "HOME": str(tmp_path)})
    assert run_state.parse_held(out.stdout) == ["r1/n1"]
    assert sh(run_state.held_script(str(tmp_path / "none"))).stdout == ""


def test_ranks_are_plain_numbers_from_the_ranks_directory(tmp_path: Path) -> None:
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "0").write_text("4\n")
    (tmp_path / "ranks" / "1").write_text("5\n")
    (tmp_path / "ranks" / "2").mkdir()  # not a file: skipped
    (tmp_path / "ranks" / "x").write_text("9\n")
    assert run_state.parse_ranks(sh(run_state.ranks_script(str(tmp_path))).stdout) == \
        {0: 4, 1: 5}
    missing = sh(run_state.ranks_script(str(tmp_path / "nowhere")))
    assert (missing.returncode, missing.stdout) == (0, "")


def test_state_of_a_missing_and_of_an_ended_run(tmp_path: Path) -> None:
    assert run_state.parse_state(sh(run_state.state_script(str(tmp_path / "no"))).stdout) \
        .status is NodeStatus.MISSING
    ended = subprocess.Popen(["true"])  # a wrapper that has ended: its pid names no process
    ended.wait()
    (tmp_path / "pid").write_text(f"{ended.pid}\n")
    (tmp_path / "started").write_text("100\n")
    (tmp_path / "exit_code").write_text("3\n")
    st = run_state.parse_state(sh(run_state.state_script(str(tmp_path))).stdout)
    assert (st.status, st.code, st.pid) == (NodeStatus.FAILED, 3, ended.pid)


# ---- start, follow, end -------------------------------------------------------------------------
def test_start_detaches_run_sh_and_says_its_pid(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text('echo $$ > pid\necho "run $FLEET_ATTEMPT_ID"\n')
    r = sh(remote.start_script(str(tmp_path), "r-1"))
    assert r.returncode == 0, r.stderr
    pid, wrapper = remote.parse_start(r.stdout)
    assert pid == int((tmp_path / "pid").read_text())
    assert wrapper is not None and wrapper.pid == pid and wrapper.start > 0
    deadline = time.monotonic() + 10
    while "run r-1" not in (tmp_path / "node.log").read_text():
        assert time.monotonic() < deadline, "run.sh's output never reached node.log"
        time.sleep(0.02)


def test_stop_script_gives_stop_sh_the_key_then_the_recorded_wrapper(tmp_path: Path) -> None:
    (tmp_path / "stop.sh").write_text('cat; echo "args $*"\n')
    r = sh(remote.stop_script(str(tmp_path), "fleet stop", "k1", wrapper=Wrapper(100, 5000)))
    assert r.stdout == "k1\n100 5000\nargs fleet stop\n", r.stderr
    r = sh(remote.stop_script(str(tmp_path), "fleet stop", "k1", mark=True))
    assert r.stdout == "k1\n\nargs fleet stop mark\n", r.stderr


def test_start_refuses_a_stopped_run(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text("echo $$ > pid\n")
    (tmp_path / "stopped").write_text("fleet stop\n")
    r = sh(remote.start_script(str(tmp_path), "r-1"))
    assert r.returncode == 3 and "stopped before it started" in r.stderr
    assert not (tmp_path / "pid").exists()


def test_follow_without_a_pid_reads_from_the_offset(tmp_path: Path) -> None:
    (tmp_path / "node.log").write_text("abc\ndef\n")
    r = sh(remote.follow_script(str(tmp_path), None, 4))
    assert (r.returncode, r.stdout) == (0, "def\n")


def test_the_end_without_a_lock_is_the_wrappers_pid(tmp_path: Path) -> None:
    (tmp_path / "pid").write_text("1\n")
    # its last act, before its pid goes, is to leave a mark
    sleeper = subprocess.Popen(["sh", "-c", 'sleep 0.3; echo > "$0/ended"', str(tmp_path)])
    reaper = threading.Thread(target=sleeper.wait)  # a zombie would still answer kill -0
    reaper.start()
    out = sh(remote.end_script(str(tmp_path), sleeper.pid)).stdout
    assert (tmp_path / "ended").exists()  # the end was seen after the wrapper's, not before
    reaper.join()
    assert "pid=1" in out.splitlines()


def test_a_program_ends_with_the_shell_that_carries_it(tmp_path: Path) -> None:
    """A local stream that is stopped kills its shell: the program, waiting on a wrapper that
    still runs, must end with it (a subshell of its own would outlive it, the stream with it)."""
    p = subprocess.Popen([SH, "-c", remote.end_script(str(tmp_path), os.getpid())],
                         stdout=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(0.5)
        p.kill()
        assert select.select([p.stdout], [], [], 5)[0], "the program outlived its shell"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


# ---- the probe ----------------------------------------------------------------------------------
def test_the_probe_and_its_deep_mode_under_sh(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    script = probe_script(sys.executable, "~/fleet", "127.0.0.1", held=True, deep=True)
    r = sh(script, env=env, timeout=120)
    f = parse_probe(r.stdout)
    assert (f.python, f.home, f.route_src) == (PythonState.OK, str(tmp_path), "127.0.0.1"), r.stdout
    assert f.python_version == sys.version.split()[0] and f.held == ()
    assert ("lo", "127.0.0.1") in f.addrs
    assert f.storage and (tmp_path / "fleet" / ".fleet-storage").read_text().strip() == f.storage
    assert float(f.node_time) > 0
    assert f.health is not None and f.health.torch.startswith(f.torch_version)
    assert (f.health.disk_path, f.health.torch_error) == (str(tmp_path / "fleet"), "")
    assert f.health.disk_free > 0 and f.health.reverse_dns_s >= 0
    again = parse_probe(sh(probe_script(sys.executable, "~/fleet"), env=env).stdout)
    assert again.storage == f.storage and again.health is None and again.route_src is None
    fresh = parse_probe(sh(probe_script(sys.executable, "~/other", create=False), env=env).stdout)
    assert fresh.storage == "" and not (tmp_path / "other").exists()


def test_a_probe_whose_python_is_missing(tmp_path: Path) -> None:
    f = parse_probe(sh(probe_script(str(tmp_path / "no-python"), str(tmp_path),
                                    deep=True)).stdout)
    assert f.python is PythonState.MISSING and "not found" in f.detail and f.health is None
    assert f.hostname and f.storage


# ---- ports --------------------------------------------------------------------------------------
def test_connect_says_whether_a_port_opens() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert sh(connect_script(sys.executable, "127.0.0.1", port)).returncode == 0
    closed = sh(connect_script(sys.executable, "127.0.0.1", port))
    assert closed.returncode == 1 and "refused" in closed.stdout.lower()


def test_connect_each_tries_every_target_in_one_command() -> None:
    """The master's side of the port checks at 64 hosts: one command, one line per target."""
    with socket.create_server(("127.0.0.1", 0)) as a, socket.create_server(("127.0.0.1", 0)) as b:
        open_a, open_b = str(a.getsockname()[1]), str(b.getsockname()[1])
        with socket.create_server(("127.0.0.1", 0)) as c:
            closed = str(c.getsockname()[1])
        r = sh(connect_each_script(sys.executable, [("127.0.0.1", open_a), ("127.0.0.1", closed),
                                                    ("127.0.0.1", open_b), ("127.0.0.1", "x")]))
    assert r.returncode == 0, r.stdout + r.stderr
    got = parse_connects(r.stdout, 4)
    assert [ok for ok, _ in got] == [True, False, True, False], r.stdout
    assert "refused" in got[1][1].lower() and got[3][1]


def test_connect_answers_are_checked_against_the_targets_sent() -> None:
    out = ("0 ok\n0 fail a second word for 0\n7 ok\n-1 ok\n²  ok\n2 fail \x1b[2Jno route\n"
           "noise from an rc file\n3 maybe\n")
    assert parse_connects(out, 4) == [
        (True, ""), (False, "the connection test said nothing of it"),
        (False, "^[[2Jno route"), (False, "the connection test said nothing of it")]
    assert parse_connects("", 0) == []


def test_a_listener_takes_its_connections_then_ends() -> None:
    ok, port, pid = parse_listener(sh(listener_script(sys.executable, 0, 1, seconds=10)).stdout)
    assert ok and int(port) > 0
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert LISTENER_MARK.encode() in cmdline  # how stop_listener knows it is still fleet's
    assert b"fleet-listen" in b" ".join(cmdline) and len(b"".join(cmdline)) < 1000
    socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and b"Z" not in _state(pid):
        assert time.monotonic() < deadline, "the listener outlived its one connection"
        time.sleep(0.05)


def test_a_worker_tests_the_master_and_listens_in_one_command() -> None:
    """The worker's side of the port checks: the test of the master's port and its own listener,
    one round trip; each part read by its own parser."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        r = sh(reach_and_listen_script(sys.executable, "127.0.0.1", port, "mk"))
        code, said, listened = parse_reach_and_listen(r.stdout, "mk")
    assert (code, reached(code, said, "py")) == (0, (True, "")), r.stdout + r.stderr
    ok, lport, pid = parse_listener(listened)
    assert ok and int(lport) > 0, listened
    socket.create_connection(("127.0.0.1", int(lport)), timeout=5).close()  # it ends so
    closed = sh(reach_and_listen_script(sys.executable, "127.0.0.1", port, "mk"))
    code, said, listened = parse_reach_and_listen(closed.stdout, "mk")
    good, why = reached(code, said, "py")
    assert code == 1 and not good and "refused" in why.lower()
    ok, lport, _ = parse_listener(listened)
    assert ok  # the listener starts whatever the test said: the master tries it next
    socket.create_connection(("127.0.0.1", int(lport)), timeout=5).close()


def test_the_merged_port_check_answer_is_parsed_by_its_marker() -> None:
    assert parse_reach_and_listen("noise\nrefused\nmk 1\nlistening 4000 77\n", "mk") == (
        1, "noise\nrefused", "listening 4000 77")
    assert parse_reach_and_listen("mk x\nlistening 1 2", "mk")[0] is None
    assert parse_reach_and_listen("no marker at all", "mk") == (None, "no marker at all", "")
    with pytest.raises(RuntimeError, match="cannot test"):  # the test's status never came
        reached(None, "", "py")
    with pytest.raises(RuntimeError, match="cannot test"):
        reached(127, "py: not found", "py")
    assert reached(1, "a\nconnection refused", "py") == (False, "connection refused")


def _state(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return b"Z"


def test_a_listener_on_a_taken_port_says_so() -> None:
    with socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True) as server:
        port = server.getsockname()[1]
        ok, why, pid = parse_listener(sh(listener_script(sys.executable, port, 1)).stdout)
    assert (ok, pid) == (False, "") and "in use" in why


# ---- failures -----------------------------------------------------------------------------------
def test_the_kernel_log_says_whether_it_could_be_read() -> None:
    out = sh(failure.KERNEL_LOG_SCRIPT).stdout
    assert out.startswith("uptime=")
    lines = out.splitlines()
    assert "readable" in lines or any(line.startswith("unreadable=") for line in lines)
    said = failure.parse_kernel_log(out, "n1", 4242)
    assert said and all(s.startswith("n1") for s in said)


# ---- Slurm --------------------------------------------------------------------------------------
def test_slurm_nodes_from_the_run_directory(tmp_path: Path) -> None:
    for name, code, signalled in (("gpu-a", "0", False), ("gpu-b", "", True)):
        d = tmp_path / name
        d.mkdir()
        (d / "node.log").write_text(f"fleet: node {name} is node rank "
                                    f"{0 if name == 'gpu-a' else 1} of 2\nmore\n")
        if code:
            (d / "exit_code").write_text(code + "\n")
        if signalled:
            (d / "signalled").touch()
    (tmp_path / "batch.log").write_text("not a node\n")
    (tmp_path / "empty").mkdir()
    nodes = sj.parse_nodes(sh(sj.nodes_script(str(tmp_path))).stdout)
    assert nodes == {"gpu-a": sj.NodeInfo("gpu-a", 0, 0, False),
                     "gpu-b": sj.NodeInfo("gpu-b", 1, None, True)}


def test_slurm_job_asks_all_three_in_sections(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "scontrol", "sacct"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*"\n')
        (bin_dir / tool).chmod(0o755)
    out = sh(sj.job_script("12; x"), env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    sections = sj.sections(out.stdout)
    assert sections["squeue"] == "squeue -h -j 12; x -o %i|%T|%N|%r\n"
    assert sections["scontrol"] == "scontrol show job -o 12; x\n"
    assert sections["sacct"].startswith("sacct -n -P -X -j 12; x ")


def test_state_takes_one_line_of_each_file_the_job_can_write(tmp_path: Path) -> None:
    """The job can write its run directory's files: a line of its own (`alive`, `missing`)
    never reaches fleet as one of run_state.sh's, and a pid of -1 is no live process."""
    (tmp_path / "pid").write_text("-1\nalive\n")
    (tmp_path / "exit_code").write_text("0\nmissing\nalive\n")
    out = sh(run_state.state_script(str(tmp_path))).stdout
    assert "alive" not in out.splitlines() and "missing" not in out.splitlines(), out
    st = run_state.parse_state(out)
    assert (st.status, st.code, st.pid) == (NodeStatus.SUCCEEDED, 0, None)
    (tmp_path / "exit_code").write_text("x" * 5000)
    out = sh(run_state.state_script(str(tmp_path))).stdout
    assert max(len(line) for line in out.splitlines()) < 400, out
