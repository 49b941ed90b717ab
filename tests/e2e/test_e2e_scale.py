"""64 hosts as an ordinary case: `fleet up` with its default preflight, `status`,
`exec`, `gpus`, `stop` and a fail-fast on 64 real sshd hosts with Debian's stock sshd_config
(MaxSessions 10, MaxStartups 10:30:100), a trivial job. Before the session budget, the
preflight's 63 port checks at once on the master's one connection failed about half the workers
with `ChannelException(2, 'Connect failed')`."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

N = 64


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    t0 = time.monotonic()
    with Testbed(N) as bed:
        print(f"\nscale: {N} hosts up in {time.monotonic() - t0:.1f}s")
        yield bed


def command_job(tmp_path: Path, port: int, script: str) -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "hello.txt").write_text("hello\n")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
                   f'command = ["sh", "-c", {script!r}]\nnproc_per_node = 1\n'
                   f"[rendezvous]\nport = {port}\n")
    return job


def running(status: str) -> list[str]:
    """The hosts that `fleet status` shows running (`node7   node rank 6  running  16s`)."""
    return re.findall(r"^\s*(node\d+) +node rank \d+ +running", status, re.M)


def lost_links(text: str) -> None:
    """Nothing refused for being one too many (the lines that say so first: a long output is
    cut where a report shows it)."""
    lost = [line for line in text.splitlines()
            if "Connect failed" in line or "lost connection" in line]
    assert not lost, "\n".join(lost[:20]) + "\n---\n" + text


def test_up_status_exec_gpus_stop_on_64_hosts(cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    tb.inventory(tmp_path / "inv.toml")
    job = command_job(tmp_path, 29741, 'echo "up on $(hostname)"; exec sleep 600')
    up = cli("up", "--detach", str(job), timeout=400)
    lost_links(up.stdout + up.stderr)
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = run_id_of(up.stderr)
    stopped = False
    try:
        for h in tb.hosts:  # every host runs it, seen from the host itself
            assert tb.run_processes(h.name, run_id), f"nothing of {run_id} on {h.name}"

        st = cli("status", run_id, timeout=300)
        lost_links(st.stdout + st.stderr)
        assert st.returncode == 0, st.stdout + st.stderr
        assert sorted(running(st.stdout)) == sorted(h.name for h in tb.hosts), st.stdout

        ex = cli("exec", str(tmp_path / "inv.toml"), "--", "cat", "/proc/sys/kernel/hostname",
                 timeout=300)
        lost_links(ex.stdout + ex.stderr)
        assert ex.returncode == 0, ex.stdout + ex.stderr
        assert f"fleet: {N} of {N} host(s) exited 0" in ex.stderr, ex.stderr
        assert sorted(re.findall(r"^node\d+$", ex.stdout, re.M)) == sorted(h.name for h in tb.hosts)

        gpus = cli("gpus", str(tmp_path / "inv.toml"), timeout=300)
        lost_links(gpus.stdout + gpus.stderr)
        assert gpus.returncode == 0, gpus.stdout + gpus.stderr
        assert len(re.findall(r"^node\d+\s+-\s+no nvidia-smi here", gpus.stdout, re.M)) == N, \
            gpus.stdout

        stop = cli("stop", run_id, timeout=300)
        lost_links(stop.stdout + stop.stderr)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        stopped = True
        assert_nothing_left(tb, run_id, timeout=60)
        after = cli("status", run_id, timeout=300)
        assert not running(after.stdout), after.stdout
    finally:  # a failure on the way must not leave 64 hosts held for the next test
        if not stopped:
            cli("stop", run_id, timeout=300)


def test_fail_fast_on_64_hosts_stops_every_other_host(cli: CLI, tb: Testbed,
                                                      tmp_path: Path) -> None:
    """Attached, logs streamed from 64 hosts; the last host fails and the 63 others are
    stopped."""
    tb.inventory(tmp_path / "inv.toml")
    job = command_job(tmp_path, 29742, 'echo "tick on $(hostname)"; '
                      'if [ "$(hostname)" = node64 ]; then sleep 2; exit 3; fi; exec sleep 600')
    up = cli("up", str(job), timeout=300)  # a hang guard: half the others' 600 s sleep
    lost_links(up.stdout + up.stderr)
    assert up.returncode != 0, up.stdout + up.stderr
    assert re.search(r"node64 .*failed", up.stderr), up.stderr
    for h in tb.hosts:
        assert f"tick on {h.name}\n" in up.stdout, f"{h.name}'s log line missing"
    assert_nothing_left(tb, run_id_of(up.stderr), timeout=60)
