"""A hostile job end to end through the real CLI: what a node says is data. Its file names never
write outside the run's record (fleet dump, the hang watchdog), and escape sequences in its
output, its exception, its stack files and its run directory's files are shown, never obeyed
by the user's terminal (fleet up, status, logs, dump)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# From <record>/flight-recorder/<node>/ five levels up is the CLI's own directory (tmp_path).
UP = "../../../../../"

# Each rank: a SIGRTMIN+7 handler of its own in place of fleet's, which appends to its stack
# file lines naming files outside the record (a relative escape, and the controller's
# ~/.bashrc by its absolute path), with the files there in its run dir for fleet to read;
# flight recorder files whose names are a newline's injection (a file name cannot hold a `/`)
# and a symbolic link; one honest flight recorder file; and a stack frame whose file and
# function hold escape sequences.
HOSTILE = '''import faulthandler, os, signal, time

RUN = os.environ["FLEET_RUN_DIR"]
RANK = os.environ["RANK"]
TARGETS = [{rel!r}, {bashrc!r}]
for name in TARGETS:
    src = RUN + "/" + name
    os.makedirs(os.path.dirname(src), exist_ok=True)
    with open(src, "w") as f:
        f.write("pwned\\n")
with open(RUN + "/nccl_trace_rank_0\\n=== ended 0", "w") as f:
    f.write("pwned\\n")
os.symlink("/etc/hostname", RUN + "/nccl_trace_rank_link" + RANK)
with open(RUN + "/nccl_trace_rank_" + RANK, "w") as f:
    f.write("flight record of rank " + RANK + "\\n")


def handler(signum, frame):
    with open(RUN + "/stacks/" + str(os.getpid()), "a") as f:
        f.write("Current thread 0x00007f0000000001 (most recent call first):\\n"
                '  File "/code/\\x1b]0;owned-title\\x07evil.py", line 7 in \\x1b[2Jtrap\\n'
                '  File "/code/hostile.py", line 1 in <module>\\n')
        for name in TARGETS:
            f.write("=== fr " + name + " 6\\n")


signal.signal(signal.SIGRTMIN + 7, handler)
print("ready", flush=True)
while True:
    time.sleep(1)
'''


def hostile(cli: CLI, tb2: Testbed, tmp_path: Path, port: int, watchdog: str = "") -> Path:
    """The job file; the controller's HOME is a fake one under tmp_path, its .bashrc known."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# mine\n")
    cli.env["HOME"] = str(home)
    tb2.inventory(tmp_path / "inv.toml")
    (tmp_path / "hostile.py").write_text(HOSTILE.format(
        rel=UP + "pwned-rel", bashrc=str(home / ".bashrc"), up=UP))
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nscript = "hostile.py"\nnproc_per_node = 1\n'
                   f"[rendezvous]\nport = {port}\n{watchdog}")
    return job


def assert_confined(tmp_path: Path, run_id: str, said: str) -> None:
    """Nothing outside the record; in it only the honest flight records; each refusal said."""
    assert (tmp_path / "home" / ".bashrc").read_text() == "# mine\n"
    assert not list(tmp_path.rglob("pwned*")), list(tmp_path.rglob("pwned*"))
    record = tmp_path / ".fleet" / "runs" / run_id
    kept = sorted(str(p.relative_to(record)) for p in (record / "flight-recorder").rglob("*"))
    assert kept == ["flight-recorder/node1", "flight-recorder/node1/nccl_trace_rank_0",
                    "flight-recorder/node2", "flight-recorder/node2/nccl_trace_rank_1"], kept
    assert (record / "flight-recorder" / "node2" / "nccl_trace_rank_1").read_text() == \
        "flight record of rank 1\n"
    for node, rank in (("node1", 0), ("node2", 1)):
        assert (f'{node}: flight recorder file "nccl_trace_rank_0^J=== ended 0" not kept: not '
                "a name the flight recorder writes") in said, said
        assert (f'{node}: flight recorder file "nccl_trace_rank_link{rank}" not kept: it is a '
                "symbolic link") in said, said
    # The frame the job forged is shown, its escapes visible.
    assert "/code/^[]0;owned-title^Gevil.py:7 in ^[[2Jtrap" in said, said
    assert "\x1b" not in said and "\x07" not in said


