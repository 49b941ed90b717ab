"""What fleet says of a run's end, from captured node output: stop records (who stopped a node,
whether fleet wrote the record, whether the node had failed by itself first), stop.sh itself
under sh, the stop's noise kept out of the attached stream, signals and traceback excerpts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleet import remote
from fleet.inventory import Host, Inventory
from fleet.job import Job
from fleet.logs import AfterStop
from fleet.plan import make_plan
from fleet.render import render_node
from fleet.states import NodeStatus

FAILED_LINE = ("E0415 12:00:01.500000 812 torch/distributed/elastic/multiprocessing/api.py:1003] "
               "failed (exitcode: 1) local_rank: 0 (pid: 901) of binary: /usr/bin/python3")
CLOSING_LINE = ("W0415 12:00:01.400000 812 torch/distributed/elastic/multiprocessing/api.py:1028]"
                " Sending process 902 closing signal SIGTERM")


# ---- stop records -----------------------------------------------------------------------------
def test_a_stop_record_without_the_key_is_the_jobs_forgery() -> None:
    forged = remote.parse_stop_record(["fleet stop"], "k1")
    assert not forged.genuine
    assert not remote.parse_stop_record(["fleet stop", "key="], "k1").genuine
    assert remote.parse_stop_record(["fleet stop", "key=k1"], "k1").genuine
    # A run recorded before keys existed takes records as they read.
    assert remote.parse_stop_record(["fleet stop"], "").genuine


def test_a_node_whose_workers_had_failed_before_the_stop_failed() -> None:
    rec = remote.parse_stop_record(["fail-fast: node1 failed", "key=k", f"log={FAILED_LINE}"],
                                   "k")
    assert rec.own_failure == ("torchrun had reported local rank 0 (pid 901) failed with "
                               "exitcode 1")
    closing = remote.parse_stop_record(["x", "key=k", f"log={CLOSING_LINE}"], "k")
    assert closing.own_failure == "torchrun was already closing its workers after one had ended"
    # Both: the failure itself says more than the closing that precedes it.
    both = remote.parse_stop_record(["x", "key=k", f"log={CLOSING_LINE}", f"log={FAILED_LINE}"],
                                    "k")
    assert both.own_failure.startswith("torchrun had reported local rank 0")
    died = remote.parse_stop_record(["x", "key=k", "ended=903 812 9"], "k")
    assert died.own_failure == "its process 903 had been killed by SIGKILL"
    exited = remote.parse_stop_record(["x", "key=k", "ended=903 812 512"], "k")
    assert exited.own_failure == "its process 903 had exited 2"
    signalled = remote.parse_stop_record(
        ["x", "key=k", "log=W0415 12:00:01.298000 18877 torch/distributed/elastic/agent/server/"
         "api.py:753] Received 15 death signal, shutting down workers"], "k")
    assert signalled.own_failure == "torchrun had received signal 15 from outside fleet"


def test_what_is_no_sign_of_a_failure() -> None:
    # A worker's own line (its torchrun prefix), a worker that exited 0, garbage.
    rec = remote.parse_stop_record(["fleet stop", "key=k", f"log=[default0]:{FAILED_LINE}",
                                    "ended=903 812 0", "ended=a b c", "log=tick 5"], "k")
    assert rec == remote.StopRecord("fleet stop", True, "")


def test_state_of_a_node_by_its_stop_record() -> None:
    base = "pid=41\ncode=143\nstarted=1\nended=2\nnow=9\n"
    stopped = remote.parse_state(base + "stop|fleet stop\nstop|key=k\n", "k")
    assert (stopped.status, stopped.stopped_by) == (NodeStatus.STOPPED, "fleet stop")
    forged = remote.parse_state(base + "stop|fleet stop\n", "k")
    assert (forged.status, forged.code, forged.stopped_by) == (NodeStatus.FAILED, 143, "")
    own = remote.parse_state(base + f"stop|fail-fast: node1 failed\nstop|key=k\n"
                             f"stop|log={FAILED_LINE}\n", "k")
    assert (own.status, own.stopped_by) == (NodeStatus.FAILED, "fail-fast: node1 failed")
    assert own.own_failure.startswith("torchrun had reported local rank 0")
    # The wrapper killed outright by the stop: the record decides as well.
    killed = "pid=41\ncode=\nstarted=1\nended=\nlast=5\nnow=9\n"
    assert remote.parse_state(killed + "stop|fleet stop\nstop|key=k\n", "k").status is \
        NodeStatus.STOPPED
    assert remote.parse_state(killed + "stop|fleet stop\nstop|key=x\n", "k").status is \
        NodeStatus.FAILED


# ---- stop.sh under sh ---------------------------------------------------------------------------
# A stand-in for run.sh: its child (the launcher) has a child that exits 3 and is never reaped.
FAKE_RUN = """
import os, sys, time
if os.fork() == 0:
    g = os.fork()
    if g == 0:
        os._exit(3)
    print(g, flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(60)
"""


def _stop_sh(tmp_path: Path, run_id: str) -> tuple[Path, Path]:
    host = Host("n1", "127.0.0.1", workdir=str(tmp_path))
    inv = Inventory(tmp_path / "inv.toml", (host,))
    job = Job(path=tmp_path / "j.toml", name="j", inventory=inv.path, workdir=tmp_path,
              script="t.py")
    plan = make_plan(inv, job, run_id, master_addr="127.0.0.1")
    run_dir = Path(plan.nodes[0].run_dir)
    run_dir.mkdir(parents=True)
    script = run_dir / "stop.sh"
    script.write_text(render_node(plan, plan.nodes[0], grace=1).files["stop.sh"][0])
    return run_dir, script


def _zombie_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_stop_sh_records_the_nodes_own_end_and_replaces_a_forgery(tmp_path: Path) -> None:
    run_id = f"words-{os.getpid()}"
    run_dir, script = _stop_sh(tmp_path, run_id)
    (run_dir / "node.log").write_text(f"[default0]:tick 1\n{FAILED_LINE}\n")
    (run_dir / "stopped").write_text("fleet stop\nkey=\n")  # the job's forgery
    wrapper = subprocess.Popen([sys.executable, "-c", FAKE_RUN], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "FLEET_RUN_ID": run_id})
    try:
        assert wrapper.stdout is not None
        grandchild = int(wrapper.stdout.readline())
        (run_dir / "pid").write_text(f"{wrapper.pid}\n")
        deadline = time.monotonic() + 20
        while _zombie_state(grandchild) != "Z":
            assert time.monotonic() < deadline, "no zombie"
            time.sleep(0.05)
        marked = subprocess.run(["sh", str(script), "fail-fast: n2 failed", "mark"],
                                input="k1\n", capture_output=True, text=True, timeout=60)
        assert marked.stdout.split() == ["marked"], marked.stderr
        record = (run_dir / "stopped").read_text().splitlines()
        assert record[:2] == ["fail-fast: n2 failed", "key=k1"]
        assert f"log={FAILED_LINE}" in record
        assert any(line.startswith(f"ended={grandchild} ") and line.endswith(" 768")
                   for line in record), record
        assert wrapper.poll() is None, "a mark signals nothing"
        log = (run_dir / "node.log").read_text().splitlines()
        assert log[-1] == f"[fleet] stopping run {run_id} on this node (fail-fast: n2 failed)"
        # The stop itself keeps the first genuine record, and ends the processes.
        again = subprocess.run(["sh", str(script), "fleet stop"], input="k1\n",
                               capture_output=True, text=True, timeout=60)
        assert remote.parse_stop(again.stdout) == []
        assert wrapper.wait(timeout=10) == -signal.SIGTERM
        assert (run_dir / "stopped").read_text().splitlines() == record
        out = subprocess.run(["sh", "-c", remote.state_script(str(run_dir))],
                             capture_output=True, text=True, timeout=30).stdout
        st = remote.parse_state(out, "k1")
        assert (st.status, st.stopped_by) == (NodeStatus.FAILED, "fail-fast: n2 failed")
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_stop_sh_on_a_node_that_had_not_failed(tmp_path: Path) -> None:
    run_id = f"words-ok-{os.getpid()}"
    run_dir, script = _stop_sh(tmp_path, run_id)
    (run_dir / "node.log").write_text(f"[default0]:{FAILED_LINE}\n")  # a worker's words
    out = subprocess.run(["sh", str(script), "fleet stop"], input="k1\n",
                         capture_output=True, text=True, timeout=60)
    assert remote.parse_stop(out.stdout) == []
    state = subprocess.run(["sh", "-c", remote.state_script(str(run_dir))],
                           capture_output=True, text=True, timeout=30).stdout
    st = remote.parse_state(state, "k1")
    assert (st.status, st.stopped_by, st.own_failure) == (NodeStatus.STOPPED, "fleet stop", "")


# ---- the stop's noise in the attached stream -----------------------------------------------------
def test_after_a_confirmed_stop_lines_are_hidden_and_said_so_once() -> None:
    told: list[str] = []
    quiet = AfterStop(lambda: "fleet stop", told.append)
    assert quiet(["[default0]:tick 1"]) == ["[default0]:tick 1"]
    quiet.tell()
    assert told == []
    shown = quiet(["[default0]:tick 2", "[fleet] stopping run r-1 on this node (fleet stop)",
                   "W0415 ... Sending process 902 closing signal SIGTERM",
                   "Traceback (most recent call last):"])
    assert shown == ["[default0]:tick 2"]
    quiet.tell()
    assert quiet(["torch.distributed.elastic.multiprocessing.api.SignalException: ..."]) == []
    quiet.tell()
    assert told == ["fleet stop"] and quiet.hidden == 3


def test_a_job_cannot_silence_itself_by_printing_the_mark() -> None:
    quiet = AfterStop(lambda: "", lambda by: None)  # no genuine stop record on the node
    lines = ["[fleet] stopping run r-1 on this node (fleet stop)", "Traceback (most recent..."]
    assert quiet(lines) == lines
