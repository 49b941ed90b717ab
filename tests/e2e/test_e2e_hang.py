"""Hangs end to end through the real CLI: a rank stuck in a function of its own while the
others wait in all_reduce is named with that function (fleet up's watchdog, then nothing is
left anywhere; fleet dump on a detached run, which goes on), and a node that never joins the
rendezvous is named."""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLI, JOBS
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

HANG = '''import threading
import time

# Until every rank is in place, a line every half second: a slow start (torch's import on a
# loaded machine) is not silence.
placed = threading.Event()

def tick():
    while not placed.wait(0.5):
        print("starting", flush=True)

threading.Thread(target=tick, daemon=True).start()

import torch, torch.distributed as dist

def stuck_here():
    time.sleep(600)

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} ready", flush=True)
placed.set()
if dist.get_rank() == 3:
    stuck_here()
t = torch.ones(1)
dist.all_reduce(t)
print("unreachable", flush=True)
'''
STUCK_LINE = HANG.splitlines().index("    time.sleep(600)") + 1
VERDICT = (f"rank 3 on node2 is in stuck_here() (hang.py:{STUCK_LINE}); the other 3 rank(s) "
           "wait in all_reduce() (distributed_c10d.py:")
DUMP_VERDICT = VERDICT.replace("wait in", "are in")  # `fleet dump` calls nothing a hang


def hang_job(tmp_path: Path, port: int, watchdog: str = "") -> Path:
    (tmp_path / "hang.py").write_text(HANG)
    job = tmp_path / "job.toml"
    job.write_text(f'inventory = "inv.toml"\nscript = "hang.py"\nnproc_per_node = 2\n'
                   f"[rendezvous]\nport = {port}\n{watchdog}")
    return job


def test_watchdog_names_the_stuck_rank_and_stops_the_run(cli: CLI, tb2: Testbed,
                                                         tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    # At least 12 s, more on a loaded machine: torchrun can import torch for longer than a
    # short bound before any rank prints, and that silence would rightly be a startup hang.
    bound = tb2.silence_bound("node2")
    job = hang_job(tmp_path, 29551, f"[watchdog]\nhang_timeout = {bound}\n")
    r = cli("up", str(job), timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no node has printed anything for" in r.stderr
    assert f"fleet:   {VERDICT}" in r.stderr, r.stderr
    # Each stack once, with the ranks that share it: the odd one's own function in it.
    assert "rank 3 on node2 (1 process(es)), most recent call first:" in r.stderr
    assert re.search(r"ranks 0-1 on node1, rank 2 on node2 \(3 process\(es\)\)", r.stderr)
    assert re.search(rf"hang\.py:{STUCK_LINE} in stuck_here", r.stderr)
    run_id = run_id_of(r.stderr)
    assert re.search(rf"error: run {run_id} hung: rank 3 on node2 is in stuck_here\(\)", r.stderr)
    assert len(re.findall(rf"node\d  stopped \(exit \d+.*\) by watchdog: no output for {bound}s "
                          r"\(a hang\)", r.stderr)) == 2, r.stderr
    assert "unreachable" not in r.stdout
    kept = list((cli.cwd / ".fleet" / "runs" / run_id).glob("stacks-*.txt"))
    assert len(kept) == 1 and VERDICT in kept[0].read_text()
    assert_nothing_left(tb2, run_id)


def test_dump_shows_the_stacks_of_a_detached_run_and_leaves_it_running(cli: CLI, tb2: Testbed,
                                                                      tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", str(hang_job(tmp_path, 29552)), "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    try:
        wait_for(lambda: cli("logs", run_id).stdout.count(" ready") == 4, 60, "4 ranks ready")
        time.sleep(1)  # rank 3 into stuck_here, the others into all_reduce
        d = cli("dump", run_id)
        assert d.returncode == 0, d.stdout + d.stderr
        assert d.stdout.startswith(DUMP_VERDICT), d.stdout  # a snapshot: no rank "waits"
        assert "kept in" in d.stderr
        st = cli("status", run_id)
        assert st.returncode == 0 and st.stdout.count("running") >= 2, st.stdout
        assert len(tb2.run_processes("node1", run_id)) >= 3  # torchrun and its two workers
        again = cli("dump", run_id)
        assert again.stdout.startswith(DUMP_VERDICT), again.stdout  # a second dump works too
    finally:
        s = cli("stop", run_id)
    assert s.returncode == 0, s.stdout + s.stderr
    assert_nothing_left(tb2, run_id)


def test_startup_hang_names_the_node_that_never_joined(cli: CLI, tb2: Testbed,
                                                       tmp_path: Path) -> None:
    """node2's python sleeps before torchrun starts: node1 waits at the rendezvous."""
    slow = tb2.host("node2").home / "slowpy"
    slow.write_text("#!/bin/sh\ncase \"$*\" in *torch.distributed.run*) sleep 600;; esac\n"
                    f'exec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    tb2.inventory(tmp_path / "inv.toml", per_host={"node2": {"python": str(slow)}})
    job = hang_job(tmp_path, 29553, "[watchdog]\nhang_timeout = 4\n")
    r = cli("up", str(job), timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "fleet:   no rank has started on any node: the rendezvous is incomplete" in r.stderr
    assert re.search(r"fleet:   node2 has not joined the rendezvous: it is running /bin/sh "
                     rf"{slow} -m torch.distributed.run .*; sleep 600", r.stderr), r.stderr
    assert "fleet:   node1 waits at the rendezvous" in r.stderr
    assert_nothing_left(tb2, run_id_of(r.stderr))


def test_up_debug_renders_the_distributed_debugging_env(cli: CLI, tb2: Testbed,
                                                        tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    job = tmp_path / "ar.toml"
    # jobs/allreduce.py ends with destroy_process_group(): without it, torch's DETAIL wrapper
    # may abort at exit ("terminate called without an active exception").
    shutil.copy(JOBS / "allreduce.py", tmp_path / "allreduce.py")
    job.write_text('inventory = "inv.toml"\nscript = "allreduce.py"\n'
                   "[rendezvous]\nport = 29554\n")
    r = cli("up", str(job), "--debug", "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    # torchrun's INFO log (LOGLEVEL=INFO) on every node: the rendezvous and its ranks.
    for node in ("node1", "node2"):
        assert re.search(rf"^{node} \| .*Rendezvous complete for workers", r.stdout, re.M), \
            r.stdout
    assert "Traceback" not in r.stderr  # `up --debug` is the job's, not fleet's traceback
    plan = cli("plan", str(job), "--debug")
    for line in ("env NCCL_DEBUG=INFO", "env NCCL_DEBUG_SUBSYS=INIT,NET",
                 "env TORCH_DISTRIBUTED_DEBUG=DETAIL", "env TORCH_CPP_LOG_LEVEL=INFO"):
        assert line in plan.stdout, plan.stdout
