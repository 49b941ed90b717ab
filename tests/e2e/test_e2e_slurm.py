"""fleet on a real Slurm (tests/slurmbed.py: slurmctld, munged and one slurmd per testbed host,
one shared home): the exported script submitted with plain sbatch, and `fleet up/stop/status`
on a [slurm] inventory whose login node is this machine."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_hang import HANG, STUCK_LINE
from tests.slurmbed import Slurm

pytestmark = pytest.mark.e2e

ALL_REDUCE = """\
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
os.write(1, f"rank {dist.get_rank()}/{dist.get_world_size()} on {os.uname().nodename} "
            f"sum {int(t.item())}\\n".encode())
dist.destroy_process_group()
"""

CRASH = """\
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} ready", flush=True)
if dist.get_rank() == 2:
    sys.exit("boom from rank 2")
time.sleep(300)
print(f"rank {dist.get_rank()} slept to the end", flush=True)
"""

SLEEP = """\
import os, time
print(f"rank {os.environ['RANK']} sleeping", flush=True)
time.sleep(300)
"""




def job_dir(slurm: Slurm, name: str, script: str, port: int, extra: str = "") -> Path:
    """A job in the testbed's directory (the same path on every node and here)."""
    d = slurm.tb.dir / name
    d.mkdir()
    (d / "train.py").write_text(script)
    (d / "job.toml").write_text(f'inventory = "cluster.toml"\nscript = "train.py"\n'
                                f'nproc_per_node = 2\n[rendezvous]\nport = {port}\n{extra}')
    (d / "cluster.toml").write_text(f'[slurm]\nlogin = "localhost"\nnodes = 2\n'
                                    f'partition = "{slurm.partition}"\ntime = 10\n'
                                    f'workdir = "{slurm.tb.dir}/fleet"\n'
                                    f'python = "{sys.executable}"\n')
    return d


def fleet(slurm: Slurm, tmp_path: Path) -> CLI:
    cli = CLI(tmp_path)
    cli.env.update(slurm.env)
    return cli


def processes(slurm: Slurm, job_id: int) -> dict[str, list[int]]:
    return {h.name: slurm.job_processes(h.name, job_id) for h in slurm.tb.hosts}


def assert_gone(slurm: Slurm, job_id: int, timeout: float = 15) -> float:
    """No process of the job on any host (slurmstepd may take a moment after the job's end);
    returns how long that took."""
    t0 = time.monotonic()
    while any((left := processes(slurm, job_id)).values()):
        if time.monotonic() - t0 > timeout:
            cmds = {n: [Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")[:80]
                        for p in pids] for n, pids in left.items()}
            raise AssertionError(f"processes of job {job_id} still alive: {cmds}")
        time.sleep(0.2)
    return time.monotonic() - t0


def job_id_of(stderr: str) -> int:
    m = re.search(r"submitted job (\d+)", stderr)
    assert m, stderr
    return int(m.group(1))


def run_id_of(stderr: str) -> str:
    m = re.search(r"run (\S+): ", stderr)
    assert m, stderr
    return m.group(1)


def test_exported_script_runs_with_plain_sbatch(slurm: Slurm, tmp_path: Path) -> None:
    d = job_dir(slurm, "exported", ALL_REDUCE, 29621)
    # A host list: the script expects the code where it is (a shared home), 2 nodes.
    (d / "hosts.toml").write_text(
        f'[defaults]\npython = "{sys.executable}"\n'
        + "".join(f'[[hosts]]\nname = "{h.name}"\naddress = "{h.addr}"\n'
                  for h in slurm.tb.hosts))
    script = d / "job.sbatch"
    r = fleet(slurm, tmp_path)("export", "slurm", str(d / "job.toml"), "-i",
                               str(d / "hosts.toml"), "-o", str(script), "--time", "5")
    assert r.returncode == 0, r.stderr
    t0 = time.monotonic()
    job = slurm.sbatch(script, "--wait", f"--chdir={d}", timeout=180)
    took = time.monotonic() - t0
    info = slurm.job(job)
    out = (d / f"job-{job}.out").read_text()
    assert info["JobState"] == "COMPLETED", out
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        # --label: the task (= node rank) first, then torchrun's local rank
        assert re.search(rf"^{rank // 2}: \[default{rank % 2}\]:rank {rank}/4 on {host} sum 10$",
                         out, re.M), out
    print(f"\nexported script: 2 nodes x 2 processes in {took:.1f}s")


