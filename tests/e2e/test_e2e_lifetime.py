"""The job's whole lifetime end to end: fail fast everywhere, stop, logs, status, lost nodes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_nothing_left, rows, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# A job whose ranks all_reduce once a second for minutes, printing numbered lines; one rank can
# be told to raise (with torchrun's @record, so its traceback lands in the error file).
LONG_JOB = '''
import os, sys, time
import torch, torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fail_rank = int(os.environ.get("FAIL_RANK", "-1"))
    ticks = int(os.environ.get("TICKS", "300"))
    for i in range(ticks):
        print(f"tick {i} of rank {rank}", flush=True)
        if rank == fail_rank and i == 3:
            raise RuntimeError(f"injected failure on rank {rank}")
        t = torch.ones(1)
        dist.all_reduce(t)
        time.sleep(float(os.environ.get("TICK_S", "1")))
    print(f"rank {rank} finished", flush=True)
    dist.destroy_process_group()

main()
'''


def long_job(tmp_path: Path, port: int, nproc: int = 1, **env: object) -> Path:
    (tmp_path / "long.py").write_text(LONG_JOB)
    job = tmp_path / "long.toml"
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    job.write_text(f'inventory = "inv.toml"\nscript = "long.py"\nnproc_per_node = {nproc}\n'
                   f'[rendezvous]\nport = {port}\n[env]\n{env_lines}')
    return job


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_rank_failure_on_a_worker_node_stops_all_three_hosts(cli: CLI, tb3: Testbed,
                                                             tmp_path: Path) -> None:
    tb3.inventory(tmp_path / "inv.toml")
    job = long_job(tmp_path, 29521, FAIL_RANK=1)
    r = cli("up", str(job), timeout=200)  # a hang guard: the others' 300 ticks take 300 s
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert not re.search(r"rank \d finished|tick 299 ", r.stdout), "the others were not stopped"
    assert "stopping the job on every other node" in r.stderr, out
    assert "first failure: node2 (node rank 1), rank 1 (local rank 0), exit code 1:" in r.stderr, \
        out
    assert "RuntimeError: injected failure on rank 1" in r.stderr, out
    # The others either noticed the lost peer and failed by themselves first, or were stopped
    # by fleet: each is named as one or the other, never as the cause.
    after = " ".join(re.findall(r"(?:also failed|stopped as a consequence): (.*)$", r.stderr,
                                re.M))
    assert sorted(after.replace(",", " ").split()) == ["node1", "node3"], out
    assert_nothing_left(tb3, run_id_of(r.stderr))


def test_stop_from_another_process_touches_nothing_else(cli: CLI, tb2: Testbed,
                                                        tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = long_job(tmp_path, 29522)
    # Unrelated processes on node1: a plain one, and one that even looks like another fleet run.
    bystanders = [subprocess.Popen(["ip", "netns", "exec", tb2.hosts[0].ns, "env",
                                    f"FLEET_RUN_ID={rid}", "sleep", "300"],
                                   start_new_session=True) for rid in ("other-run", "")]
    try:
        up = cli.popen("up", str(job))
        try:
            wait_for(lambda: list((cli.cwd / ".fleet" / "runs").glob("*/node2.log")) and
                     "tick 2" in next((cli.cwd / ".fleet" / "runs").glob("*/node2.log"))
                     .read_text(), 120, "the job to run")
            run_id = next((cli.cwd / ".fleet" / "runs").iterdir()).name
            t0 = time.monotonic()
            elsewhere = tmp_path / "elsewhere"  # any directory: runs are found by id
            elsewhere.mkdir()
            r = subprocess.run([sys.executable, "-m", "fleet", "stop", run_id], cwd=elsewhere,
                               env=cli.env, capture_output=True, text=True, timeout=120)
            stop_s = time.monotonic() - t0
            assert r.returncode == 0, r.stdout + r.stderr
            assert "nothing of the run left" in r.stderr
            assert_nothing_left(tb2, run_id, timeout=1)
            assert all(b.poll() is None for b in bystanders), "fleet stop killed a bystander"
            out, err = up.communicate(timeout=60)
            # The attached `up` tells it as it is: stopped by `fleet stop`, not failed.
            assert up.returncode == 4, out + err
            assert f"run {run_id} was stopped by fleet stop" in err, err
            assert "failed" not in err, err
            again = cli("stop", run_id)  # safe to repeat
            assert again.returncode == 0, again.stderr
            st = cli("status", run_id)
            assert st.returncode == 4, st.stdout
            assert len(rows(r"stopped \(exit \d+\) by fleet stop", st.stdout)) \
                == 2, st.stdout
            print(f"stop took {stop_s:.2f}s")
        finally:
            if up.poll() is None:
                up.kill()
    finally:
        for b in bystanders:
            b.kill()
            b.wait()


def check_ticks(stdout: str, ranks: int, ticks: int) -> None:
    """Every rank's every line exactly once, in order: nothing lost, nothing repeated."""
    for rank in range(ranks):
        seen = [int(m) for m in re.findall(rf"\| tick (\d+) of rank {rank}$", stdout, re.M)]
        assert seen == list(range(ticks)), f"rank {rank}: {seen}"
        assert stdout.count(f"rank {rank} finished") == 1


