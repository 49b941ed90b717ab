"""What fleet says of a run's end, from captured node output: stop records (who stopped a node,
whether fleet wrote the record, whether the node had failed by itself first), stop.sh itself
under sh, the stop's noise kept out of the attached stream, signals and traceback excerpts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleet.backends.hosts import node as remote
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.facts import run_state
from fleet.plan import make_plan
from fleet.render import render_node
from fleet.run.logs import AfterStop
from fleet.states import NodeStatus

FAILED_LINE = ("E0415 12:00:01.500000 812 torch/distributed/elastic/multiprocessing/api.py:1003] "
               "failed (exitcode: 1) local_rank: 0 (pid: 901) of binary: /usr/bin/python3")
CLOSING_LINE = ("W0415 12:00:01.400000 812 torch/distributed/elastic/multiprocessing/api.py:1028]"
                " Sending process 902 closing signal SIGTERM")


# ---- stop records -----------------------------------------------------------------------------
def test_a_stop_record_without_the_key_is_the_jobs_forgery() -> None:
    forged = run_state.parse_stop_record(["fleet stop"], "k1")
    assert not forged.genuine
    assert not run_state.parse_stop_record(["fleet stop", "key="], "k1").genuine
    assert run_state.parse_stop_record(["fleet stop", "key=k1"], "k1").genuine
    # A run recorded before keys existed takes records as they read.
    assert run_state.parse_stop_record(["fleet stop"], "").genuine


def test_a_node_whose_workers_had_failed_before_the_stop_failed() -> None:
    rec = run_state.parse_stop_record(["fail-fast: node1 failed", "key=k", f"log={FAILED_LINE}"],
                                   "k")
    assert rec.own_failure == ("torchrun had reported local rank 0 (pid 901) failed with "
                               "exitcode 1")
    closing = run_state.parse_stop_record(["x", "key=k", f"log={CLOSING_LINE}"], "k")
    assert closing.own_failure == "torchrun was already closing its workers after one had ended"
    # Both: the failure itself says more than the closing that precedes it.
    both = run_state.parse_stop_record(["x", "key=k", f"log={CLOSING_LINE}", f"log={FAILED_LINE}"],
                                    "k")
    assert both.own_failure.startswith("torchrun had reported local rank 0")
    died = run_state.parse_stop_record(["x", "key=k", "ended=903 812 9"], "k")
    assert died.own_failure == "its process 903 had been killed by SIGKILL"
    exited = run_state.parse_stop_record(["x", "key=k", "ended=903 812 512"], "k")
    assert exited.own_failure == "its process 903 had exited 2"
    signalled = run_state.parse_stop_record(
        ["x", "key=k", "log=W0415 12:00:01.298000 18877 torch/distributed/elastic/agent/server/"
         "api.py:753] Received 15 death signal, shutting down workers"], "k")
    assert signalled.own_failure == "torchrun had received signal 15 from outside fleet"


def test_what_is_no_sign_of_a_failure() -> None:
    # A worker's own line (its torchrun prefix), a worker that exited 0, garbage.
    rec = run_state.parse_stop_record(["fleet stop", "key=k", f"log=[default0]:{FAILED_LINE}",
                                    "ended=903 812 0", "ended=a b c", "log=tick 5"], "k")
    assert rec == run_state.StopRecord("fleet stop", True, "")


def test_state_of_a_node_by_its_stop_record() -> None:
    base = "pid=41\ncode=143\nstarted=1\nended=2\nnow=9\n"
    stopped = run_state.parse_state(base + "stop|fleet stop\nstop|key=k\n", "k")
    assert (stopped.status, stopped.stopped_by) == (NodeStatus.STOPPED, "fleet stop")
    forged = run_state.parse_state(base + "stop|fleet stop\n", "k")
    assert (forged.status, forged.code, forged.stopped_by) == (NodeStatus.FAILED, 143, "")
    own = run_state.parse_state(base + f"stop|fail-fast: node1 failed\nstop|key=k\n"
                             f"stop|log={FAILED_LINE}\n", "k")
    assert (own.status, own.stopped_by) == (NodeStatus.FAILED, "fail-fast: node1 failed")
    assert own.own_failure.startswith("torchrun had reported local rank 0")
    # The wrapper killed outright by the stop: the record decides as well.
    killed = "pid=41\ncode=\nstarted=1\nended=\nlast=5\nnow=9\n"
    assert run_state.parse_state(killed + "stop|fleet stop\nstop|key=k\n", "k").status is \
        NodeStatus.STOPPED
    assert run_state.parse_state(killed + "stop|fleet stop\nstop|key=x\n", "k").status is \
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
        out = subprocess.run(["sh", "-c", run_state.state_script(str(run_dir))],
                             capture_output=True, text=True, timeout=30).stdout
        st = run_state.parse_state(out, "k1")
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
    state = subprocess.run(["sh", "-c", run_state.state_script(str(run_dir))],
                           capture_output=True, text=True, timeout=30).stdout
    st = run_state.parse_state(state, "k1")
    assert (st.status, st.stopped_by, st.own_failure) == (NodeStatus.STOPPED, "fleet stop", "")


def test_stop_sh_on_a_part_that_had_ended_by_itself(tmp_path: Path) -> None:
    """The wrapper had started and is gone with no exit code (the node rebooted): stop.sh says
    it found nothing, and the node's state is its own end (failed), not fleet's stop."""
    run_id = f"words-gone-{os.getpid()}"
    run_dir, script = _stop_sh(tmp_path, run_id)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run_dir / "pid").write_text(f"{dead.pid}\n")
    (run_dir / "node.log").write_text("tick 1\n")
    out = subprocess.run(["sh", str(script), "fleet up, once n1 answered again"], input="k1\n",
                         capture_output=True, text=True, timeout=60).stdout
    assert (remote.parse_stop(out), remote.parse_found(out)) == ([], False), out
    state = subprocess.run(["sh", "-c", run_state.state_script(str(run_dir))],
                           capture_output=True, text=True, timeout=30).stdout
    st = run_state.parse_state(state, "k1")
    assert (st.status, st.stopped_by) == (NodeStatus.FAILED, ""), state


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


# ---- a rank killed by a signal --------------------------------------------------------------
C10D_WARNING = ("[W415 12:00:00.000000 socket.cpp:755] [c10d] The IPv6 network addresses of "
                "(node1, 29500) cannot be retrieved (gai error: -2 - Name or service not known).")
FUTURE_WARNING = ("/code/train.py:3: FutureWarning: `torch.cuda.amp.autocast(args...)` is "
                  "deprecated.")


def root_cause(code: int, pid: int = 4242) -> str:
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "Root Cause (first observed failure):\n[0]:\n  time      : 2026-04-15_12:00:02\n"
            "  host      : node1\n  rank      : 1 (local_rank: 1)\n"
            f"  exitcode  : {code} (pid: {pid})\n  error_file: <N/A>\n")


def test_a_sigkilled_rank_is_named_with_no_foreign_traceback() -> None:
    from fleet.facts.failure import parse_report, summary
    out = (f"=== log\n[default1]:{C10D_WARNING}\n[default1]:{FUTURE_WARNING}\n{root_cause(-9)}"
           f"=== torchrun/r/attempt_0/1/stderr.log 1000.5\n{C10D_WARNING}\n{FUTURE_WARNING}\n"
           "  with torch.cuda.amp.autocast():\n")
    r = parse_report(out, "node1", 0)
    assert r is not None and (r.signal, r.pid, r.traceback, r.found) == ("SIGKILL", 4242, "",
                                                                         False)
    text = "\n".join(summary(r))
    assert text.startswith("first failure: node1 (node rank 0), rank 1 (local rank 1), exit "
                           "code -9: killed by SIGKILL")
    assert "no Python traceback" in text and "OOM killer" in text and "`dmesg` on node1" in text
    assert "c10d" not in text and "FutureWarning" not in text and "hint:" not in text


def test_the_kernel_log_of_a_sigkill() -> None:
    from fleet.facts.failure import parse_kernel_log
    denied = parse_kernel_log("uptime=100.0\nunreadable=dmesg: read kernel buffer failed: "
                              "Operation not permitted\n", "node1", 4242)
    assert denied == ["node1's kernel log could not be read (dmesg: read kernel buffer failed: "
                      "Operation not permitted): ask its admin to look for an OOM kill there "
                      "(`sudo dmesg | grep -i 'killed process'`)"]
    assert "holds no OOM kill" in parse_kernel_log("uptime=100.0\nreadable\n", "node1", 4242)[0]
    kill = ("kill|[   90.250000] Out of memory: Killed process 4242 (python3) total-vm:9000kB, "
            "anon-rss:8000kB\n")
    ours = parse_kernel_log("uptime=100.5\n" + kill + "readable\n", "node1", 4242)
    assert ours == ["node1's kernel log: the kernel's OOM killer killed PID 4242 (python3), 10s "
                    "ago: the rank ran out of host memory"]
    other = parse_kernel_log("uptime=100.5\n" + kill + "readable\n", "node1", 77)
    assert "holds 1 OOM kill(s), none of PID 77; the latest: the kernel's OOM killer killed " \
           "PID 4242" in other[0]
    assert parse_kernel_log("", "node1", 1) == []  # the command never ran to the end


# ---- traceback excerpts -----------------------------------------------------------------------
TRACE = ["Traceback (most recent call last):", '  File "/code/train.py", line 9, in <module>',
         "    main()", "ValueError: bad batch"]


def test_an_excerpt_starts_at_its_traceback_line() -> None:
    from fleet.facts.failure import parse_report, summary
    stderr = "\n".join([C10D_WARNING, FUTURE_WARNING, *TRACE]) + "\n"
    r = parse_report(f"=== log\n{root_cause(1)}=== torchrun/r/attempt_0/1/stderr.log 1.0\n"
                     + stderr, "node1", 0)
    assert r is not None and r.found and r.traceback.splitlines() == TRACE
    assert summary(r)[1:5] == [f"    {line}" for line in TRACE]


def test_torchs_rank_prefix_on_an_uncaught_exception_is_no_obstacle() -> None:
    """After init_process_group, torch's excepthook writes `[rank1]: ` before every line."""
    from fleet.facts.failure import parse_report
    stderr = "\n".join([FUTURE_WARNING, *(f"[rank1]: {line}" for line in TRACE)]) + "\n"
    r = parse_report(f"=== log\n{root_cause(1)}=== torchrun/r/attempt_0/1/stderr.log 1.0\n"
                     + stderr, "node1", 0)
    assert r is not None and r.found and r.traceback.splitlines() == TRACE
    log = "".join(f"[default1]:[rank1]: {line}\n" for line in TRACE)
    r = parse_report(f"=== log\n{log}{root_cause(1)}", "node1", 0)
    assert r is not None and r.found and r.traceback.splitlines() == TRACE


