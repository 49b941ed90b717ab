"""Runs that heal, end to end through the real CLI on real sshd hosts: `[restart]` starts the run
again from the job's own checkpoint after a rank's crash, a hang or a lost node (a spare taking
the lost node's rank), never after a failure before the job's first line; `max` runs out into a
failed run with every attempt listed; Ctrl-C during the wait between attempts stops it all. After
each case the hosts themselves are asked what is left: nothing of any attempt."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_data import listening
from tests.e2e.test_e2e_faults import sshd_pids
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# One job for every case, told by its [env] what to do. Every rank keeps its checkpoint (the
# next step to run) in the job's working directory on its node; rank 0's is the one the ranks
# resume from (broadcast, as a DDP job loads rank 0's), so that a spare, new to the run, resumes
# with the others.
HEAL = '''import os, socket, threading, time
from pathlib import Path

ATTEMPT = int(os.environ["FLEET_ATTEMPT"])
MODE = os.environ["MODE"]
if MODE == "import-error":
    raise RuntimeError("broken before the first line")

# Until every rank is in place, a line every half second: a slow start (torch's import on a
# loaded machine) is not silence to the watchdog.
placed = threading.Event()

def tick():
    while not placed.wait(0.5):
        print("starting", flush=True)

threading.Thread(target=tick, daemon=True).start()

import torch, torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def silent_step():
    time.sleep(600)  # no line, while rank 0 waits in all_reduce


@record
def main():
    dist.init_process_group("gloo")
    rank, host = dist.get_rank(), socket.gethostname()
    placed.set()
    ckpt = Path(f"ckpt-rank{rank}.txt")
    mine = int(ckpt.read_text()) if ckpt.exists() else 0
    start = torch.tensor([mine])
    dist.broadcast(start, 0)
    start = int(start.item())
    if start:
        print(f"rank {rank} attempt {ATTEMPT} on {host} resumed at step {start}", flush=True)
    steps, crash = int(os.environ["STEPS"]), int(os.environ.get("CRASH_AT", "-1"))
    last = steps if ATTEMPT == 1 else min(steps, start + 4)
    for step in range(start, last):
        print(f"rank {rank} attempt {ATTEMPT} on {host} step {step}", flush=True)
        if step == crash and (ATTEMPT == 1 or MODE == "always"):
            if rank == 1 and MODE == "hang":
                silent_step()
            elif rank == 1:
                raise RuntimeError(f"injected crash at step {step}")
            elif MODE != "hang":
                # A long step of the others' own (no collective): rank 1's crash ends its
                # node first, whatever the timing of a loaded machine.
                time.sleep(120)
        t = torch.ones(1)
        dist.all_reduce(t)
        ckpt.write_text(f"{step + 1}")
        time.sleep(float(os.environ.get("TICK_S", "0.2")))
    print(f"rank {rank} attempt {ATTEMPT} on {host} finished", flush=True)
    dist.destroy_process_group()


main()
'''

SILENT_LINE = HEAL.splitlines().index("    time.sleep(600)  # no line, while rank 0 waits in "
                                      "all_reduce") + 1
LIMIT_S = 240  # any one `fleet up` here; a test's whole budget is a few of them at most


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(2) as t:
        yield t


def heal_job(tmp_path: Path, port: int, restart: str, watchdog: str = "",
             **env: object) -> Path:
    """The job, in a directory of its own (tmp_path/job, with inv.toml): what fleet up prints
    while it runs (tmp_path/up.*) is no file of the job's, synced again for each attempt."""
    (jobdir(tmp_path) / "heal.py").write_text(HEAL)
    job = jobdir(tmp_path) / "heal.toml"
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in env.items())
    job.write_text('inventory = "inv.toml"\nscript = "heal.py"\nnproc_per_node = 1\n'
                   f"[rendezvous]\nport = {port}\n[restart]\n{restart}\n{watchdog}\n"
                   f"[env]\n{env_lines}")
    return job


def jobdir(tmp_path: Path) -> Path:
    d = tmp_path / "job"
    d.mkdir(exist_ok=True)
    return d


