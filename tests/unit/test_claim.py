"""The claim script under a real sh (two claimants of one directory, a holder that dies) and the
parser of its answer."""

from __future__ import annotations

import subprocess
from pathlib import Path

from fleet.backends.hosts.claim import (
    Answer,
    ClaimState,
    claim_script,
    marked,
    parse_answer,
    section,
)


def start(workdir: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["sh", "-c", claim_script(str(workdir), run_id)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)


def test_one_claimant_at_a_time_and_a_dead_holder_lets_go(tmp_path: Path) -> None:
    first = start(tmp_path / "fleet", "run-a")
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "claimed"
        second = start(tmp_path / "fleet", "run-b")
        out, _ = second.communicate(timeout=10)
        assert out.splitlines() == ["busy run-a"]
        assert second.returncode == 0
        assert first.stdout.readline().strip() == "."  # still holding, saying so each second
    finally:
        first.kill()  # as a dropped connection: its shell dies
        first.wait(10)
    third = start(tmp_path / "fleet", "run-c")
    try:
        assert third.stdout is not None
        assert third.stdout.readline().strip() == "claimed"
    finally:
        third.kill()
        third.wait(10)


def test_a_closed_channel_ends_the_holder(tmp_path: Path) -> None:
    """fleet closing the channel is a write to a closed pipe: SIGPIPE ends the holder."""
    holder = start(tmp_path / "fleet", "run-a")
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "claimed"
    holder.stdout.close()
    assert holder.wait(10) != 0


def test_parse_answer_takes_only_its_words_and_a_clean_holder() -> None:
    assert parse_answer("claimed") == Answer(ClaimState.CLAIMED)
    assert parse_answer("busy run-1\x1b]52;c;x\x07") == Answer(ClaimState.BUSY, "run-152cx")
    assert parse_answer("unsupported\n") == Answer(ClaimState.UNSUPPORTED)
    assert parse_answer(".") is None and parse_answer("Welcome to the lab") is None


def test_a_filesystem_that_cannot_lock_is_unsupported_not_busy(tmp_path: Path) -> None:
    """flock failing for another reason than a holder (ENOLCK on some NFS mounts, here a stand-in
    flock that fails so) must not read as another launch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flock").write_text("#!/bin/sh\necho 'flock: No locks available' >&2\nexit 71\n")
    (bin_dir / "flock").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    p = subprocess.run(["sh", "-c", claim_script(str(tmp_path / "fleet"), "run-a")],
                       capture_output=True, text=True, env=env, timeout=10)
    assert p.stdout.splitlines() == ["unsupported"], p.stdout + p.stderr


def test_then_runs_once_claimed_between_its_markers_in_the_home(tmp_path: Path) -> None:
    """The launch's probe rides on the claim: it runs after "claimed", from the home directory,
    and its lines come between the markers that section() reads; the holding goes on after."""
    home = tmp_path / "home"
    home.mkdir()
    then = marked("pwd; echo 'py={}'", "m1")
    p = subprocess.Popen(["sh", "-c", claim_script(str(tmp_path / "fleet"), "run-a", then)],
                         stdout=subprocess.PIPE, text=True, start_new_session=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(home)})
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline().rstrip("\n") for _ in range(6)]
    finally:
        p.kill()
        p.wait(10)
    assert lines[:5] == ["claimed", "m1-begin", str(home), "py={}", "m1-end"]
    assert lines[5] == "."  # still holding
    assert section(lines, "m1") == f"{home}\npy={{}}"


def test_then_does_not_run_for_a_busy_host(tmp_path: Path) -> None:
    first = start(tmp_path / "fleet", "run-a")
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "claimed"
        out = subprocess.run(["sh", "-c", claim_script(str(tmp_path / "fleet"), "run-b",
                                                       marked("echo probed", "m2"))],
                             capture_output=True, text=True, timeout=10).stdout
        assert out.splitlines() == ["busy run-a"]
    finally:
        first.kill()
        first.wait(10)


def test_section_takes_only_what_lies_between_the_markers() -> None:
    assert section(["claimed", "m-begin", "a=1", "", "b=2", "m-end", "."], "m") == "a=1\n\nb=2"
    assert section(["claimed", "m-begin", "a=1"], "m") is None  # the end never came
    assert section(["m-end", "a=1"], "m") is None
    assert section(["noise", "x-begin", "m-begin", "m-end"], "m") == ""