def test_a_long_traceback_keeps_its_first_line() -> None:
    from fleet.facts.failure import TRACE_LINES, excerpt
    frames = [f'  File "/code/deep.py", line {i}, in f\n    f({i})' for i in range(30)]
    text = "\n".join([FUTURE_WARNING, TRACE[0], *frames, "RecursionError: too deep", "bye"])
    block = (excerpt(text) or "").splitlines()
    assert block[0] == TRACE[0] and block[1] == "  ..." and block[-1] == "RecursionError: too deep"
    assert len(block) == TRACE_LINES
    # From torchrun's error file (a script with @record) as well.
    from fleet.facts.failure import parse_report
    callstack = json.dumps({"message": {"message": "RecursionError", "extraInfo": {
        "py_callstack": "\n".join([TRACE[0], *frames, "RecursionError: too deep"])}}})
    r = parse_report(f"=== log\n{root_cause(1)}=== torchrun/r/attempt_0/1/error.json 1.0\n"
                     f"{callstack}\n", "node1", 0)
    assert r is not None and r.traceback.splitlines()[0] == TRACE[0]


def test_a_traceback_the_stderr_tail_cut_is_found_in_the_nodes_log() -> None:
    from fleet.facts.failure import parse_report
    log = "".join(f"[default1]:{line}\n" for line in [FUTURE_WARNING, *TRACE])
    cut = "\n".join(TRACE[1:]) + "\n"  # no Traceback line
    r = parse_report(f"=== log\n{log}{root_cause(1)}=== torchrun/r/attempt_0/1/stderr.log 1.0\n"
                     + cut, "node1", 0)
    assert r is not None and r.found and r.traceback.splitlines() == TRACE
    nowhere = parse_report(f"=== log\n{root_cause(1)}=== torchrun/r/attempt_0/1/stderr.log 1.0\n"
                           "last words\n", "node1", 0)
    assert nowhere is not None and not nowhere.found and nowhere.traceback == "last words"


