"""`fleet logs -f`: its header (the run, its state as recorded, its nodes) comes at once, before
any host answers; Ctrl-C says that the run goes on and exits 130, as any interruption (0 would
read as the run's success)."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet.cli.run_views import header
from fleet.config.inventory import Host
from fleet.lifecycle import history
from fleet.run import record
from fleet.states import RunStatus
from tests.unit.test_fast_start import env, silent_ssh_port

RUN_ID = "mnist-20250101-120000-49b0"


def save(tmp: Path, port: int = 22) -> record.RunRecord:
    rec = record.RunRecord(RUN_ID, "jobs/mnist.toml", time.time(), tuple(
        record.NodeRecord(Host(name, "127.0.0.1", port=port), i, f"~/fleet/runs/{RUN_ID}/{name}",
                          i, 1) for i, name in enumerate(("node1", "node2"))))
    d = tmp / "state" / "runs" / RUN_ID
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(dataclasses.asdict(rec)))
    return rec


def test_the_header_says_the_run_its_recorded_state_and_its_nodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    rec = save(tmp_path)
    said = header(rec, [rec])
    assert said.startswith(f"following run {RUN_ID} (no end recorded yet) on node1, node2, "
                           "started "), said
    assert said.endswith("; Ctrl-C stops following, not the run"), said
    history.keep(RUN_ID, RunStatus.FAILED, 1, "fleet up", f"run {RUN_ID} failed")
    assert f"run {RUN_ID} (failed) on node1, node2" in header(rec, [rec])


def test_header_first_while_no_host_answers_and_ctrl_c_says_the_run_goes_on(
        tmp_path: Path) -> None:
    """The nodes' sshd takes the connection and never says a word: the header is out while
    fleet waits for them, and Ctrl-C then ends the following, not the run."""
    with silent_ssh_port() as s:
        save(tmp_path, s.getsockname()[1])
        p = subprocess.Popen([sys.executable, "-m", "fleet", "logs", "-f", RUN_ID], cwd=tmp_path,
                             env=env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL)
        try:
            assert p.stderr is not None
            first = p.stderr.readline()  # while no host has answered
            assert first.startswith(f"fleet: following run {RUN_ID} (no end recorded yet) on "
                                    "node1, node2"), first
            time.sleep(0.5)  # into the wait for the hosts (no assertion on time)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=60)
        finally:
            p.kill()
    assert p.returncode == 130, (out, err)
    assert err == (f"fleet: stopped following; run {RUN_ID} goes on (`fleet stop {RUN_ID}` "
                   "stops it)\n"), err
    assert out == ""