def attempt_ids(cli: CLI, run_id: str) -> list[str]:
    """The run's attempts as recorded here: the run's own id, then `<id>-a2`, ..."""
    runs = cli.cwd / ".fleet" / "runs"
    later = sorted((p.name for p in runs.glob(f"{run_id}-a*")),
                   key=lambda n: int(n.rpartition("-a")[2]))
    return [run_id, *later]


def assert_clean(tb: Testbed, run_ids: list[str], dead: tuple[str, ...] = ()) -> None:
    """Nothing of any attempt on any host (asked of the hosts themselves, not of fleet): no
    process of the runs, nothing else but init and sshd, no port listened on but sshd's."""
    for run_id in run_ids:
        assert_nothing_left(tb, run_id)
    alive = [h for h in tb.hosts if h.name not in dead]
    deadline = time.monotonic() + 25  # a preflight's port listener lives up to 20 s
    while True:
        strays = {h.name: tb.stray_processes(h.name) for h in alive}
        ports = {h.name: listening(tb, h.name) for h in alive}
        if not any(strays.values()) and not any(ports.values()):
            return
        assert time.monotonic() < deadline, f"left on the hosts: {strays}, listening: {ports}"
        time.sleep(0.5)


def no_traceback(stderr: str) -> None:
    """No traceback of fleet's own (the job's, in `first failure:`, is indented)."""
    assert not re.search(r"^Traceback \(most recent call last\)", stderr, re.M), stderr


HHMM = r"\d\d:\d\d"
CRASH = "rank 1 on node2: RuntimeError: injected crash at step 3"  # the restart's words for it
CRASH_RE = re.escape(CRASH)
HHMMSS = r"\d\d:\d\d:\d\d"


def start(cli: CLI, job: Path, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """`fleet up JOB` in the background, its stdout and stderr going to files (read while it
    runs)."""
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, "-m", "fleet", "up", str(job)], cwd=cli.cwd,
                                env=cli.env, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
    return proc, out, err