def test_the_report_script_sends_a_ranks_stderr_from_its_last_traceback(tmp_path: Path) -> None:
    from fleet.facts.failure import _report_script, parse_report
    rank_dir = tmp_path / "torchrun" / "r" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    noise = [f"warning {i}" for i in range(300)]
    frames = [f'  File "/code/deep.py", line {i}, in f' for i in range(40)]
    (rank_dir / "stderr.log").write_text("\n".join(noise + [TRACE[0], *frames, TRACE[-1]]) + "\n")
    (tmp_path / "node.log").write_text(root_cause(1))
    out = subprocess.run(["sh", "-c", _report_script(str(tmp_path))], capture_output=True,
                         text=True, timeout=30).stdout
    section = out.split("stderr.log", 1)[1].splitlines()[1:]
    assert section[0] == TRACE[0] and section[-1] == TRACE[-1] and len(section) == 42
    r = parse_report(out, "node1", 0)
    assert r is not None and r.traceback.splitlines()[0] == TRACE[0]
    (rank_dir / "stderr.log").write_text("\n".join(noise) + "\n")
    out = subprocess.run(["sh", "-c", _report_script(str(tmp_path))], capture_output=True,
                         text=True, timeout=30).stdout
    assert out.split("stderr.log", 1)[1].splitlines()[1:] == noise[-15:]


def test_a_node_being_stopped_says_by_whom_while_it_still_runs() -> None:
    out = "pid=41\ncode=\nstarted=1\nended=\nnow=9\nalive\nstop|fleet stop\nstop|key=k\n"
    st = run_state.parse_state(out, "k")
    assert (st.status, st.stopped_by) == (NodeStatus.RUNNING, "fleet stop")

