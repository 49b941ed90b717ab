"""Ctrl-C of `fleet up` on a real Slurm (tests/slurmbed.py) leaves nothing behind: while the
job runs, fleet cancels it, says so and exits 130, and no process of the job is left on any
node; a second Ctrl-C, even one that lands while scancel is still under way, does not cut the
cancel short; before the submission (the data still on its way to the login node), nothing is
submitted, fleet says so, nothing is left on the login node, and `fleet status` never calls
that run unknown.

SIGINT goes to fleet's own PID, as a terminal's Ctrl-C reaches it: fleet runs the Slurm
clients in sessions of their own, so the terminal's signal never reaches them."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_slurm import (
    SLEEP,
    Running,
    assert_gone,
    fleet,
    job_dir,
    job_id_of,
    processes,
    run_id_of,
)
from tests.slurmbed import SLURMD, Slurm

pytestmark = pytest.mark.e2e

MB = 1 << 20
SUBMITTED = re.compile(r"submitted job (\d+)")
RANKS = ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2"))
# A hang guard from SIGINT to fleet's exit (scancel and one look at the job): well under the
# 60 s (CANCEL_WAIT_S) that fleet gives the job's end before it gives up waiting, so a fleet
# that waits that out fails the call.
EXIT_S = 40.0


class Streamed(Running):
    """Running, with stdout too read line by line as it comes (the ranks' tagged lines)."""

    def _out(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.out += line

    def wait_out(self, done: Callable[[str], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.out):
            if self.p.poll() is not None or time.monotonic() > deadline:
                self.p.kill()
                out, err = self.finish()
                raise AssertionError(f"not on fleet's stdout in {timeout:.0f}s:\n{out}\n{err}")
            time.sleep(0.2)


def every_rank_sleeps(out: str) -> bool:
    return all(f"{host} r{rank} | rank {rank} sleeping" in out for rank, host in RANKS)


def wait_file(path: Path, run: Running, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if run.p.poll() is not None or time.monotonic() > deadline:
            run.p.kill()
            out, err = run.finish()
            raise AssertionError(f"no {path} in {timeout:.0f}s:\n{out}\n{err}")
        time.sleep(0.05)


@dataclass
class InterruptedRun:
    """A `fleet up` Ctrl-C'd while its job ran: its exit code, output, Slurm's job id and
    fleet's run id."""

    cli: CLI
    code: int
    out: str
    err: str
    job: int
    run_id: str


def interrupt_running(slurm: Slurm, tmp_path: Path, name: str, port: int,
                      then: Callable[[Running, int], None] = lambda run, job: None,
                      cli: CLI | None = None) -> InterruptedRun:
    """`fleet up` of SLEEP (2 nodes x 2 ranks), SIGINT once every rank printed its line (and
    Slurm says RUNNING, and each node has processes of the job), then then(run, job)."""
    d = job_dir(slurm, name, SLEEP, port)
    cli = cli or fleet(slurm, tmp_path)
    run = Streamed(cli.popen("up", str(d / "job.toml")))
    job: int | None = None
    try:
        job = int(run.wait_for(SUBMITTED).group(1))
        run.wait_out(every_rank_sleeps)
        assert slurm.job(job)["JobState"] == "RUNNING"
        assert all(processes(slurm, job).values()), processes(slurm, job)
        run.p.send_signal(signal.SIGINT)
        then(run, job)
        out, err = run.finish(timeout=EXIT_S)
        assert run.p.returncode is not None
        return InterruptedRun(cli, run.p.returncode, out, err, job, run_id_of(err))
    finally:
        if run.p.poll() is None:
            run.p.kill()
            run.p.wait(timeout=30)
        if job is not None:  # whatever happened, no job of this test outlives it
            slurm.run("scancel", str(job), check=False)


def assert_cancelled(slurm: Slurm, r: InterruptedRun) -> None:
    """fleet said it cancelled the job, Slurm agrees, nothing of it runs anywhere, and `fleet
    status` calls the run stopped."""
    assert r.code == 130, r.out + r.err
    assert job_id_of(r.err) == r.job
    assert f"fleet: interrupted (SIGINT): Slurm job {r.job} was cancelled (CANCELLED)" in r.err, \
        r.err
    assert r.err.count(f"cancelling Slurm job {r.job}") == 1, r.err  # one cancel, not two
    assert "Traceback" not in r.err, r.err
    assert "after scancel" not in r.err, r.err  # it saw the job end, not its wait run out
    assert slurm.job(r.job)["JobState"] == "CANCELLED"
    after = assert_gone(slurm, r.job)
    assert slurm.run("squeue", "-h", "-j", str(r.job), check=False).stdout.strip() == ""
    st = r.cli("status", r.run_id)
    lines = st.stdout.splitlines()
    assert st.returncode == 4 and lines and lines[0].endswith(": stopped"), \
        st.stdout + st.stderr
    assert f"  slurm job {r.job}: CANCELLED" in st.stdout, st.stdout
    print(f"\nthe job's last process ended {after:.1f}s after fleet's exit")


def test_ctrl_c_while_the_job_runs_cancels_it(slurm: Slurm, tmp_path: Path) -> None:
    r = interrupt_running(slurm, tmp_path, "int-run", 29641)
    assert_cancelled(slurm, r)
    # what fleet had shown of the job before: every rank's line, tagged
    assert every_rank_sleeps(r.out), r.out


def test_two_quick_ctrl_cs_still_cancel_the_job(slurm: Slurm, tmp_path: Path) -> None:
    """Two SIGINTs 5 ms apart (as `timeout` or a terminal multiplexer sends them). Where the
    second lands is up to the timing, mostly while fleet still unwinds from the first, before
    its scancel: the next test makes it land during the cancel."""

    def again(run: Running, job: int) -> None:
        time.sleep(0.005)
        run.p.send_signal(signal.SIGINT)

    assert_cancelled(slurm, interrupt_running(slurm, tmp_path, "int-twice", 29642, again))


def test_a_ctrl_c_during_scancel_does_not_cut_the_cancel_short(slurm: Slurm,
                                                               tmp_path: Path) -> None:
    """The second SIGINT lands while fleet's scancel is under way, held there for a while (as
    by a busy slurmctld) by an scancel ahead of Slurm's on fleet's PATH: fleet waits for it;
    had the signal cut it short, the job would still run."""
    shims = tmp_path / "shims"
    shims.mkdir()
    called, done = tmp_path / "scancel-called", tmp_path / "scancel-done"
    real = shutil.which("scancel")
    assert real is not None
    scancel = shims / "scancel"
    scancel.write_text(f'#!/bin/sh\n: > {shlex.quote(str(called))}\nsleep 3\n'
                       f'{shlex.quote(real)} "$@"\nrc=$?\n'
                       f'echo "$rc $*" > {shlex.quote(str(done))}\nexit $rc\n')
    scancel.chmod(0o755)
    cli = fleet(slurm, tmp_path)
    cli.env["PATH"] = f"{shims}:{cli.env['PATH']}"

    def during_scancel(run: Running, job: int) -> None:
        wait_file(called, run)
        run.p.send_signal(signal.SIGINT)
        assert not done.exists()  # it did land while scancel was under way
        assert slurm.job(job)["JobState"] == "RUNNING"

    r = interrupt_running(slurm, tmp_path, "int-scancel", 29643, during_scancel, cli)
    assert done.exists(), f"fleet's scancel was cut short:\n{r.err}"
    assert done.read_text() == f"0 {r.job}\n"  # ... and it cancelled the job
    assert_cancelled(slurm, r)


# ---- before the submission -------------------------------------------------------------------
@dataclass
class BeforeSubmission:
    """A `fleet up` Ctrl-C'd while its data went to the login node, and `fleet status` after."""

    code: int
    err: str
    run_id: str
    status: tuple[int, str]
    jobs: str  # `scontrol show job` of every job Slurm knows (ended ones too, for 300 s)
    during: list[str]  # processes on the login node but its slurmd, as the stream began
    left: dict[str, list[str]]  # ... on every node, after fleet's exit
    whole: list[Path]  # the data's files whole on the login node, after fleet's exit


def others(slurm: Slurm, name: str) -> list[str]:
    return [p for p in slurm.tb.stray_processes(name)
            if not p.split(" ", 1)[1].startswith(f"{SLURMD} ")]


@pytest.fixture(scope="module")
def before_submission(slurm: Slurm,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[BeforeSubmission]:
    """Through node1 as an SSH login node (as in test_fleet_up_through_an_ssh_login_node), with
    this machine's uplink held to 16 Mbit/s: 24 MiB of data take about 13 s to the login node,
    and SIGINT comes as the stream begins."""
    tb = slurm.tb
    tmp_path = tmp_path_factory.mktemp("before-submission")
    login = tb.hosts[0]
    rc = login.home / ".bashrc"
    before = rc.read_text() if rc.exists() else None
    rc.write_text((before or "") + f"export SLURM_CONF={slurm.conf}\n")
    try:
        d = job_dir(slurm, "int-sync", SLEEP, 29644)
        (d / "job.toml").write_text('data = "data"\n' + (d / "job.toml").read_text())
        (d / "data").mkdir()
        (d / "data" / "shard.bin").write_bytes(os.urandom(24 * MB))
        (d / "cluster.toml").write_text(
            f'[slurm]\nlogin = "{login.addr}"\nuser = "{tb.user}"\nidentity = "{tb.key}"\n'
            f'known_hosts = "{tb.known_hosts}"\nnodes = 2\npartition = "{slurm.partition}"\n'
            f'time = 10\nworkdir = "~/fleet-int"\npython = "{sys.executable}"\n')
        cli = CLI(tmp_path)
        tb.shape_uplink("16mbit")
        run = Running(cli.popen("up", str(d / "job.toml")))
        try:
            run.wait_for(re.compile(r"data: streaming 24\.0 MiB"))
            during = others(slurm, login.name)
            run.p.send_signal(signal.SIGINT)
            _, err = run.finish(timeout=30)  # a hang guard: `whole` says it did not wait
        finally:
            if run.p.poll() is None:
                run.p.kill()
                run.p.wait(timeout=30)
            tb.shape_uplink(None)
        assert run.p.returncode is not None
        deadline = time.monotonic() + 10  # an SSH session of fleet's may take a moment to close
        while True:
            left = {h.name: others(slurm, h.name) for h in tb.hosts}
            if not any(left.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        whole = [p for p in (login.home / "fleet-int").rglob("shard.bin")
                 if p.stat().st_size == 24 * MB]
        run_id = run_id_of(err)
        st = cli("status", run_id, timeout=120)
        jobs = slurm.run("scontrol", "-o", "show", "job").stdout
        yield BeforeSubmission(run.p.returncode, err, run_id,
                               (st.returncode, st.stdout + st.stderr), jobs, during, left, whole)
    finally:
        if before is None:
            rc.unlink()
        else:
            rc.write_text(before)


def test_ctrl_c_before_the_submission_submits_nothing(
        before_submission: BeforeSubmission) -> None:
    r = before_submission
    assert r.code == 130, r.err
    assert "fleet: interrupted (SIGINT)" in r.err and "Traceback" not in r.err, r.err
    # it did land before the end of the data's transfer, so before any sbatch
    assert "data: 1 file(s) sent" not in r.err and not SUBMITTED.search(r.err), r.err
    assert r.whole == [], r.whole  # the stream was cut, not finished first
    assert r.run_id not in r.jobs, r.jobs  # Slurm has no job of the run, ended or not
    assert r.during, "nothing of fleet's ran on the login node during the transfer"
    assert not any(r.left.values()), f"left on the nodes: {r.left}"


def test_ctrl_c_before_the_submission_says_nothing_was_submitted(
        before_submission: BeforeSubmission) -> None:
    r = before_submission
    assert "fleet: interrupted (SIGINT): nothing had been submitted to Slurm" in r.err, r.err


def test_status_of_a_run_interrupted_before_the_submission(
        before_submission: BeforeSubmission) -> None:
    code, text = before_submission.status
    assert code != 3 and "unknown" not in text.splitlines()[0], text
    assert "Slurm no longer knows the job" not in text, text
