"""The Slurm test bed itself (tests/slurmbed.py), seen with Slurm's own clients and from inside
the hosts: jobs run on the testbed's hosts, under their names, where fleet can see them over
SSH, and cancel and fail like on a real cluster."""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.slurmbed import Slurm

pytestmark = pytest.mark.e2e

ALL_REDUCE = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
# One write per line: the two ranks of a node share torchrun's stdout.
os.write(1, f"rank {dist.get_rank()} on {os.uname().nodename} sum {int(t.item())}\\n".encode())
dist.destroy_process_group()
"""




def job_script(slurm: Slurm, name: str, body: str) -> Path:
    """A batch script in the shared home (every node and this machine see the same file)."""
    home = slurm.tb.hosts[0].home
    path = home / f"{name}.sh"
    path.write_text(f"#!/bin/bash\n{body}\n")
    return path


def batch(slurm: Slurm, name: str, body: str, *args: str, timeout: float = 60,
          ) -> tuple[int, Path]:
    """sbatch over both nodes, output in the shared home; the job id and the output file."""
    home = slurm.tb.hosts[0].home
    out = home / f"{name}.out"
    job = slurm.sbatch(job_script(slurm, name, body), "-N2", "--ntasks-per-node=1",
                       f"--chdir={home}", f"--output={out}", f"--job-name={name}", *args,
                       timeout=timeout)
    return job, out


def wait_for(what: str, ok: Callable[[], bool], timeout: float, step: float = 0.05) -> float:
    """Seconds until ok() (bounded)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ok():
            return time.monotonic() - t0
        time.sleep(step)
    raise AssertionError(f"not within {timeout}s: {what}")


def ssh(slurm: Slurm, name: str, command: str) -> subprocess.CompletedProcess[str]:
    tb = slurm.tb
    cfg = tb.ssh_config(tb.dir / "ssh_config")
    return subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "-o",
                           "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5",
                           tb.host(name).addr, command],
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def tasks(slurm: Slurm, name: str, job: int) -> list[int]:
    """The job's processes on host `name` but its slurmstepds."""
    found = []
    for pid in slurm.job_processes(name, job):
        with contextlib.suppress(OSError):
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"slurmstepd:"):
                found.append(pid)
    return found


def test_nodes_idle(slurm: Slurm) -> None:
    out = slurm.run("sinfo", "-h", "-N", "-o", "%N %P %t %c").stdout
    assert sorted(out.splitlines()) == ["node1 debug* idle 2", "node2 debug* idle 2"], out


def test_batch_step_runs_on_each_host(slurm: Slurm) -> None:
    job, out = batch(slurm, "hello",
                     "srun --kill-on-bad-exit=1 bash -c 'echo $(hostname) $SLURM_NODEID $PWD'")
    assert slurm.wait(job)["JobState"] == "COMPLETED", out.read_text()
    home = slurm.tb.hosts[0].home
    assert sorted(out.read_text().splitlines()) == [f"node1 0 {home}", f"node2 1 {home}"]


def test_torchrun_all_reduce_across_hosts(slurm: Slurm) -> None:
    home = slurm.tb.hosts[0].home
    (home / "all_reduce.py").write_text(ALL_REDUCE)
    # The node rank is each task's own: escaped here, expanded by the task's shell.
    body = f"""\
master=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export GLOO_SOCKET_IFNAME=eth0
srun --kill-on-bad-exit=1 bash -c "exec {shlex.quote(sys.executable)} -m torch.distributed.run \\
  --nnodes 2 --nproc-per-node 2 --node-rank \\$SLURM_NODEID --master-addr $master \\
  --master-port 29500 {shlex.quote(str(home / 'all_reduce.py'))}"
"""
    t0 = time.monotonic()
    job, out = batch(slurm, "torchrun", body)
    info = slurm.wait(job, timeout=240)
    print(f"\nslurm: 2-node torchrun job took {time.monotonic() - t0:.1f}s")
    text = out.read_text()
    assert info["JobState"] == "COMPLETED", text
    sums = sorted(re.findall(r"rank \d+ on \S+ sum \d+", text))
    assert sums == ["rank 0 on node1 sum 4", "rank 1 on node1 sum 4",
                    "rank 2 on node2 sum 4", "rank 3 on node2 sum 4"], text


def test_scancel_leaves_nothing_on_either_host(slurm: Slurm) -> None:
    job, out = batch(slurm, "sleeper", "srun --kill-on-bad-exit=1 sleep 3599.25")
    names = ["node1", "node2"]

    def sleeping(name: str) -> bool:
        for pid in slurm.job_processes(name, job):
            with contextlib.suppress(OSError):
                if b"sleep\x003599.25\x00" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
        return False

    wait_for("the job's sleep on both hosts", lambda: all(sleeping(n) for n in names), 30)
    # What fleet will see: the step's process, over SSH, in the host's own process table.
    for name in names:
        r = ssh(slurm, name, f"grep -lzx SLURM_JOB_ID={job} /proc/[0-9]*/environ; "
                             "cat /proc/sys/kernel/hostname")
        assert r.returncode == 0, r.stderr
        *found, hostname = r.stdout.splitlines()
        assert found and hostname == name, r.stdout
    slurm.run("scancel", str(job))
    # the hour-long sleep ended by the cancel (a hang guard of 20 s, no measurement)
    took = wait_for("no process of the job on either host",
                    lambda: not any(slurm.job_processes(n, job) for n in names), 20)
    print(f"\nslurm: scancel -> nothing left on both hosts in {took:.2f}s")
    wait_for("the job to end", lambda: slurm.job(job)["JobState"] == "CANCELLED", 10)


def test_rank_crash_ends_the_job(slurm: Slurm) -> None:
    """One task exits 3 after a second; --kill-on-bad-exit ends the other, sleeping one (for
    an hour, were it not ended) and the job. Printed, not asserted: the time from the failing
    task's own clock reading to the job's end."""
    home = slurm.tb.hosts[0].home
    crashed = home / "crashed-at"
    crashed.unlink(missing_ok=True)
    body = ("srun --kill-on-bad-exit=1 bash -c 'if [ $SLURM_NODEID = 1 ]; then sleep 1; "
            f"date +%s.%N > {crashed}; exit 3; fi; exec sleep 3599.75'")
    job, out = batch(slurm, "crash", body)
    info = slurm.wait(job, timeout=60, step=0.02)  # a hang guard: the sleep would take an hour
    took = time.time() - float(crashed.read_text())
    nodes = ("node1", "node2")
    wait_for("no task of the job on either host",
             lambda: not any(tasks(slurm, n, job) for n in nodes), 10, step=0.02)
    tasks_gone = time.time() - float(crashed.read_text())
    wait_for("no process of the job (its slurmstepds too) on either host",
             lambda: not any(slurm.job_processes(n, job) for n in nodes), 10)
    gone = time.time() - float(crashed.read_text())
    print(f"\nslurm: a task's exit 3 -> job {info['JobState']} in {took:.2f}s, its other task "
          f"gone in {tasks_gone:.2f}s, its slurmstepds in {gone:.2f}s")
    text = out.read_text()
    # The batch script ends with srun's status: the highest of its tasks' (3, or 128 + 15 for
    # the task that --kill-on-bad-exit terminated), and srun names the task that failed.
    assert info["JobState"] == "FAILED" and info["ExitCode"] in ("3:0", "143:0"), info
    assert re.search(r"task 1: Exited with exit code 3", text), text
