"""Every word fleet prints of a run's end is true, end to end through the real CLI on two real
sshd hosts: nodes that failed by themselves are "failed" (never "stopped as a consequence"),
even where the job forges the stop record; a rank killed by SIGKILL is named as such with no
foreign lines for a traceback; an excerpt starts at its Traceback line; a `fleet stop` reads as
a stop in the attached stream, its noise kept in the node's log."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_lifetime import long_job, wait_for
from tests.e2e.test_e2e_up import assert_nothing_left, rows, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Every rank raises once all have joined (a missing driver, say). On the second node, the last
# local rank first ignores SIGTERM for a while: its torchrun is still closing it when the first
# node has ended and fleet's fail-fast stop arrives, although that node had failed by itself.
ALL_FAIL = '''
import os, signal, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
if os.environ.get("FORGE"):  # the job writes the stop record itself
    with open(os.path.join(os.environ["FLEET_RUN_DIR"], "stopped"), "w") as f:
        f.write("fleet stop\\n")
if int(os.environ["GROUP_RANK"]) == 1 and local == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(float(os.environ.get("LINGER_S", "8")))
raise RuntimeError(f"no CUDA driver found on rank {rank}")
'''

# Rank 1 prints what a healthy start prints (a c10d warning, a FutureWarning), then dies of
# SIGKILL (as under the OOM killer), or raises from a few frames deep; rank 0 waits.
ONE_DIES = '''
import os, signal, sys, time, warnings
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    print("[W415 socket.cpp:755] [c10d] The IPv6 network addresses of (node2, 29500) cannot "
          "be retrieved (gai error: -2 - Name or service not known).", file=sys.stderr)
    warnings.warn("torch.cuda.amp.autocast(args...) is deprecated", FutureWarning)
    sys.stderr.flush()
    if os.environ["HOW"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    def load(step):
        return {"a": 1}[step]
    def train():
        return load("b")
    train()
time.sleep(300)
'''


def job(tmp_path: Path, script: str, port: int, nproc: int, **env: object) -> Path:
    (tmp_path / "job.py").write_text(script)
    path = tmp_path / "job.toml"
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    path.write_text(f'inventory = "inv.toml"\nscript = "job.py"\nnproc_per_node = {nproc}\n'
                    f'[rendezvous]\nport = {port}\n[env]\n{env_lines}')
    return path


def summary_of(stderr: str) -> list[str]:
    """The lines of the first failure's account: its head and what is indented under it."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("fleet: first failure:"))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("fleet:     "):
            break
        block.append(line)
    return block


@pytest.mark.parametrize("forge", [False, True], ids=["plain", "forged-stop-record"])
def test_nodes_that_failed_by_themselves_are_failed_not_stopped(cli: CLI, tb2: Testbed,
                                                                 tmp_path: Path,
                                                                 forge: bool) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    env = {"FORGE": "1"} if forge else {}
    r = cli("up", str(job(tmp_path, ALL_FAIL, 29881 + forge, 2, **env)), timeout=300)
    out = r.stdout + r.stderr
    print(r.stderr)
    assert r.returncode == 1, out
    run_id = run_id_of(r.stderr)
    assert "stopped as a consequence" not in r.stderr, out
    assert not re.search(r"^fleet: node\d +stopped", r.stderr, re.M), out
    assert re.search(r"^fleet: node1 +failed \(exit 1\)$", r.stderr, re.M), out
    # node2 was still closing its last worker when fail-fast reached it: failed, and why.
    assert re.search(r"^fleet: node2 +failed: torchrun was already closing its workers after "
                     r"one had ended before the stop \(fail-fast: node1 failed\) reached it",
                     r.stderr, re.M), out
    assert "also failed: node2" in r.stderr, out
    assert "RuntimeError: no CUDA driver found on rank" in "\n".join(summary_of(r.stderr)), out
    assert_nothing_left(tb2, run_id)
    st = cli("status", run_id)
    assert st.returncode == 1, st.stdout + st.stderr
    assert re.search(rf"^run {run_id} .*: failed$", st.stdout, re.M), st.stdout
    assert len(rows("failed", st.stdout)) == 2, st.stdout
    assert "stopped" not in st.stdout.replace("before the stop", ""), st.stdout


def test_a_sigkilled_rank_is_named_with_no_foreign_traceback(cli: CLI, tb2: Testbed,
                                                             tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", str(job(tmp_path, ONE_DIES, 29883, 1, HOW="kill")), timeout=300)
    out = r.stdout + r.stderr
    print(r.stderr)
    assert r.returncode == 1, out
    assert "FutureWarning" in r.stdout, "the job printed its warnings"  # streamed
    summary = "\n".join(summary_of(r.stderr))
    assert summary.startswith("fleet: first failure: node2 (node rank 1), rank 1 (local rank 0)"
                              ", exit code -9: killed by SIGKILL"), out
    assert "no Python traceback" in summary and "OOM killer" in summary, summary
    assert "`dmesg` on node2" in summary, summary
    assert "node2's kernel log" in summary, summary  # read, as root (or said unreadable)
    assert "FutureWarning" not in summary and "c10d" not in summary, summary
    assert "Traceback" not in summary and "hint:" not in summary, summary
    assert_nothing_left(tb2, run_id_of(r.stderr))


def test_an_excerpt_starts_at_its_traceback_line(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", str(job(tmp_path, ONE_DIES, 29884, 1, HOW="raise")), timeout=300)
    out = r.stdout + r.stderr
    print(r.stderr)
    assert r.returncode == 1, out
    summary = summary_of(r.stderr)
    assert summary[0] == "fleet: first failure: node2 (node rank 1), rank 1 (local rank 0), " \
                         "exit code 1:", out
    assert summary[1] == "fleet:     Traceback (most recent call last):", summary
    assert summary[-1] == "fleet:     KeyError: 'b'", summary
    assert not any("FutureWarning" in s or "c10d" in s for s in summary), summary
    assert_nothing_left(tb2, run_id_of(r.stderr))


def test_a_fleet_stop_reads_as_a_stop_in_the_attached_stream(cli: CLI, tb2: Testbed,
                                                             tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    up = cli.popen("up", str(long_job(tmp_path, 29885)))
    try:
        runs = cli.cwd / ".fleet" / "runs"
        wait_for(lambda: any("tick 2" in p.read_text() for p in runs.glob("*/node2.log")),
                 180, "the job to run")
        run_id = next(runs.iterdir()).name
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        stop = subprocess.run([sys.executable, "-m", "fleet", "stop", run_id], cwd=elsewhere,
                              env=cli.env, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    print(err)
    assert up.returncode == 4, out + err
    assert f"run {run_id} was stopped by fleet stop" in err, err
    for noise in ("Traceback", "SignalException", "closing signal", "death signal", "failed"):
        assert noise not in out + err, out + err
    for node in ("node1", "node2"):
        assert re.search(rf"^fleet: {node} +what it prints while it is stopped \(fleet stop\) is "
                         rf"not shown here: `fleet logs {run_id} --node {node}` has it$", err,
                         re.M), err
    logs = cli("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    for node in ("node1", "node2"):
        mine = "\n".join(line for line in logs.stdout.splitlines() if line.startswith(node))
        assert f"[fleet] stopping run {run_id} on this node (fleet stop)" in mine, logs.stdout
        # torchrun's own words of the stop, kept out of the stream (its traceback only where
        # it outlives its workers' end: on a loaded machine the stop's KILL may come first)
        assert re.search(r"death signal|closing signal|SignalException", mine), mine
    assert_nothing_left(tb2, run_id)
