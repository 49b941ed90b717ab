"""The laptop's record is the history, end to end through the real CLI on hosts that share
nothing: a run fleet saw succeed still reads succeeded (exit 0) in `status` and `ps` once its
master host is dead, and the dead host is not even contacted (a listener in its place counts);
a restarted run whose lost host stays down names that part as never seen to end, from the
record, and `rm --forget` drops it saying what may be left where; a live run with one silent
host says that host unreachable within the bound, and the others running."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet.backends.hosts import recorded
from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_heal import TICKS, finish, start
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Accepts on the dead host's address, port 22, and writes how many connections came: fleet
# asking the host would be one.
COUNTER = '''import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 22))
s.listen(16)
open(sys.argv[2], "w").write("0")
n = 0
while True:
    c, _ = s.accept()
    n += 1
    open(sys.argv[2], "w").write(str(n))
    c.close()
'''


def job(d: Path, port: int, command: str, extra: str = "") -> Path:
    path = d / "job.toml"
    path.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                    f"command = {command}\n[rendezvous]\nport = {port}\n{extra}")
    return path


def timed(cli: CLI, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    r = cli(*args, timeout=120)
    return r, time.monotonic() - began


def test_a_run_fleet_saw_succeed_reads_succeeded_with_its_master_dead(
        cli: CLI, tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(2) as tb:
        tb.inventory(tmp_path / "inv.toml")
        up = cli("up", str(job(tmp_path, 29931, '["{python}", "-c", "print(\'done\')"]')),
                 timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr
        run_id = run_id_of(up.stderr)
        assert '"status": "succeeded"' in (cli.cwd / ".fleet" / "runs" / run_id /
                                            "verdict.json").read_text()
        master = tb.host("node1")
        tb.kill_host("node1")
        count = tmp_path / "connections"
        listener = subprocess.Popen(["ip", "netns", "exec", master.ns, sys.executable, "-c",
                                     COUNTER, master.addr, str(count)],
                                    stdin=subprocess.DEVNULL)
        try:
            wait_for(count.exists, 10, "the listener in node1's place")
            st, st_s = timed(cli, "status", run_id)
            ps, ps_s = timed(cli, "ps")
            print(f"with node1 dead: status {st_s:.2f}s, ps {ps_s:.2f}s")
            assert st.returncode == 0, st.stdout + st.stderr
            assert re.search(rf"^run {run_id} .*: succeeded$", st.stdout, re.M), st.stdout
            assert "  as fleet saw it end: exit 0, by fleet up at " in st.stdout, st.stdout
            assert "unreachable" not in st.stdout + st.stderr, st.stdout
            assert re.search(rf"^{run_id} +succeeded +\S+ \S+  node1,node2$", ps.stdout, re.M), \
                ps.stdout
            assert count.read_text() == "0", "fleet contacted the dead host"
            with socket.create_connection((master.addr, 22), timeout=5):
                pass  # the listener counts what reaches it: this test could fail
            wait_for(lambda: count.read_text() == "1", 5, "the listener to count")
        finally:
            listener.kill()
            listener.wait()


def test_a_restarted_runs_lost_part_is_said_from_the_record_and_forgotten(
        cli: CLI, tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(3) as tb3:
        d = tmp_path / "job"
        d.mkdir()
        tb3.inventory(d / "inv.toml", per_host={"node3": {"spare": True}})
        (d / "ticks.py").write_text(TICKS)
        path = job(d, 29932, '["{python}", "ticks.py"]',
                   "[watchdog]\nunreachable_after = 4\n[restart]\nmax = 1\nbackoff = 1\n")
        proc, _, err_path = start(cli, path, tmp_path)
        runs = cli.cwd / ".fleet" / "runs"
        try:
            wait_for(lambda: any("attempt 1 tick 3" in p.read_text()
                                 for p in runs.glob("*/node2.log")), 120, "node2 to run")
            tb3.kill_host("node2")  # and it stays down
            finish(proc, 240)
            err = err_path.read_text()
            assert proc.returncode == 0, err
            run_id = run_id_of(err)
            st, st_s = timed(cli, "status", run_id)
            ps, ps_s = timed(cli, "ps")
            print(f"with node2 dead: status {st_s:.2f}s, ps {ps_s:.2f}s")
            assert st.returncode == 0, st.stdout + st.stderr
            assert f"  node2's part of attempt 1 ({run_id}) was never seen to end; `fleet stop " \
                   f"{run_id}` once it answers\n" in st.stdout, st.stdout
            assert "unreachable" not in st.stdout, st.stdout  # not asked
            assert re.search(rf"^{run_id} +succeeded \(attempt 2/2, .*\); attempt 1 may still "
                             r"run on node2 ", ps.stdout, re.M), ps.stdout
            rm = cli("rm", run_id, timeout=120)
            assert rm.returncode == 3, rm.stdout + rm.stderr
            assert f"`fleet rm --forget {run_id}`" in rm.stderr, rm.stderr
            gone = cli("rm", "--forget", run_id, timeout=60)
            assert gone.returncode == 0, gone.stderr
            node2 = tb3.host("node2")
            where = node2.home / "fleet" / "runs" / run_id / "node2"
            assert f"node2 (root@{node2.addr}): {where} may be left" in gone.stderr, gone.stderr
            assert f"run {run_id} forgotten" in gone.stderr, gone.stderr
            assert not (runs / run_id).exists()
            assert run_id not in cli("ps").stdout
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_live_runs_silent_host_is_said_unreachable_within_the_bound(
        cli: CLI, tmp_path: Path, tb3: Testbed) -> None:
    # A connect timeout far above the bound: the bound, not it, says when to stop waiting.
    tb3.inventory(tmp_path / "inv.toml", per_host={"node3": {"connect_timeout": 60}})
    path = job(tmp_path, 29933, '["sleep", "60"]')
    up = cli("up", "--detach", str(path), timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = run_id_of(up.stderr)
    drop = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"]
    assert tb3.exec("node3", "iptables", "-I", *drop).returncode == 0
    try:
        st = cli("status", run_id, timeout=30)  # half the connect timeout: no waiting it out
        assert st.returncode == 3, st.stdout + st.stderr
        for node in ("node1", "node2"):
            assert re.search(rf"^  {node} +node rank \d.*  running", st.stdout, re.M), st.stdout
        # the bound's words, not the connect timeout's
        assert re.search(r"^  node3 +node rank 2.*  unreachable \(may still be running\): "
                         r"node3: no answer to fleet's question \(connection and run state\) "
                         rf"after {recorded.ASK_S}s", st.stdout, re.M), st.stdout
        ps = cli("ps", timeout=120)
        assert re.search(rf"^{run_id} +unknown \(node3 unreachable\) ", ps.stdout, re.M), \
            ps.stdout
    finally:
        tb3.exec("node3", "iptables", "-D", *drop)
        stop = cli("stop", run_id, timeout=120)
        for h in tb3.hosts:
            for pid in tb3.run_processes(h.name, run_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    st = cli("status", run_id)
    assert re.search(r": stopped\n", st.stdout), st.stdout
    assert "  as fleet saw it end: exit 4, by fleet stop at " in st.stdout, st.stdout
