"""A detached run fails fast without the laptop: the nodes' own watchers (fleet/nodeside/
watcher.py) stop every node's part once a host is cut off (iptables DROP inside its namespace,
as a partition or a power cut looks), with no fleet process on this machine, and `status` then
names the lost host. Real sshd hosts, real torchrun with gloo: a cut-off peer holds the others
in their all_reduce until torch's own timeout (30 min), which is the point."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

AFTER = 4  # [watchdog] unreachable_after, seconds

# Every rank joins an all_reduce each 0.2 s, for ever: only a stop ends it.
FOREVER = '''import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} up", flush=True)
while True:
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.2)
'''


def forever_job(tmp_path: Path, port: int) -> Path:
    (tmp_path / "forever.py").write_text(FOREVER)
    job = tmp_path / "forever.toml"
    job.write_text('inventory = "inv.toml"\nscript = "forever.py"\nnproc_per_node = 1\n'
                   f"[rendezvous]\nport = {port}\n[watchdog]\nunreachable_after = {AFTER}\n")
    return job


def node_log(tb: Testbed, name: str, run_id: str) -> str:
    path = tb.host(name).home / "fleet" / "runs" / run_id / name / "node.log"
    return path.read_text(errors="replace") if path.exists() else ""


def run_files(tb: Testbed, names: tuple[str, ...], run_ids: tuple[str, ...]) -> dict[str, str]:
    """The tail of every file the named hosts hold for these runs (node logs, the watchers'
    own logs), to show why a wait ran out."""
    found = {}
    for name in names:
        for run_id in run_ids:
            root = tb.host(name).home / "fleet" / "runs" / run_id
            for path in sorted(root.rglob("*.log")) if root.exists() else []:
                found[f"{name}: {path.relative_to(root)}"] = path.read_text(errors="replace")[-800:]
    return found


def fleet_processes(cli: CLI) -> list[int]:
    """This test's fleet processes on this machine (by the state directory in their
    environment)."""
    mark = f"FLEET_STATE_DIR={cli.cwd / '.fleet'}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_a_cut_off_host_stops_a_detached_run_everywhere(cli: CLI, tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(3) as tb:
        tb.inventory(tmp_path / "inv.toml")
        r = cli("up", "--detach", str(forever_job(tmp_path, 29561)), timeout=180)
        assert r.returncode == 0, r.stderr
        run_id = run_id_of(r.stderr)
        deadline = time.monotonic() + 90
        while not all("up" in node_log(tb, h.name, run_id) for h in tb.hosts):
            assert time.monotonic() < deadline, {h.name: node_log(tb, h.name, run_id)[-500:]
                                                 for h in tb.hosts}
            time.sleep(0.5)
        assert fleet_processes(cli) == []  # nobody on this machine watches it
        s = cli("status", run_id, timeout=60)
        assert "watched by: the nodes' own watchers" in s.stdout, s.stdout

        tb.cut_off("node3")
        cut = time.monotonic()
        while any(tb.run_processes(n, run_id) for n in ("node1", "node2")):
            assert time.monotonic() - cut < AFTER + 20, {
                n: tb.run_processes(n, run_id) for n in ("node1", "node2")}
            time.sleep(0.2)
        print(f"node1 and node2 stopped {time.monotonic() - cut:.1f}s after the cut "
              f"(unreachable_after = {AFTER}s)")
        # The cut-off host's own watcher lost the master: its part is stopped too.
        while tb.run_processes("node3", run_id):
            assert time.monotonic() - cut < AFTER + 30, tb.run_processes("node3", run_id)
            time.sleep(0.5)
        assert fleet_processes(cli) == []

        s = cli("status", run_id, timeout=120)
        print(s.stdout)
        assert "fail-fast: node3 unreachable" in s.stdout, s.stdout + s.stderr
        # Not over where node3 cannot be asked: its own watcher is said to watch it.
        assert "watched by: the nodes' own watchers, where they still run" in s.stdout, s.stdout
        tb.reconnect("node3")
        s = cli("status", run_id, timeout=60)
        assert s.returncode == 4, s.stdout + s.stderr  # stopped, everywhere
        assert "fail-fast: node3 unreachable" in s.stdout, s.stdout
        assert "fail-fast: node1 unreachable" in s.stdout, s.stdout  # node3's own word
        assert "watched by" not in s.stdout, s.stdout


# Every rank joins an all_reduce each 0.2 s for 90 s (attempt 1) or 3 s (attempt 2), then ends
# well: a detached run that healed completes by itself.
TIMED = '''import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
attempt = os.environ.get("FLEET_ATTEMPT", "1")
print(f"rank {dist.get_rank()} up, attempt {attempt}", flush=True)
end = time.monotonic() + (3 if attempt == "2" else 90)
while time.monotonic() < end:
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.2)
print(f"rank {dist.get_rank()} done", flush=True)
dist.destroy_process_group()
'''


def test_a_detached_run_with_a_spare_heals_and_completes(cli: CLI, tmp_path: Path) -> None:
    """node3 cut off mid-run; node4, a spare, takes its rank in attempt 2, which the nodes'
    watchers start with nobody on this machine; `status` then says the run succeeded, the
    attempt and the replacement."""
    _need_testbed()
    with Testbed(4) as tb:
        tb.inventory(tmp_path / "inv.toml", per_host={"node4": {"spare": True}})
        (tmp_path / "timed.py").write_text(TIMED)
        job = tmp_path / "timed.toml"
        job.write_text('inventory = "inv.toml"\nscript = "timed.py"\nnproc_per_node = 1\n'
                       f"[rendezvous]\nport = 29563\n[watchdog]\nunreachable_after = {AFTER}\n"
                       "[restart]\nmax = 1\n")
        r = cli("up", "--detach", str(job), timeout=240)
        assert r.returncode == 0, r.stderr
        assert "healing prepared: attempt 2" in r.stderr, r.stderr
        run_id = run_id_of(r.stderr)
        deadline = time.monotonic() + 90
        while not all("up" in node_log(tb, n, run_id) for n in ("node1", "node2", "node3")):
            assert time.monotonic() < deadline, {n: node_log(tb, n, run_id)[-500:]
                                                 for n in ("node1", "node2", "node3")}
            time.sleep(0.5)
        assert fleet_processes(cli) == []

        tb.cut_off("node3")
        cut = time.monotonic()
        healed = f"{run_id}-a2"
        # Attempt 2 imports torch on three hosts again: bounded for a loaded machine, with
        # every file the watchers wrote shown if it is not done by then.
        while "done" not in node_log(tb, "node4", healed):
            assert time.monotonic() - cut < AFTER + 150, run_files(tb, ("node1", "node2", "node4"),
                                                                   (run_id, healed))
            time.sleep(0.5)
        print(f"attempt 2 done on node4 {time.monotonic() - cut:.1f}s after the cut")
        assert "attempt 2" in node_log(tb, "node4", healed)
        assert fleet_processes(cli) == []
        deadline = time.monotonic() + 180  # torchrun ending on three loaded hosts, and each
        #                                   status waits out the cut-off host (ASK_S)
        while True:
            s = cli("status", run_id, timeout=120)
            if s.returncode == 0 and "succeeded" in s.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        print(s.stdout)
        assert s.returncode == 0, s.stdout + s.stderr
        assert f"run {run_id}: succeeded, attempt 2/2, node3 replaced by node4 after node3 " \
               "was lost" in s.stdout, s.stdout
        assert "healed by the nodes' watchers" in s.stdout, s.stdout
        tb.reconnect("node3")
