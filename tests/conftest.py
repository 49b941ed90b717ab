"""Shared fixtures: the real CLI as a subprocess, the same CLI in-process (for unit tests where a
real process proves nothing), and testbeds of real sshd hosts."""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest

from tests.slurmbed import Slurm
from tests.slurmbed import available as slurm_available
from tests.testbed import Testbed, available

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "jobs"


class CLI:
    """Runs `python -m fleet ...` in a scratch directory with its own run state."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = {**os.environ, "FLEET_STATE_DIR": str(cwd / ".fleet"), "NO_COLOR": "1",
                    "PYTHONPATH": str(ROOT)}

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleet", *args], cwd=self.cwd, env=self.env,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "fleet", *args], cwd=self.cwd,
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)


class InProcessCLI:
    """fleet's own `main` (its one error handler: the same messages and exit codes as the
    program) run in this process, in a scratch directory with its own run state, stdin empty and
    its output captured: what `CLI` does, less the ~1 s each process pays to import fleet. For
    tests of what a command says and exits with; a test of the process itself (signals, the
    console script, completion in a real bash, start-up time) runs the real one (`CLI`)."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.env = {"FLEET_STATE_DIR": str(cwd / ".fleet"), "NO_COLOR": "1", **(env or {})}

    def __call__(self, *args: str, timeout: float = 300,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`timeout` bounds the command's wall time as `CLI`'s does (an assertion here: a thread
        cannot be killed), so a test that a command gives up quickly still says so."""
        from fleet.cli import SIGNALS, main

        out, err = io.StringIO(), io.StringIO()
        handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
        paramiko_handlers = list(logging.getLogger("paramiko").handlers)
        saved_env, saved_cwd = dict(os.environ), os.getcwd()
        code: int = 0
        os.environ.update({**self.env, **(env or {})})
        started = time.monotonic()
        try:
            os.chdir(self.cwd)
            with mock.patch.object(sys, "argv", ["fleet", *args]), \
                    mock.patch.object(sys, "stdin", io.StringIO()), \
                    redirect_stdout(out), redirect_stderr(err):
                try:
                    main()
                except SystemExit as e:  # as the interpreter turns it into a status
                    if e.code is None or isinstance(e.code, int):
                        code = e.code or 0
                    else:
                        print(e.code, file=sys.stderr)
                        code = 1
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
            for sig, handler in handlers.items():  # main leaves its at-exit handlers behind
                signal.signal(sig, handler)
            logging.getLogger("paramiko").handlers[:] = paramiko_handlers
        took = time.monotonic() - started
        assert took <= timeout, f"fleet {' '.join(args)} took {took:.1f}s (> {timeout}s)"
        return subprocess.CompletedProcess(["fleet", *args], code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    return CLI(tmp_path)


@pytest.fixture
def fleet_cli(tmp_path: Path) -> InProcessCLI:
    """The CLI in-process (see InProcessCLI), in tmp_path."""
    return InProcessCLI(tmp_path)


def _need_testbed() -> None:
    why = available()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"end-to-end tests must run in CI, but the testbed cannot: {why}")
    pytest.skip(f"testbed unavailable: {why}")


@pytest.fixture(scope="module")
def tb2() -> Iterator[Testbed]:
    """Two real hosts for a test module."""
    _need_testbed()
    with Testbed(2) as tb:
        yield tb


@pytest.fixture(scope="module")
def tb3() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3) as tb:
        yield tb


@pytest.fixture
def need_testbed() -> None:
    _need_testbed()


@pytest.fixture(scope="module")
def slurm() -> Iterator[Slurm]:
    """Two hosts with one home (a cluster's shared filesystem) and a real Slurm on both
    (tests/slurmbed.py), for a test module."""
    _need_testbed()
    why = slurm_available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the Slurm tests must run in CI, but cannot: {why}")
        pytest.skip(f"Slurm unavailable: {why}")
    with Testbed(2, shared_home=True) as tb, Slurm(tb) as cluster:
        print(f"\nslurm: cluster up in {cluster.start_seconds:.2f}s")
        yield cluster


E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ is an end-to-end test (`-m "not e2e"`: the fast loop), and
    none elsewhere is."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
