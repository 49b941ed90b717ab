"""The `fleet` process (fleet.cli.program): main, then out at once with the status the
interpreter would have given, whatever main ended with, its output flushed first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize(("ends", "status", "stderr"), [
    ("None", 0, ""), ("0", 0, ""), ("7", 7, ""), ("'fleet: words'", 1, "fleet: words\n"),
])
def test_the_status_is_the_interpreters(ends: str, status: int, stderr: str) -> None:
    r = run("import sys, fleet.cli as c\n"
            "def main():\n"
            "    print('said', end='')  # unflushed: still said\n"
            f"    raise SystemExit({ends})\n"
            "c.main = main\n"
            "c.program()\n"
            "print('never')\n")
    assert (r.returncode, r.stdout, r.stderr) == (status, "said", stderr)


def test_the_command_itself() -> None:
    r = run("import sys; sys.argv = ['fleet', *sys.argv[1:]]\nimport runpy\n"
            "runpy.run_module('fleet', run_name='__main__')", "up", "missing.toml")
    assert r.returncode == 2 and "missing.toml" in r.stderr, r
