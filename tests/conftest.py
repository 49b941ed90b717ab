"""Shared fixtures: the real CLI as a subprocess, and testbeds of real sshd hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    return CLI(tmp_path)


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