def finish(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def status(cli: CLI, run_id: str) -> subprocess.CompletedProcess[str]:
    return cli("status", run_id, timeout=60)


def test_a_crash_once_is_restarted_from_the_checkpoint(cli: CLI, tb: Testbed,
                                                       tmp_path: Path) -> None:
    """Rank 1 raises at step 3 on the first attempt only (its checkpoint says 3 by then): the
    second attempt resumes at step 3 on the same hosts and succeeds; fleet, status, ps, logs and
    show tell both attempts."""
    tb.inventory(jobdir(tmp_path) / "inv.toml")
    job = heal_job(tmp_path, 29911, "max = 2\nbackoff = 1", MODE="crash", STEPS=6, CRASH_AT=3)
    r = cli("up", str(job), timeout=LIMIT_S)
    run_id = run_id_of(r.stderr)
    ids = attempt_ids(cli, run_id)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert ids == [run_id, f"{run_id}-a2"], ids
        no_traceback(r.stderr)
        err = r.stderr
        # The restart names the cause in the failure report's words, not torchrun's exit code.
        assert f"fleet: restart: attempt 2/3 in 1s ({CRASH})\n" in err, err
        assert f"fleet: run {run_id}-a2: heal on 2 host(s)\n" in err, err
        assert err.rstrip().endswith(
            f"fleet: run {run_id} succeeded on all 2 node(s); attempts: 1/3 failed ({CRASH}), "
            "2/3 succeeded"), err
        assert "not restarted" not in err and "no attempt left" not in err, err
        # The crash, then the same rank resuming from its checkpoint, never from scratch.
        out = r.stdout
        assert "node2 r1 | rank 1 attempt 1 on node2 step 3\n" in out, out
        assert "fleet:     RuntimeError: injected crash at step 3\n" in err, err
        assert "node2 r1 | rank 1 attempt 2 on node2 resumed at step 3\n" in out, out
        assert "node1 r0 | rank 0 attempt 2 on node1 resumed at step 3\n" in out, out
        assert not re.search(r"attempt 2 on node\d step [0-2]$", out, re.M), out
        assert "node2 r1 | rank 1 attempt 2 on node2 finished" in out, out
        assert out.index("attempt 1 on node2 step 3") < out.index("attempt 2 on node2 resumed")
        # The checkpoint the job kept in its working directory on node2, past the last step.
        ckpts = list((tb.host("node2").home / "fleet" / "code").glob("heal-*/ckpt-rank1.txt"))
        assert len(ckpts) == 1 and ckpts[0].read_text() == "6", ckpts

        st = status(cli, run_id)
        assert st.returncode == 0, st.stdout + st.stderr
        head, first, second = st.stdout.splitlines()[:3]
        assert re.fullmatch(rf"run {run_id}: succeeded, attempt 2/3 after {CRASH_RE} at "
                            rf"{HHMM}", head), st.stdout
        assert re.fullmatch(rf"  attempt 1/3 \({run_id}\): failed, {CRASH_RE} at "
                            rf"{HHMMSS}; the job's first line again \d+\.\ds later",
                            first), st.stdout
        assert second == f"  attempt 2/3 ({run_id}-a2): succeeded", st.stdout
        assert re.search(r"node2 +node rank 1 \(rank 1\)  succeeded \(exit 0\)", st.stdout)

        ps = cli("ps")
        assert ps.returncode == 0, ps.stderr
        assert re.search(rf"^{run_id} +succeeded \(attempt 2/3 after {CRASH_RE} at {HHMM}\) ",
                         ps.stdout, re.M), ps.stdout
        assert f"{run_id}-a2" not in ps.stdout, ps.stdout  # the run listed once

        one = cli("logs", run_id, "--attempt", "1")
        assert one.returncode == 0, one.stderr
        assert "rank 1 attempt 1 on node2 step 3" in one.stdout, one.stdout
        assert "attempt 2 on" not in one.stdout, one.stdout
        assert f"fleet: attempt 1/3: run {run_id}\n" in one.stderr, one.stderr
        two = cli("logs", run_id, "--attempt", "2")
        assert "node2 r1 | rank 1 attempt 2 on node2 resumed at step 3" in two.stdout, two.stdout
        assert "attempt 1 on" not in two.stdout, two.stdout
        every = cli("logs", run_id)
        assert every.stdout.index("attempt 1 on node2 step 3") < every.stdout.index(
            "attempt 2 on node2 resumed"), every.stdout
        bad = cli("logs", run_id, "--attempt", "3")
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert f"run {run_id} has 2 attempt(s), not 3" in bad.stderr, bad.stderr

        show = cli("show", run_id, "--json")
        assert show.returncode == 0, show.stderr
        m = json.loads(show.stdout)
        assert m["run_id"] == f"{run_id}-a2"  # the manifest of the attempt that ran last
        assert m["nodes"]["node2"]["env"]["FLEET_ATTEMPT"] == "2"
        tried = m["attempts"]
        assert tried["max"] == 2
        assert [(a["number"], a["run_id"], a["status"], a["why"], sorted(a["hosts"]))
                for a in tried["attempts"]] == [
            (1, run_id, "failed", CRASH, ["node1", "node2"]),
            (2, f"{run_id}-a2", "succeeded", "", ["node1", "node2"])]
        a1, a2 = tried["attempts"]
        assert a1["stopped_at"] and a2["progressed_at"] and a1["stopped_at"] < a2["progressed_at"]
    finally:
        assert_clean(tb, ids)


def test_a_lost_node_is_replaced_by_a_spare(cli: CLI, tmp_path: Path) -> None:
    """node2 dies mid-run (every process of the host, sshd too); node3, a spare, takes its node
    rank in the second attempt, which resumes from rank 0's checkpoint and succeeds."""
    _need_testbed()
    with Testbed(3) as tb3:
        tb3.inventory(jobdir(tmp_path) / "inv.toml", per_host={"node3": {"spare": True}})
        job = heal_job(tmp_path, 29912, "max = 1\nbackoff = 1",
                       "[watchdog]\nunreachable_after = 4", MODE="lost", STEPS=600,
                       TICK_S=0.5)
        proc, out_path, err_path = start(cli, job, tmp_path)
        runs = cli.cwd / ".fleet" / "runs"
        ids: list[str] = []
        try:
            wait_for(lambda: any("rank 1 attempt 1 on node2 step 3" in p.read_text()
                                 for p in runs.glob("*/node2.log")), 120, "node2 to train")
            assert not any("spare" in p.name for p in runs.glob("*/*.log"))
            tb3.kill_host("node2")
            finish(proc, LIMIT_S)
            err, out = err_path.read_text(), out_path.read_text()
            run_id = run_id_of(err)
            ids = attempt_ids(cli, run_id)
            assert proc.returncode == 0, out + err
            assert ids == [run_id, f"{run_id}-a2"], ids
            no_traceback(err)
            assert "fleet: restart: node2 replaced by spare node3 (node2 was lost)\n" in err, err
            assert "fleet: restart: attempt 2/2 in 1s (node2 was lost)\n" in err, err
            assert re.search(rf"fleet: run {run_id} succeeded on all 2 node\(s\); attempts: "
                             r"1/2 \w+ \(node2 was lost\), 2/2 succeeded\n*\Z", err), err
            # The second attempt ran on node1 and node3, node3 with node2's node rank.
            tail = err[err.index(f"run {run_id}-a2: heal on 2 host(s)"):]
            # node2, dead, cannot say its part ended: named once more at the run's end.
            named = (f"fleet: node2 still does not answer: attempt 1's part there may still run; "
                     f"`fleet stop {run_id}` ends it once it answers\n")
            assert named in tail, tail
            # Said once node3 passed its checks, before it started (never before they ran).
            swap = "fleet: restart: node2 replaced by spare node3 (node2 was lost)\n"
            assert tail.index("node3  node rank 1") < tail.index(swap) < tail.index(
                "fleet: node3  started"), tail
            assert "node2" not in tail.replace(swap, "").replace("node2 was lost", "").replace(
                named, ""), tail
            resumed = re.search(r"^node3 r1 \| rank 1 attempt 2 on node3 resumed at step (\d+)$",
                                out, re.M)
            assert resumed and int(resumed.group(1)) >= 3, out
            assert "node3 r1 | rank 1 attempt 2 on node3 finished" in out, out
            assert not re.search(r"^node2 r1 \| rank 1 attempt 2", out, re.M), out
            assert not re.search(r"^node3 .*attempt 1 ", out, re.M), out

            st = status(cli, run_id)
            assert st.returncode == 0, st.stdout + st.stderr
            head, first, second = st.stdout.splitlines()[:3]
            assert re.fullmatch(rf"run {run_id}: succeeded, attempt 2/2, node2 replaced by node3 "
                                rf"after node2 was lost at {HHMM}", head), st.stdout
            assert re.fullmatch(rf"  attempt 1/2 \({run_id}\): \w+, node2 was lost at {HHMMSS}; "
                                r"node2 replaced by node3; the job's first line again "
                                r"\d+\.\ds later",
                                first), st.stdout
            assert second == f"  attempt 2/2 ({run_id}-a2): succeeded", st.stdout
            assert re.search(r"^  node3 +node rank 1 \(rank 1\)  succeeded", st.stdout, re.M), \
                st.stdout
            ps = cli("ps")
            # node2, dead, never answered again: what attempt 1 left there is named.
            assert re.search(rf"^{run_id} +succeeded \(attempt 2/2, node2 replaced by node3 after "
                             rf"node2 was lost at {HHMM}\); attempt 1 may still run on node2 ",
                             ps.stdout, re.M), ps.stdout
            two = cli("logs", run_id, "--attempt", "2", "--rank", "1")
            tags = {line.split(" | ")[0] for line in two.stdout.splitlines()}
            assert tags == {"node3 r1"}, two.stdout
        finally:
            if proc.poll() is None:
                proc.kill()
            assert_clean(tb3, ids, dead=("node2",))


def test_a_hang_is_restarted(cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    """Rank 1 goes silent at step 2 on the first attempt (rank 0 waits in all_reduce): the
    watchdog calls it a hang, `on = ["hang"]` restarts it, the second attempt succeeds."""
    tb.inventory(jobdir(tmp_path) / "inv.toml")
    # At least 12 s, more on a loaded machine (see test_e2e_hang): torchrun can import torch
    # for longer than a short bound before any rank prints.
    job = heal_job(tmp_path, 29913, 'max = 1\non = ["hang"]\nbackoff = 1',
                   f"[watchdog]\nhang_timeout = {tb.silence_bound('node2')}", MODE="hang",
                   STEPS=5, CRASH_AT=2)
    r = cli("up", str(job), timeout=LIMIT_S)
    run_id = run_id_of(r.stderr)
    ids = attempt_ids(cli, run_id)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert ids == [run_id, f"{run_id}-a2"], ids
        no_traceback(r.stderr)
        err = r.stderr
        assert "fleet: hang: no node has printed anything for" in err, err
        # Who was where: rank 1 in the job's own silent step, rank 0 waiting for it.
        assert re.search(r"fleet:   rank 0 on node1: all_reduce\(\) \(distributed_c10d\.py:\d+\); "
                         rf"rank 1 on node2: silent_step\(\) \(heal\.py:{SILENT_LINE}\)\n",
                         err), err
        assert "fleet: restart: attempt 2/2 in 1s (a hang)\n" in err, err
        assert err.rstrip().endswith(f"fleet: run {run_id} succeeded on all 2 node(s); attempts: "
                                     "1/2 failed (a hang), 2/2 succeeded"), err
        assert "node2 r1 | rank 1 attempt 2 on node2 resumed at step 2" in r.stdout, r.stdout
        assert "node1 r0 | rank 0 attempt 2 on node1 finished" in r.stdout, r.stdout
        st = status(cli, run_id)
        assert st.returncode == 0, st.stdout + st.stderr
        head, first, second = st.stdout.splitlines()[:3]
        assert re.fullmatch(rf"run {run_id}: succeeded, attempt 2/2 after a hang at {HHMM}",
                            head), st.stdout
        assert re.fullmatch(rf"  attempt 1/2 \({run_id}\): failed, a hang at {HHMMSS}; the job's "
                            r"first line again \d+\.\ds later", first), st.stdout
        assert second == f"  attempt 2/2 ({run_id}-a2): succeeded", st.stdout
    finally:
        assert_clean(tb, ids)


def test_a_crash_before_the_first_line_is_not_restarted(cli: CLI, tb: Testbed,
                                                        tmp_path: Path) -> None:
    """The script raises at import, on every attempt: a restart cannot mend that, so there is
    one attempt only, and fleet says why."""
    tb.inventory(jobdir(tmp_path) / "inv.toml")
    job = heal_job(tmp_path, 29914, "max = 2\nbackoff = 1", MODE="import-error")
    r = cli("up", str(job), timeout=LIMIT_S)
    run_id = run_id_of(r.stderr)
    ids = attempt_ids(cli, run_id)
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        assert ids == [run_id], ids  # no second attempt was ever recorded
        err = r.stderr
        broken = r"rank [01] on node[12]: RuntimeError: broken before the first line"
        assert re.search(rf"^fleet: not restarted: {broken} before any rank "
                         r"printed a line of its own \(a script, import or setup error needs a "
                         r"person, not a restart\)$", err, re.M), err
        assert "restart: attempt" not in err and f"{run_id}-a2" not in err, err
        assert "RuntimeError: broken before the first line" in err, err
        assert re.search(rf"fleet: error: run {run_id} failed.*; attempts: 1/3 failed "
                         rf"\({broken}\)\n*\Z", err), err
        st = status(cli, run_id)
        assert st.returncode == 1, st.stdout + st.stderr
        head, first = st.stdout.splitlines()[:2]
        assert head == f"run {run_id}: failed, attempt 1/3", st.stdout
        assert re.fullmatch(rf"  attempt 1/3 \({run_id}\): failed, {broken} "
                            rf"at {HHMMSS}; not restarted: {broken} before "
                            r"any rank printed a line of its own \(.*\)", first), st.stdout
        assert "attempt 2/3" not in st.stdout, st.stdout
    finally:
        assert_clean(tb, ids)


def test_max_exhausted_fails_with_every_attempt_listed(cli: CLI, tb: Testbed,
                                                       tmp_path: Path) -> None:
    """Rank 1 fails at step 1 on every attempt: 3 attempts (max = 2), waits of 1 s then 2 s,
    then failed, every attempt in fleet's last line and in `status`."""
    tb.inventory(jobdir(tmp_path) / "inv.toml")
    job = heal_job(tmp_path, 29915, "max = 2\nbackoff = 1", MODE="always", STEPS=4, CRASH_AT=1)
    r = cli("up", str(job), timeout=LIMIT_S)
    run_id = run_id_of(r.stderr)
    ids = attempt_ids(cli, run_id)
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        assert ids == [run_id, f"{run_id}-a2", f"{run_id}-a3"], ids
        no_traceback(r.stderr)
        err = r.stderr
        why = "rank 1 on node2: RuntimeError: injected crash at step 1"
        assert f"fleet: restart: attempt 2/3 in 1s ({why})\n" in err, err
        assert f"fleet: restart: attempt 3/3 in 2s ({why})\n" in err, err  # the wait doubled
        assert "fleet: restart: no attempt left ([restart] max = 2)\n" in err, err
        assert err.index("attempt 3/3 in 2s") < err.index("no attempt left"), err
        assert re.search(rf"fleet: error: run {run_id} failed \(logs: `fleet logs {run_id}`\); "
                         rf"attempts: 1/3 failed \({re.escape(why)}\), 2/3 failed "
                         rf"\({re.escape(why)}\), 3/3 failed \({re.escape(why)}\)\n*\Z", err), err
        for n in (1, 2, 3):
            assert f"node2 r1 | rank 1 attempt {n} on node2 step 1\n" in r.stdout, r.stdout
        st = status(cli, run_id)
        assert st.returncode == 1, st.stdout + st.stderr
        lines = st.stdout.splitlines()
        assert re.fullmatch(rf"run {run_id}: failed, attempt 3/3 after {re.escape(why)} at "
                            rf"{HHMM}", lines[0]), st.stdout
        for n, rid in enumerate(ids, 1):
            assert re.fullmatch(rf"  attempt {n}/3 \({rid}\): failed, {re.escape(why)} at "
                                rf"{HHMMSS}(; the job's first line again \d+\.\ds later|; no "
                                rf"attempt left \(\[restart\] max = 2\))?", lines[n]), \
                st.stdout
        ps = cli("ps")
        assert re.search(rf"^{run_id} +failed \(attempt 3/3 after {re.escape(why)} at {HHMM}\) ",
                         ps.stdout, re.M), ps.stdout
    finally:
        assert_clean(tb, ids)


def test_ctrl_c_during_the_backoff_stops_everything(cli: CLI, tb: Testbed,
                                                    tmp_path: Path) -> None:
    """SIGINT while fleet waits 60 s before attempt 2: fleet ends at once (130), says nothing of
    the run was running, and attempt 2 never starts anywhere."""
    tb.inventory(jobdir(tmp_path) / "inv.toml")
    job = heal_job(tmp_path, 29916, "max = 2\nbackoff = 60", MODE="always", STEPS=4,
                   CRASH_AT=1)
    proc, _, err_path = start(cli, job, tmp_path)
    ids: list[str] = []
    try:
        wait_for(lambda: "fleet: restart: attempt 2/3 in 60s" in err_path.read_text(), 120,
                 "the wait before attempt 2")
        proc.send_signal(signal.SIGINT)
        finish(proc, 30)  # half the backoff: a fleet that waited it out fails here
        err = err_path.read_text()
        run_id = run_id_of(err)
        ids = attempt_ids(cli, run_id)
        assert proc.returncode == 130, err
        no_traceback(err)
        assert err.rstrip().endswith(
            f"fleet: interrupted (SIGINT): during the wait before attempt 2: nothing of run "
            f"{run_id} was running"), err
        assert ids == [run_id], ids  # no record of attempt 2
        assert f"{run_id}-a2" not in err, err
        for h in tb.hosts:
            assert not (h.home / "fleet" / "runs" / f"{run_id}-a2").exists(), h.name
        st = status(cli, run_id)
        assert st.returncode == 1, st.stdout + st.stderr
        head, first = st.stdout.splitlines()[:2]
        assert head == f"run {run_id}: failed, attempt 1/3", st.stdout
        assert re.fullmatch(rf"  attempt 1/3 \({run_id}\): failed, rank 1 on node2: "
                            rf"RuntimeError: injected crash at step 1 at {HHMMSS}", first), \
            st.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        assert_clean(tb, ids)


TICKS = '''import os, sys, time
attempt = int(os.environ["FLEET_ATTEMPT"])
for i in range(1200 if attempt == 1 else 5):
    print(f"attempt {attempt} tick {i}", flush=True)
    time.sleep(0.2)
'''


def test_a_lost_node_that_comes_back_is_stopped(cli: CLI, tmp_path: Path) -> None:
    """node2's sshd dies mid-run while its job goes on (ranks that never talk, as a partition
    leaves them): a spare takes its place and the run succeeds; once node2 answers again,
    `fleet stop RUN`, as fleet said, ends what attempt 1 left there."""
    _need_testbed()
    with Testbed(3) as tb3:
        d = jobdir(tmp_path)
        tb3.inventory(d / "inv.toml", per_host={"node3": {"spare": True}})
        (d / "ticks.py").write_text(TICKS)
        job = d / "ticks.toml"
        job.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                       'command = ["{python}", "ticks.py"]\n[rendezvous]\nport = 29917\n'
                       "[watchdog]\nunreachable_after = 4\n[restart]\nmax = 1\nbackoff = 1\n")
        proc, out_path, err_path = start(cli, job, tmp_path)
        runs = cli.cwd / ".fleet" / "runs"
        ids: list[str] = []
        try:
            wait_for(lambda: any("attempt 1 tick 3" in p.read_text()
                                 for p in runs.glob("*/node2.log")), 120, "node2 to run")
            for pid in sshd_pids(tb3, "node2"):
                os.kill(pid, signal.SIGKILL)
            tb3.host("node2").sshd_pid = 0
            finish(proc, LIMIT_S)
            err, out = err_path.read_text(), out_path.read_text()
            run_id = run_id_of(err)
            ids = attempt_ids(cli, run_id)
            assert proc.returncode == 0, out + err
            assert ids == [run_id, f"{run_id}-a2"], ids
            assert "fleet: restart: node2 replaced by spare node3 (node2 was lost)\n" in err, err
            assert f"node2 could not be reached: its part of the run may still be running; stop " \
                   f"it with `fleet stop {run_id}` once it answers" in err, err
            assert "node3 | attempt 2 tick 4" in out, out
            assert tb3.run_processes("node2", run_id), "node2's job should have outlived sshd"
            # Tried once more at the run's end, and named, as status and ps name it after.
            assert f"fleet: node2 still does not answer: attempt 1's part there may still run; " \
                   f"`fleet stop {run_id}` ends it once it answers\n" in err, err
            assert err.index("node2 still does not answer") < err.index(f"run {run_id} succeeded")
            tb3.start_sshd("node2")
            st = status(cli, run_id)
            assert st.returncode == 0, st.stdout + st.stderr
            # Said from the record (fleet saw the run end), not asked of node2, back meanwhile.
            assert f"  node2's part of attempt 1 ({run_id}) was never seen to end; `fleet stop " \
                   f"{run_id}` once it answers\n" in st.stdout, st.stdout
            ps = cli("ps")
            assert re.search(rf"^{run_id} +succeeded \(.*\); attempt 1 may still run on node2 ",
                             ps.stdout, re.M), ps.stdout
            stop = cli("stop", run_id, timeout=120)
            assert stop.returncode == 0, stop.stdout + stop.stderr
            assert_nothing_left(tb3, run_id, timeout=10)  # here attempt 1 still runs on node2
            st = status(cli, run_id)
            assert "never seen to end" not in st.stdout, st.stdout  # its end seen: the stop's
            assert "may still run" not in cli("ps").stdout
        finally:
            if proc.poll() is None:
                proc.kill()
            if not tb3.host("node2").sshd_pid:
                tb3.start_sshd("node2")
            for run_id in ids:  # what fleet left behind, ended here for the next test's sake
                for h in tb3.hosts:
                    for pid in tb3.run_processes(h.name, run_id):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)


