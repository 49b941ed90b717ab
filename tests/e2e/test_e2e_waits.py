"""Waits and words a person reads quickly, end to end on real hosts: the same failure on two
hosts said once naming both; on a terminal, what fleet waits for, and nowhere else; torchrun's
banner kept in the node's log, not shown ahead of the job's first line (`fleet logs` the same),
shown with `fleet --debug`."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

HELLO = 'import os\nprint("hello from rank", os.environ["RANK"], flush=True)\n'


def job(tmp_path: Path, port: int) -> Path:
    (tmp_path / "hello.py").write_text(HELLO)
    path = tmp_path / "job.toml"
    path.write_text(f'inventory = "inv.toml"\nscript = "hello.py"\nnproc_per_node = 2\n'
                    f"[rendezvous]\nport = {port}\n")
    return path


def on_a_terminal(cli: CLI, *args: str) -> tuple[int, str, str]:
    """fleet with stderr a terminal (a pty) and stdout a pipe: exit code, stdout, what the
    terminal got."""
    parent, child = pty.openpty()
    env = {**cli.env, "TERM": "xterm", "COLUMNS": "200"}
    env.pop("FLEET_PLAIN", None)
    p = subprocess.Popen([sys.executable, "-m", "fleet", *args], cwd=cli.cwd, env=env,
                         stdout=subprocess.PIPE, stderr=child, text=True,
                         stdin=subprocess.DEVNULL)
    os.close(child)
    said = b""
    while True:
        try:
            chunk = os.read(parent, 4096)
        except OSError:  # the other end closed: the command ended
            break
        if not chunk:
            break
        said += chunk
    out = p.communicate(timeout=300)[0]
    os.close(parent)
    return p.returncode, out, said.decode(errors="replace")


def test_one_failure_said_once_waits_on_a_terminal_and_no_torchrun_banner(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    path = job(tmp_path, 29961)
    # Both hosts fail the same check with the same words: one line naming both.
    tb2.inventory(tmp_path / "inv.toml", python="/nonexistent/python3")
    bad = cli("up", str(path))
    assert bad.returncode == 5, bad.stdout + bad.stderr
    said = [line for line in bad.stderr.splitlines() if "/nonexistent/python3" in line]
    assert len(said) == 1, bad.stderr
    assert said[0].startswith("  node1, node2: python '/nonexistent/python3' not found"), said
    assert "checking python failed on 2 host(s); nothing was started:" in bad.stderr
    assert "waiting:" not in bad.stderr  # no terminal: no wait's line in what is kept

    tb2.inventory(tmp_path / "inv.toml")
    code, out, terminal = on_a_terminal(cli, "up", str(path))
    assert code == 0, out + terminal
    # What it waited for, drawn in place on the terminal (the counts: no clock involved).
    for what in ("connect", "claim and probe", "sending the code", "start"):
        assert f"waiting: {what}" in terminal, terminal
    assert "\r\x1b[K" in terminal
    # The job's lines, and not torchrun's OMP_NUM_THREADS block ahead of them.
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"{host} r{rank} | hello from rank {rank}" in out, out
    assert "OMP_NUM_THREADS" not in out and "*****" not in out, out
    assert "OMP_NUM_THREADS" not in terminal
    run_id = re.search(r"run (\S+): ", terminal)
    assert run_id, terminal

    # Kept in the node's log: `fleet logs` shows what `up` showed, `fleet --debug logs` all.
    logs = cli("logs", run_id[1])
    assert logs.returncode == 0, logs.stderr
    assert sorted(line for line in logs.stdout.splitlines() if "|" in line) == \
        sorted(line for line in out.splitlines() if "|" in line), logs.stdout + out
    full = cli("--debug", "logs", run_id[1])
    assert full.returncode == 0, full.stderr
    banner = [line for line in full.stdout.splitlines() if "OMP_NUM_THREADS" in line]
    assert sorted(line.split()[0] for line in banner) == ["node1", "node2"], full.stdout


def test_exec_names_the_host_still_running_its_command(cli: CLI, tb2: Testbed,
                                                       tmp_path: Path) -> None:
    """On a terminal, once `fleet exec` has waited a second, the host whose command still runs
    is named with its command (node2 sleeps: what is drawn, not how long it took)."""
    inv = tmp_path / "inv.toml"
    tb2.inventory(inv)
    (tb2.hosts[1].home / "fleet-slow").write_text("")
    try:
        code, out, terminal = on_a_terminal(
            cli, "exec", str(inv), "--", "sh", "-c", "if [ -e fleet-slow ]; then sleep 4; fi")
    finally:
        (tb2.hosts[1].home / "fleet-slow").unlink()
    assert code == 0, out + terminal
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
    assert re.search(r"waiting: the command (1/2 hosts done; )?.*node2 still on `sh -c", drawn), \
        drawn
    assert "node1 still" not in drawn.split("1/2 hosts done")[-1]  # done: no more named
    assert "2 of 2 host(s) exited 0" in drawn


def test_status_on_a_terminal_names_the_node_it_still_waits_for(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    """A live run asked while one host is cut off: the wait names that host (the other has
    answered), and the host is then said unreachable; nothing of the wait is kept off a
    terminal."""
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(300)\n")
    path = tmp_path / "sleep.toml"
    path.write_text('inventory = "inv.toml"\nscript = "sleep.py"\nnproc_per_node = 1\n'
                    "[rendezvous]\nport = 29963\n")
    tb2.inventory(tmp_path / "inv.toml")
    up = cli("up", "--detach", str(path), timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = run_id_of(up.stderr)
    try:
        tb2.cut_off("node2")
        code, out, terminal = on_a_terminal(cli, "status", run_id)
        drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
        assert re.search(rf"waiting: the state of {re.escape(run_id)} 1/2 hosts done; node2 "
                         r"still on its connection \([1-9] s\)", drawn), drawn
        assert code == 3, out + terminal
        assert re.search(r"node2 .* unreachable \(may still be running\)", out), out
        plain = cli("status", run_id, timeout=60)
        assert "waiting:" not in plain.stderr + plain.stdout
        code, out, terminal = on_a_terminal(cli, "status", "--json", run_id)
        assert "waiting:" not in terminal and json.loads(out)["status"], out + terminal
    finally:
        tb2.reconnect("node2")
        stop = cli("stop", run_id, timeout=120)
        assert stop.returncode == 0, stop.stdout + stop.stderr
