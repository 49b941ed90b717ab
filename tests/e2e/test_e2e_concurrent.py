"""Two launches on the same hosts at once, end to end through the real CLI: the second is
refused before it writes anything while the first prepares (its upload and setup), so no code
crosses between the runs; once the first runs, the second is refused by its live run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

TRAIN = '''
import os, time
from version import VERSION
print(f"running version {VERSION} on {os.uname().nodename}", flush=True)
time.sleep(float(os.environ.get("HOLD_S", "0")))
'''


def test_a_second_launch_is_refused_while_the_first_prepares(cli: CLI, tb2: Testbed,
                                                             tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "version.py").write_text('VERSION = "A"\n')
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nscript = "train.py"\n'
                   'nproc_per_node = 1\nlauncher = "command"\n'
                   'command = ["{python}", "train.py"]\nsetup = "echo preparing"\n'
                   '[env]\nHOLD_S = "8"\n[rendezvous]\nport = 29731\n')
    resume = tmp_path / "resume"
    first_env = {**cli.env, "FLEET_FAULT": "setup:pause", "FLEET_FAULT_RESUME": str(resume)}
    saved, cli.env = cli.env, first_env
    first = cli.popen("up", str(job))  # holds both hosts, paused in its setup
    cli.env = saved
    try:
        assert first.stderr is not None
        deadline = time.monotonic() + 120
        seen = []
        for line in first.stderr:
            seen.append(line)
            if "fault point setup reached" in line or time.monotonic() > deadline:
                break
        first_id = run_id_of("".join(seen))
        # The same job, edited: the old check passed it (no live run yet) and it synced B's
        # code into the directory A was about to run from.
        (code / "version.py").write_text('VERSION = "B"\n')
        second = cli("up", str(job), timeout=120)
        assert second.returncode == 6, second.stdout + second.stderr
        # the same words for both hosts: said once, naming both
        assert f"node1, node2: another `fleet up` (run {first_id}) is preparing this host " \
               "right now" in second.stderr, second.stderr
        assert "nothing was started" in second.stderr
        assert "code: sent" not in second.stderr  # it wrote nothing
        second_id = run_id_of(second.stderr)
        for h in tb2.hosts:
            assert not (h.home / "fleet" / "runs" / second_id).exists()
        resume.touch()
        # While the first one runs, a launch is refused by its live run (as before).
        deadline = time.monotonic() + 120
        while not all(tb2.run_processes(h.name, first_id) for h in tb2.hosts):
            assert time.monotonic() < deadline and first.poll() is None, "A never ran"
            time.sleep(0.2)
        for _ in range(20):  # the claim goes once every node has started: a moment later
            third = cli("up", str(job), timeout=120)
            if "is preparing this host" not in third.stderr:
                break
            time.sleep(0.5)
        assert third.returncode == 6, third.stdout + third.stderr
        assert f"held by run {first_id} (still running)" in third.stderr, third.stderr
        out, err = first.communicate(timeout=180)
    finally:
        resume.touch()
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, out + err
    # A ran A's code on both nodes: nothing of B reached the directory it ran from.
    for host in ("node1", "node2"):
        assert f"running version A on {host}" in out, out
    assert "version B" not in out
    assert_nothing_left(tb2, first_id)
    # Released: the edited job runs now, with B's code.
    again = cli("up", str(job), timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "running version B on node2" in again.stdout