WAITS = '''import os, time
from pathlib import Path
attempt = int(os.environ["FLEET_ATTEMPT"])
# Attempt 1 runs on; attempt 2 until the test says (a file `done` beside it), 2 minutes at most.
for i in range(600):
    if attempt > 1 and Path("done").exists():
        break
    print(f"attempt {attempt} tick {i}", flush=True)
    time.sleep(0.2)
'''


def test_a_lost_node_is_stopped_as_soon_as_it_answers_again(cli: CLI, tmp_path: Path) -> None:
    """node2's sshd dies mid-run while its job goes on (the host up: it refuses connections);
    it is lost at once, not retried for unreachable_after (10 s), and attempt 2 starts on a
    spare without waiting for node2's stop; while attempt 2 runs, node2's sshd is back: fleet
    stops attempt 1's part there by itself, says so, and nothing is left to name at the end."""
    _need_testbed()
    with Testbed(3) as tb3:
        d = jobdir(tmp_path)
        tb3.inventory(d / "inv.toml", per_host={"node3": {"spare": True}})
        (d / "waits.py").write_text(WAITS)
        job = d / "waits.toml"
        job.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                       'command = ["{python}", "waits.py"]\n[rendezvous]\nport = 29918\n'
                       "[restart]\nmax = 1\nbackoff = 1\n")
        proc, out_path, err_path = start(cli, job, tmp_path)
        runs = cli.cwd / ".fleet" / "runs"
        ids: list[str] = []
        try:
            wait_for(lambda: any("attempt 1 tick 3" in p.read_text()
                                 for p in runs.glob("*/node2.log")), 120, "node2 to run")
            for pid in sshd_pids(tb3, "node2"):  # its listener and fleet's sessions
                os.kill(pid, signal.SIGKILL)
            tb3.host("node2").sshd_pid = 0
            wait_for(lambda: "attempt 2 tick 3" in out_path.read_text(), 120, "attempt 2")
            run_id = run_id_of(err_path.read_text())
            assert tb3.run_processes("node2", run_id), "node2's job should have outlived sshd"
            tb3.start_sshd("node2")
            said = "fleet: node2 answered again: attempt 1's part there was stopped (stopped"
            wait_for(lambda: said in err_path.read_text(), 60, "the stop of node2's part")
            assert_nothing_left(tb3, run_id, timeout=10)
            assert proc.poll() is None, "the run goes on meanwhile"
            for h in ("node1", "node3"):
                for code in (tb3.host(h).home / "fleet" / "code").glob("*/waits.py"):
                    (code.parent / "done").touch()
            finish(proc, LIMIT_S)
            err = err_path.read_text()
            ids = attempt_ids(cli, run_id)
            assert proc.returncode == 0, err
            assert ids == [run_id, f"{run_id}-a2"], ids
            assert "still does not answer" not in err, err
            # The order of events: lost as its stream or heartbeat saw it first, its stop not
            # waited for (refused: lost at once; lost: in the background), no wait for an
            # answer; attempt 2 started; node2's part stopped later, once it answered.
            lost = err.index("fleet: node2 (node rank 1) is unreachable (")
            assert "no answer for" not in err and "trying fresh connections" not in err, err
            found = re.search(r"^fleet: node2  stop failed: (it refuses connections|it was lost: "
                              r"its stop is tried again in the background)", err, re.M)
            assert found, err
            later = found.start()
            restart = err.index("fleet: restart: attempt 2/2 in 1s (node2 was lost)")
            assert lost < later < restart < \
                err.index(f"fleet: run {run_id}-a2: waits on 2 host(s)") < \
                err.index("fleet: node3  started") < err.index(said), err
            st = status(cli, run_id)
            assert st.returncode == 0 and "never seen to end" not in st.stdout, \
                st.stdout + st.stderr
            assert "may still run" not in cli("ps").stdout
            assert_clean(tb3, ids)
        finally:
            if proc.poll() is None:
                proc.kill()
            tb3.start_sshd("node2")