def test_dump_keeps_a_hostile_nodes_files_inside_the_record(cli: CLI, tb2: Testbed,
                                                            tmp_path: Path) -> None:
    r = cli("up", str(hostile(cli, tb2, tmp_path, 29581)), "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    try:
        wait_for(lambda: cli("logs", run_id).stdout.count(" ready") == 2, 90, "2 ranks ready")
        d = cli("dump", run_id)
        assert d.returncode == 0, d.stdout + d.stderr
        assert_confined(tmp_path, run_id, d.stdout + d.stderr)
        kept = list((tmp_path / ".fleet" / "runs" / run_id).glob("stacks-*.txt"))
        assert len(kept) == 1 and "^[]0;owned-title^G" in kept[0].read_text()
        assert "\x1b" not in kept[0].read_text()
    finally:
        s = cli("stop", run_id)
    assert s.returncode == 0, s.stdout + s.stderr
    assert_nothing_left(tb2, run_id)


def test_watchdog_keeps_a_hostile_nodes_files_inside_the_record(cli: CLI, tb2: Testbed,
                                                                tmp_path: Path) -> None:
    # Long enough for torchrun's silent start (its import of torch) on a loaded machine: the
    # watchdog must find the ranks running, their files written (20 s, more under load now).
    bound = tb2.silence_bound("node2", floor=20)
    job = hostile(cli, tb2, tmp_path, 29582, f"[watchdog]\nhang_timeout = {bound}\n")
    r = cli("up", str(job), timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no node has printed anything for" in r.stderr
    assert "fleet:   all 2 rank(s) are in ^[[2Jtrap() (^[]0;owned-title^Gevil.py:7)" in r.stderr, \
        r.stderr
    run_id = run_id_of(r.stderr)
    assert_confined(tmp_path, run_id, r.stderr)
    assert_nothing_left(tb2, run_id)


B64 = base64.b64encode(b"rm -rf ~").decode()
OSC52, TITLE, CLEAR = f"\x1b]52;c;{B64}\x07", "\x1b]0;owned-title\x07", "\x1b[2J\x1b[H"
FORGE = "\x1b[1A\x1b[2Kfleet: run r-x succeeded on all 2 node(s)"
SHOWN = (f"^[]52;c;{B64}^G^[]0;owned-title^G^[[2J^[[H^[[1A^[[2Kfleet: run r-x succeeded on "
         "all 2 node(s)")
PLAIN = "plain: loss 0.25\tÉtape 3 — 完成"
STOPPED = TITLE + "\x1b[2Jme"
EXC = "bad \x1b]0;owned\x07\x1b[1A\x1b[2Kfleet: run r-x succeeded"
# Rank 1 (node2) writes its run dir's `stopped` file, a forged stop record (without the run's
# key fleet counts it for nothing and its stop replaces it: its text never shows); rank 0 (node1)
# prints escapes, a line with a CR, plain text, then fails with escapes in its exception.
NOISY = f'''import os, sys, time
import torch.distributed as dist

if os.environ["RANK"] == "1":
    with open(os.environ["FLEET_RUN_DIR"] + "/stopped", "w") as f:
        f.write({STOPPED!r} + "\\n")
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    print({OSC52 + TITLE + CLEAR + FORGE!r}, flush=True)
    print("50%\\rfleet: run r-x succeeded", flush=True)
    print({PLAIN!r}, flush=True)
dist.barrier()
if dist.get_rank() == 0:
    raise RuntimeError({EXC!r})
time.sleep(600)
'''
RAISED = "RuntimeError: bad ^[]0;owned^G^[[1A^[[2Kfleet: run r-x succeeded"


def test_escape_sequences_from_a_job_are_shown_not_obeyed(cli: CLI, tb2: Testbed,
                                                          tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    (tmp_path / "noisy.py").write_text(NOISY)
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nscript = "noisy.py"\nnproc_per_node = 1\n'
                   "[rendezvous]\nport = 29583\n")
    r = cli("up", str(job), timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    forged = "owned-title"
    out, err = r.stdout, r.stderr
    assert "\x1b" not in out + err and "\x07" not in out + err and "\r" not in out + err
    assert f"node1 r0 | {SHOWN}\n" in out, out
    # torchrun's prefixing splits a line at a CR (console.printable marks one that reaches it):
    # the forged text keeps its tag.
    assert "node1 r0 | fleet: run r-x succeeded\n" in out, out
    assert not re.search(r"^fleet: run r-x", out + err, re.M), out + err
    assert f"node1 r0 | {PLAIN}\n" in out, out
    assert RAISED in out, out  # the job's own traceback, in its log
    # The failure summary (torch prefixes the worker's stderr with [rank0]:).
    assert re.search(r"^fleet: first failure: node1 \(node rank 0\), rank 0", err, re.M), err
    assert re.search(r"^fleet:     .*" + re.escape(RAISED) + "$", err, re.M), err
    assert "fleet: node2  stopped (exit" in err and "by fail-fast: node1 failed" in err, err
    assert forged not in err.replace("^[]0;owned-title^G", ""), err  # only in node1's own lines
    st = cli("status", run_id)
    assert "\x1b" not in st.stdout + st.stderr and "\x07" not in st.stdout
    assert "stopped (exit" in st.stdout and forged not in st.stdout, st.stdout
    logs = cli("logs", run_id)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "\x1b" not in logs.stdout + logs.stderr and "\r" not in logs.stdout
    assert f"node1 r0 | {SHOWN}\n" in logs.stdout and f"node1 r0 | {PLAIN}\n" in logs.stdout
    # The local copy of the log is the job's exact bytes: only the terminal is spared.
    assert OSC52 + TITLE + CLEAR + FORGE in (tmp_path / ".fleet" / "runs" / run_id /
                                             "node1.log").read_text()
    assert_nothing_left(tb2, run_id)
