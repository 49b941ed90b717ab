"""`fleet top` as a person uses it, through the real CLI on two real sshd hosts: on a terminal
it redraws in place until Ctrl-C (exit 0, the run goes on); piped, it prints a table per look
and ends by itself with the run; a run whose end fleet kept is said from the record alone.
(The straggler named or not: test_e2e_straggler.py.)"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.builders import write_job
from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_no_strays, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Both ranks alike: a loop of compute and all_reduce for SECS seconds by rank 0's clock (its
# word to stop travels in the all_reduce: no rank is left waiting in one), a line now and then.
LOOP = '''
import os, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
a, end, step = torch.randn(64, 64), time.time() + float(os.environ["SECS"]), 0
while True:
    for _ in range(5):
        b = a @ a
    t = torch.zeros(256)
    t[0] = float(dist.get_rank() == 0 and time.time() > end)
    dist.all_reduce(t)
    step += 1
    if step % 100 == 0:
        print("step", step, flush=True)
    if t[0] > 0:
        break
dist.destroy_process_group()
'''


CLEAR = "\x1b[H\x1b[2J"  # a live view's redraw: the screen cleared, the cursor home


def live_top(cli: CLI, run_id: str, frames: int) -> tuple[int, str]:
    """`fleet top RUN` on a terminal (stdout and stderr a pty) until it has drawn `frames`
    looks (60 s at most), then Ctrl-C: its exit code and what the terminal showed."""
    parent, child = pty.openpty()
    env = {**cli.env, "TERM": "xterm", "COLUMNS": "160"}
    env.pop("FLEET_PLAIN", None)
    p = subprocess.Popen([sys.executable, "-m", "fleet", "top", run_id, "--interval", "1"],
                         cwd=cli.cwd, env=env, stdout=child, stderr=child,
                         stdin=subprocess.DEVNULL)
    os.close(child)
    said = b""
    try:
        end = time.monotonic() + 60
        # a look drawn whole: the screen cleared, then its verdict line
        while time.monotonic() < end and len(re.findall(
                r"\x1b\[H\x1b\[2J[^\x1b]*straggler: ", said.decode(errors="replace"))) < frames:
            if select.select([parent], [], [], 0.2)[0]:
                said += os.read(parent, 65536)
        p.send_signal(signal.SIGINT)
        end = time.monotonic() + 20
        while p.poll() is None and time.monotonic() < end:
            if select.select([parent], [], [], 0.2)[0]:
                try:
                    said += os.read(parent, 65536)
                except OSError:
                    break
        return p.wait(timeout=10), said.decode(errors="replace")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(parent)


def test_top_live_then_piped_to_the_end_then_from_the_record(cli: CLI, tb2: Testbed,
                                                              tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = write_job(tmp_path, "[rendezvous]\nport = 29971\n", script="loop.py",
                    script_text=LOOP, env={"SECS": "22"})
    r = cli("up", str(job), "--detach", timeout=120)
    assert r.returncode == 0, r.stderr
    run_id = run_id_of(r.stderr)
    try:
        code, screen = live_top(cli, run_id, 2)
        assert code == 0, screen  # Ctrl-C ends a live view: nothing to report
        frames = screen.split(CLEAR)[1:]
        assert len(frames) >= 2, screen  # redrawn in place, look after look
        assert re.search(rf"^run {run_id}: running, 2 node\(s\), ", frames[-1], re.M), screen
        assert re.search(r"^node1\s+0\s+running\s", frames[-1], re.M), screen
        assert re.search(r"^node2\s+1\s+running\s", frames[-1], re.M), screen
        assert "straggler: " in frames[-1] and "interrupted" not in screen, screen
        # The run went on: piped, a table per look until the run has ended, then the end
        r = cli("top", run_id, "--interval", "2", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        heads = re.findall(rf"^run {run_id}: (\w+), 2 node\(s\)", r.stdout, re.M)
        assert heads[:1] == ["running"] and heads[-1] == "succeeded", r.stdout
        assert len(heads) >= 2 and "\x1b[" not in r.stdout, r.stdout
        # Its end kept (status saw it): said from the record, no host asked (node2 cut off)
        assert cli("status", run_id).returncode == 0
        tb2.cut_off("node2")
        try:
            r = cli("top", run_id, "--once", timeout=60)
        finally:
            tb2.reconnect("node2")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.strip() == (f"run {run_id}: succeeded; it has ended: nothing of it runs "
                                    f"to look at (`fleet status {run_id}` says how it ended)")
    finally:
        cli("stop", run_id, timeout=120)
    assert_no_strays(tb2)

