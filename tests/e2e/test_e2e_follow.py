"""`fleet logs -f` and `fleet ps --hosts` through the real CLI on real sshd hosts: the header
comes first and the run's lines follow it; Ctrl-C stops the following, says that the run goes on,
and the run does go on; `ps --hosts` says in words when nothing runs, and lists what does under
a header."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

TICKER = 'i=0\nwhile [ "$i" -lt 600 ]; do echo "tick $i"; i=$((i + 1)); sleep 0.1; done\n'


def ticker_job(tmp_path: Path, tb: Testbed) -> Path:
    tb.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "tick.sh").write_text(TICKER)
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
                   'command = ["sh", "tick.sh"]\nnproc_per_node = 1\n'
                   "[rendezvous]\nport = 29971\n")
    return job


def test_ps_hosts_says_when_nothing_runs(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    r = cli("ps", "--hosts", str(inv), timeout=120)
    assert (r.returncode, r.stdout) == (0, f"no run is running on any of the 2 hosts of {inv}\n"), r


def test_logs_follow_header_first_and_ctrl_c_leaves_the_run_going(cli: CLI, tb2: Testbed,
                                                                  tmp_path: Path) -> None:
    r = cli("up", "--detach", str(ticker_job(tmp_path, tb2)), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    try:
        p = cli.popen("logs", "-f", run_id)
        assert p.stdout is not None and p.stderr is not None
        first = p.stderr.readline()
        assert first.startswith(f"fleet: following run {run_id} (no end recorded yet) on "
                                "node1, node2, started "), first
        line = p.stdout.readline()  # the run's lines follow the header
        assert re.search(r"tick \d+$", line), line
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130, (out, err)
        assert err.splitlines()[-1] == (f"fleet: stopped following; run {run_id} goes on "
                                        f"(`fleet stop {run_id}` stops it)"), err
        assert "Traceback" not in err, err
        st = cli("status", run_id, timeout=120)  # and it does go on
        assert st.returncode == 0 and ": running" in st.stdout.splitlines()[0], st.stdout
        alive = cli("ps", "--hosts", str(tmp_path / "inv.toml"), timeout=120)
        assert alive.returncode == 0, alive.stderr
        assert re.match(r"RUN +STATE +HOST +AS NODE\n", alive.stdout), alive.stdout
        for host in ("node1", "node2"):  # each host, and the node it is in the run's record
            assert re.search(rf"^{run_id} +running +{host} +{host}$", alive.stdout, re.M), \
                alive.stdout
    finally:
        stop = cli("stop", run_id, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