def test_fleet_up_streams_tagged_lines(slurm: Slurm, tmp_path: Path) -> None:
    d = job_dir(slurm, "up", ALL_REDUCE, 29622)
    cli = fleet(slurm, tmp_path)
    r = cli("up", str(d / "job.toml"), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"{host} r{rank} | rank {rank}/4 on {host} sum 10" in r.stdout, r.stdout
    assert "preflight: sbatch --test-only accepts" in r.stderr
    assert "node1  node rank 0: succeeded" in r.stderr and \
        "node2  node rank 1: succeeded" in r.stderr, r.stderr
    run_id = run_id_of(r.stderr)
    s = cli("status", run_id)
    assert s.returncode == 0 and "succeeded" in s.stdout, s.stdout + s.stderr
    logs = cli("logs", run_id, "--rank", "3")
    assert logs.returncode == 0 and "node2 r3 | rank 3/4 on node2 sum 10" in logs.stdout
    assert "node1 r0" not in logs.stdout
    assert run_id in cli("ps").stdout


def test_a_crashing_rank_ends_the_allocation(slurm: Slurm, tmp_path: Path) -> None:
    d = job_dir(slurm, "crash", CRASH, 29623)
    # a hang guard at half the ranks' 300 s sleep: a crash that did not end them fails here
    r = fleet(slurm, tmp_path)("up", str(d / "job.toml"), timeout=150)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "node2 r2 | boom from rank 2" in r.stdout, r.stdout
    assert "first failure: node2 (node rank 1), rank 2" in r.stderr, r.stderr
    assert "node2  node rank 1: failed" in r.stderr, r.stderr
    assert "slept to the end" not in r.stdout, r.stdout  # the crash ended the sleeping ranks
    job = job_id_of(r.stderr)
    assert slurm.job(job)["JobState"] == "FAILED"
    after = assert_gone(slurm, job)
    print(f"\ncrash: the last process ended {after:.1f}s after fleet's exit")


def detached(slurm: Slurm, tmp_path: Path, name: str, script: str,
             port: int) -> tuple[CLI, int, str]:
    """`fleet up --detach` of a job: the CLI, Slurm's job id, fleet's run id."""
    d = job_dir(slurm, name, script, port)
    cli = fleet(slurm, tmp_path)
    r = cli("up", str(d / "job.toml"), "--detach", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return cli, job_id_of(r.stderr), run_id_of(r.stderr)


def test_stop_cancels_a_detached_run(slurm: Slurm, tmp_path: Path) -> None:
    cli, job, run_id = detached(slurm, tmp_path, "stop", SLEEP, 29624)
    deadline = time.monotonic() + 60
    while not all(processes(slurm, job).values()):
        assert time.monotonic() < deadline, "the job never ran on both nodes"
        time.sleep(0.5)
    assert cli("status", run_id).returncode == 0  # running
    s = cli("stop", run_id)
    assert s.returncode == 0, s.stdout + s.stderr
    assert slurm.run("squeue", "-h", "-j", str(job), check=False).stdout.strip() == ""
    assert_gone(slurm, job)
    st = cli("status", run_id)
    assert st.returncode == 4 and "stopped" in st.stdout, st.stdout + st.stderr


HANG_VERDICT = (f"rank 3 on node2 is in stuck_here() (train.py:{STUCK_LINE}); the other 3 "
                "rank(s) wait in all_reduce() (distributed_c10d.py:")
DUMP_VERDICT = HANG_VERDICT.replace("wait in", "are in")  # `fleet dump` calls nothing a hang


def test_watchdog_takes_the_stacks_on_the_nodes_and_cancels(slurm: Slurm,
                                                             tmp_path: Path) -> None:
    """A hang on Slurm: the stacks come from the compute nodes through a job step (no SSH to
    them), name the stuck rank, are kept, and the job is cancelled with nothing left."""
    # torchrun's torch import before the script's first line is not silence to judge: a bound
    # that this machine's load now does not reach (the hang tests' own)
    bound = slurm.tb.silence_bound("node2")
    d = job_dir(slurm, "hang", HANG, 29625, f"[watchdog]\nhang_timeout = {bound}\n")
    cli = fleet(slurm, tmp_path)
    r = cli("up", str(d / "job.toml"), timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no node has printed anything for" in r.stderr
    assert f"fleet:   {HANG_VERDICT}" in r.stderr, r.stderr
    assert re.search(rf"train\.py:{STUCK_LINE} in stuck_here", r.stderr)
    run_id, job = run_id_of(r.stderr), job_id_of(r.stderr)
    assert re.search(rf"error: run {run_id} hung: rank 3 on node2 is in stuck_here\(\)",
                     r.stderr), r.stderr
    assert "node1  node rank 0: stopped by scancel" in r.stderr, r.stderr
    assert slurm.job(job)["JobState"].startswith("CANCELLED")
    assert_gone(slurm, job)
    kept = list((cli.cwd / ".fleet" / "runs" / run_id).glob("stacks-*.txt"))
    assert len(kept) == 1 and "stuck_here" in kept[0].read_text()


def test_dump_of_a_running_job_leaves_it_running(slurm: Slurm, tmp_path: Path) -> None:
    cli, job, run_id = detached(slurm, tmp_path, "dump", HANG, 29626)
    deadline = time.monotonic() + 90
    while True:  # until every rank is in place (torch's import, the rendezvous)
        dumped = cli("dump", run_id, timeout=120)
        if DUMP_VERDICT in dumped.stdout or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert dumped.returncode == 0 and dumped.stdout.startswith(DUMP_VERDICT), \
        dumped.stdout + dumped.stderr
    assert slurm.job(job)["JobState"] == "RUNNING"
    assert all(processes(slurm, job).values())
    assert cli("stop", run_id).returncode == 0
    assert_gone(slurm, job)
    ended = cli("dump", run_id)
    assert ended.returncode == 0 and ended.stdout.startswith(
        f"the run is not running (Slurm job {job} is CANCELLED"), ended.stdout + ended.stderr


def test_a_node_without_torch_fails_the_preflight_before_anything_starts(
        slurm: Slurm, tmp_path: Path) -> None:
    d = job_dir(slurm, "notorch", ALL_REDUCE, 29627)
    text = (d / "cluster.toml").read_text().replace(f'python = "{sys.executable}"',
                                                      'python = "/usr/bin/python3"')
    (d / "cluster.toml").write_text(text)
    r = fleet(slurm, tmp_path)("up", str(d / "job.toml"), timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "preflight failed: nothing of the job started on any node" in r.stderr, r.stderr
    for node in ("node1", "node2"):
        assert f"{node}  /usr/bin/python3 has no torch" in r.stderr, r.stderr
    job = job_id_of(r.stderr)
    assert slurm.job(job)["JobState"] == "FAILED"
    assert "torch.distributed.run" not in r.stdout
    assert_gone(slurm, job)


def test_fleet_up_through_an_ssh_login_node(slurm: Slurm, tmp_path: Path) -> None:
    """The login node reached over SSH, as on a real cluster (node1 here): this machine has no
    Slurm settings of its own; the login shell's rc file gives the Slurm clients theirs (as a
    `module load slurm` would), and sync, submit, streaming, logs and status all go through it."""
    login = slurm.tb.hosts[0]
    rc = login.home / ".bashrc"
    before = rc.read_text() if rc.exists() else None
    rc.write_text((before or "") + f"export SLURM_CONF={slurm.conf}\n")
    try:
        d = job_dir(slurm, "ssh-login", ALL_REDUCE, 29628)
        tb = slurm.tb
        (d / "cluster.toml").write_text(
            f'[slurm]\nlogin = "{login.addr}"\nuser = "{tb.user}"\nidentity = "{tb.key}"\n'
            f'known_hosts = "{tb.known_hosts}"\nnodes = 2\npartition = "{slurm.partition}"\n'
            f'time = 10\nworkdir = "~/fleet-slurm"\npython = "{sys.executable}"\n')
        cli = CLI(tmp_path)
        assert "SLURM_CONF" not in cli.env
        r = cli("up", str(d / "job.toml"), timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"through {login.addr}" in r.stderr and \
            f"({login.home}/fleet-slurm/code/" in r.stderr, r.stderr
        for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
            assert f"{host} r{rank} | rank {rank}/4 on {host} sum 10" in r.stdout, r.stdout
        run_id = run_id_of(r.stderr)
        logs = cli("logs", run_id, "--rank", "2")
        assert logs.returncode == 0 and "node2 r2 | rank 2/4 on node2 sum 10" in logs.stdout
        s = cli("status", run_id)
        assert s.returncode == 0 and "succeeded" in s.stdout, s.stdout + s.stderr
    finally:
        if before is None:
            rc.unlink()
        else:
            rc.write_text(before)


def test_check_asks_slurm_without_submitting(slurm: Slurm, tmp_path: Path) -> None:
    d = job_dir(slurm, "check", ALL_REDUCE, 29629)
    cli = fleet(slurm, tmp_path)
    r = cli("check", "-v", str(d / "job.toml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^login\s+slurm clients\s+PASS", r.stdout, re.M), r.stdout
    assert re.search(r"^slurm\s+request\s+PASS\s+sbatch --test-only: sbatch: Job \d+ to start",
                     r.stdout, re.M), r.stdout
    assert re.search(r"^login\s+python\s+PASS\s+.*torch", r.stdout, re.M), r.stdout
    assert slurm.run("squeue", "-h", check=False).stdout.strip() == ""  # nothing submitted
    assert not list((slurm.tb.dir / "fleet" / "runs").glob(".check-*"))  # scratch removed
    text = (d / "cluster.toml").read_text()
    (d / "cluster.toml").write_text(text.replace(f'partition = "{slurm.partition}"',
                                                 'partition = "nope"'))
    bad = cli("check", str(d / "job.toml"))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert re.search(r"^slurm\s+request\s+FAIL\s+sbatch --test-only: .*[Pp]artition",
                     bad.stdout, re.M), bad.stdout


def test_detach_of_a_job_that_fails_exits_as_an_attached_up(slurm: Slurm,
                                                           tmp_path: Path) -> None:
    """`fleet up --detach` waits until every node has started its part; a job that fails before
    (here: the preflight, no torch on any node) is reported and exits 1, as `fleet up` and
    `fleet status` do, never 0 after saying FAILED."""
    d = job_dir(slurm, "detach-fail", ALL_REDUCE, 29630)
    text = (d / "cluster.toml").read_text().replace(f'python = "{sys.executable}"',
                                                      'python = "/usr/bin/python3"')
    (d / "cluster.toml").write_text(text)
    cli = fleet(slurm, tmp_path)
    r = cli("up", str(d / "job.toml"), "--detach", timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    run_id, job = run_id_of(r.stderr), job_id_of(r.stderr)
    assert "preflight failed: nothing of the job started on any node" in r.stderr, r.stderr
    assert f"slurm  job {job} FAILED, exit code 1" in r.stderr, r.stderr
    assert f"error: run {run_id} failed: Slurm job {job} FAILED" in r.stderr, r.stderr
    assert "follow it with" not in r.stderr, r.stderr
    assert slurm.job(job)["JobState"] == "FAILED"
    st = cli("status", run_id)
    assert st.returncode == 1 and "failed" in st.stdout, st.stdout + st.stderr
    assert_gone(slurm, job)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_show_and_diff_of_slurm_runs(slurm: Slurm, tmp_path: Path) -> None:
    """Every Slurm run keeps a manifest: `fleet show` prints the job id, the nodes with the
    versions the preflight read there, the script's env and command, the files' hashes;
    `fleet diff` names what changed between two runs (a detached one's nodes asked for
    through the login node once it ended), and where a host run differs in kind."""
    torch = importlib.metadata.version("torch")  # as the preflight reads it: no import
    d = job_dir(slurm, "manifests", ALL_REDUCE, 29631)
    cli = fleet(slurm, tmp_path)
    first = cli("up", str(d / "job.toml"), timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    run1, job1 = run_id_of(first.stderr), job_id_of(first.stderr)
    shown = cli("show", run1)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"run {run1}: job job ({d / 'job.toml'})", shown.stdout
    assert re.match(rf"slurm: job {job1} through localhost \({d / 'cluster.toml'}: nodes 2, "
                    rf"partition {slurm.partition}, time 10, .*\): COMPLETED on node\[1-2\]$",
                    lines[2]), shown.stdout
    python = ".".join(map(str, sys.version_info[:3]))
    for rank, node in enumerate(("node1", "node2")):
        assert f"[{node}] node rank {rank}, 2 process(es); python {python}, torch " \
               f"{torch}" in lines, shown.stdout
    assert f"  env FLEET_RUN_ID={run1}" in lines and "-m torch.distributed.run" in shown.stdout
    js = cli("show", run1, "--json")
    assert js.returncode == 0, js.stderr
    m = json.loads(js.stdout)
    assert m["slurm"]["job_id"] == str(job1) and m["slurm"]["complete"] is True
    assert m["files"]["train.py"] == sha256(d / "train.py")
    kept = slurm.tb.dir / "fleet" / "runs" / run1 / "manifest.json"
    assert json.loads(kept.read_text())["nodes"] == m["nodes"]  # the copy beside the script

    (d / "train.py").write_text(ALL_REDUCE + "# changed\n")
    second = cli("up", str(d / "job.toml"), "--detach", timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "every node (2) started" in second.stderr, second.stderr
    run2, job2 = run_id_of(second.stderr), job_id_of(second.stderr)
    assert cli("logs", "-f", run2, timeout=240).returncode == 0  # until the job ended
    changed = cli("diff", run1, run2)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert changed.stdout.splitlines() == ["file train.py: changed"], changed.stdout
    shown = cli("show", run2)
    assert shown.returncode == 0 and f"slurm: job {job2} " in shown.stdout, shown.stderr
    assert "COMPLETED on node[1-2]" in shown.stdout and \
        f"[node2] node rank 1, 2 process(es); python {python}" in shown.stdout, shown.stdout
    assert json.loads(cli("show", run2, "--json").stdout)["files"]["train.py"] == \
        sha256(d / "train.py")

    # The same job on a host list (this machine alone): a difference in kind, said as such.
    hosts = tmp_path / "hosts.toml"  # outside the job's directory: not one of its files
    hosts.write_text(f'[[hosts]]\nname = "here"\naddress = "localhost"\n'
                                  f'transport = "local"\nworkdir = "{tmp_path}/hostruns"\n'
                                  f'python = "{sys.executable}"\n')
    on_hosts = cli("up", str(d / "job.toml"), "-i", str(hosts), timeout=240)
    assert on_hosts.returncode == 0, on_hosts.stdout + on_hosts.stderr
    run3 = run_id_of(on_hosts.stderr)
    across = cli("diff", run2, run3)
    assert across.returncode == 0, across.stdout + across.stderr
    assert across.stdout.splitlines()[0] == (
        f"ran on: Slurm ({d / 'cluster.toml'}: job {job2} on node[1-2]) -> hosts "
        f"({hosts}: here)"), across.stdout
    assert "file " not in across.stdout  # the same files


def test_a_pending_job_says_why_it_waits(slurm: Slurm, tmp_path: Path) -> None:
    """With every node taken by another job, `fleet up` says the job is PENDING and Slurm's
    reason (once, not every poll); Ctrl-C then cancels it with nothing left; a second run
    starts once the nodes are free and says so."""
    blocker_script = slurm.tb.dir / "blocker.sh"
    blocker_script.write_text("#!/bin/sh\nsleep 600\n")
    blocker = slurm.sbatch(blocker_script, "-N2", "--exclusive", f"-p{slurm.partition}",
                           f"--chdir={slurm.tb.dir}", "--output=/dev/null")
    try:
        deadline = time.monotonic() + 60
        while slurm.job(blocker)["JobState"] != "RUNNING":
            assert time.monotonic() < deadline, slurm.job(blocker)
            time.sleep(0.2)
        d = job_dir(slurm, "pending", ALL_REDUCE, 29632)
        cli = fleet(slurm, tmp_path)
        waiting = re.compile(r"slurm  job (\d+) is PENDING \((Resources|Priority)\)$", re.M)

        first = Running(cli.popen("up", str(d / "job.toml")))
        said = first.wait_for(waiting)
        job = int(said.group(1))
        print(f"\npending: fleet said {said.group(0)!r}")
        assert slurm.job(job)["JobState"] == "PENDING"
        first.p.send_signal(signal.SIGINT)
        out, err = first.finish()
        assert first.p.returncode == 130, out + err
        assert f"Slurm job {job} was cancelled" in err, err
        assert slurm.job(job)["JobState"].startswith("CANCELLED")
        assert len(waiting.findall(err)) == 1, err  # said once, not every poll
        assert_gone(slurm, job)

        second = Running(cli.popen("up", str(d / "job.toml")))
        job = int(second.wait_for(waiting).group(1))
        slurm.run("scancel", str(blocker))
        out, err = second.finish()
        assert second.p.returncode == 0, out + err
        said = err[err.index(" is PENDING ("):]
        assert f"slurm  job {job} is RUNNING on node[1-2]" in said, err
        assert "node2 r3 | rank 3/4 on node2 sum 10" in out, out
        assert_gone(slurm, job)
    finally:
        slurm.run("scancel", str(blocker), check=False)


class Running:
    """A `fleet` process whose stderr is read as it comes."""

    def __init__(self, p: subprocess.Popen[str]) -> None:
        self.p = p
        self.err: list[str] = []
        self.out = ""
        self.readers = [threading.Thread(target=self._err, daemon=True),
                        threading.Thread(target=self._out, daemon=True)]
        for r in self.readers:
            r.start()

    def _err(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.err.append(line)

    def _out(self) -> None:
        assert self.p.stdout is not None
        self.out = self.p.stdout.read()

    def wait_for(self, pattern: re.Pattern[str], timeout: float = 180) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while not (m := pattern.search("".join(self.err))):
            if self.p.poll() is not None or time.monotonic() > deadline:
                self.p.kill()
                self.finish()
                raise AssertionError(f"no {pattern.pattern!r} in fleet's output: "
                                     f"{''.join(self.err)}")
            time.sleep(0.2)
        return m

    def finish(self, timeout: float = 240) -> tuple[str, str]:
        self.p.wait(timeout=timeout)
        for r in self.readers:
            r.join(timeout=10)
        return self.out, "".join(self.err)