def test_detach_then_logs_follow_and_status(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = long_job(tmp_path, 29523, TICKS=20, TICK_S=0.3)
    r = cli("up", "--detach", str(job))
    assert r.returncode == 0, r.stderr
    run_id = run_id_of(r.stderr)
    assert "finished" not in r.stdout
    logs = cli("logs", "-f", run_id, timeout=180)
    assert logs.returncode == 0, logs.stderr
    check_ticks(logs.stdout, 2, 20)
    st = cli("status", run_id)
    assert len(rows(r"succeeded \(exit 0\)", st.stdout)) == 2, st.stdout
    one = cli("logs", run_id, "--node", "node2")
    assert "rank 1 finished" in one.stdout and "rank 0 finished" not in one.stdout
    by_rank = cli("logs", run_id, "--rank", "0")
    assert "rank 0 finished" in by_rank.stdout and "tick 0 of rank 1" not in by_rank.stdout
    assert (cli.cwd / ".fleet" / "runs" / run_id / "node1.log").is_file()


def test_killed_control_process_then_logs_and_status(cli: CLI, tb2: Testbed,
                                                     tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = long_job(tmp_path, 29524, TICKS=25, TICK_S=0.3)
    up = cli.popen("up", str(job))
    runs = cli.cwd / ".fleet" / "runs"
    wait_for(lambda: any("tick 3" in p.read_text() for p in runs.glob("*/node1.log")), 120,
             "the job to print")
    os.kill(up.pid, signal.SIGKILL)
    up.wait()
    run_id = next(runs.iterdir()).name
    logs = cli("logs", "-f", run_id, timeout=180)
    check_ticks(logs.stdout, 2, 25)
    st = cli("status")
    assert st.stdout.count("succeeded (exit 0)") == 2, st.stdout


def test_cut_link_is_reported_unreachable_and_the_rest_stopped(cli: CLI, tb2: Testbed,
                                                               tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = long_job(tmp_path, 29525)
    up = cli.popen("up", str(job))
    runs = cli.cwd / ".fleet" / "runs"
    node2 = tb2.hosts[1]
    try:
        wait_for(lambda: any("tick 2" in p.read_text() for p in runs.glob("*/node2.log")), 120,
                 "the job to run")
        run_id = next(runs.iterdir()).name
        subprocess.run(["ip", "link", "set", node2.veth, "down"], check=True)
        out, err = up.communicate(timeout=120)
        # Not "failed": what runs on node2 cannot be known, and fleet says how to finish.
        assert up.returncode == 3, out + err
        assert re.search(r"node2 \(node rank 1\) is unreachable", err), err
        assert "node2 could not be reached: its part of the run may still be running" in err, err
        assert f"stop it with `fleet stop {run_id}` once it answers" in err, err
        assert re.search(r"node1  stopped \(exit \d+\) by fail-fast: node2 unreachable", err), err
        assert_nothing_left_on(tb2, "node1", run_id)
        st = cli("status", run_id)
        assert st.returncode == 3, st.stdout
        assert re.search(r"node2 .*unreachable \(may still be running\)", st.stdout), st.stdout
        assert re.search(r"run \S+ .*: unknown$", st.stdout, re.M), st.stdout
    finally:
        subprocess.run(["ip", "link", "set", node2.veth, "up"], check=True)
        if up.poll() is None:
            up.kill()
    # With the link back, `fleet stop` clears what the cut left behind on node2.
    stop = cli("stop", run_id)
    assert stop.returncode == 0, stop.stderr
    assert_nothing_left(tb2, run_id, timeout=5)


def assert_nothing_left_on(tb: Testbed, host: str, run_id: str, timeout: float = 20) -> None:
    wait_for(lambda: not tb.run_processes(host, run_id), timeout, f"{run_id} gone on {host}")


def test_ctrl_c_stops_the_job_everywhere(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = long_job(tmp_path, 29526)
    up = cli.popen("up", str(job))
    runs = cli.cwd / ".fleet" / "runs"
    try:
        wait_for(lambda: any("tick 1" in p.read_text() for p in runs.glob("*/node2.log")), 120,
                 "the job to run")
        up.send_signal(signal.SIGINT)
        out, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 130, err
    assert "fleet: interrupted (SIGINT): the job was stopped on every node" in err, err
    assert "Traceback" not in err
    assert_nothing_left(tb2, next(runs.iterdir()).name, timeout=5)
