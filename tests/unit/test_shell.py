"""The one quoting path: hostile strings reach the shell literally and execute nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleet.shell import AND, Raw, sh

HOSTILE = ["plain", "with space", "it's", 'dq"', "$(touch pwned)", "`touch pwned`", "a;b",
           "x && touch pwned", "line\nbreak", "tab\tch", "~root", "*", "-n", "", "\\", "$HOME",
           "!!", "{a,b}", "ünïcødé"]


@pytest.mark.parametrize("value", HOSTILE)
def test_sh_round_trips_through_a_real_shell(tmp_path: Path, value: str) -> None:
    cmd = sh("printf", "%s", value)
    out = subprocess.run(["/bin/sh", "-c", cmd], cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout == value
    assert not list(tmp_path.glob("pwned*"))


def test_raw_parts_stay_operators() -> None:
    assert sh("true", AND, "echo", "a b") == "true && echo 'a b'"
    assert sh(Raw(">"), "f") == "> f"
