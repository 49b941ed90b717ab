"""The in-process CLI (tests.conftest.InProcessCLI) says what the real program says: the same
exit code, stdout and stderr, and it leaves the test's process as it found it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.builders import write_hosts, write_job
from tests.conftest import CLI, InProcessCLI


@pytest.mark.parametrize("args", [
    ("logs", "--tail", "-1"),              # a usage error: click's exit 2
    ("plan", "nowhere.toml"),              # a FleetError through fleet's one handler
    ("ps",),                               # a command's output, exit 0
    ("plan", "--help"),
    ("--version",),
])
def test_in_process_answers_as_the_program_does(tmp_path: Path, args: tuple[str, ...]) -> None:
    write_hosts(tmp_path / "inv.toml")
    write_job(tmp_path, nproc_per_node=1)
    real = CLI(tmp_path)(*args, timeout=120)
    ours = InProcessCLI(tmp_path)(*args)
    assert (ours.returncode, ours.stdout, ours.stderr) == (real.returncode, real.stdout,
                                                           real.stderr)


def test_in_process_leaves_cwd_env_and_signals_as_they_were(tmp_path: Path) -> None:
    cwd, env = os.getcwd(), dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    r = InProcessCLI(tmp_path, {"FLEET_EXTRA_FOR_TEST": "1"})("plan", "missing.toml")
    assert r.returncode == 2 and "missing.toml" in r.stderr, r
    assert os.getcwd() == cwd and dict(os.environ) == env
    assert {s: signal.getsignal(s) for s in handlers} == handlers
