"""`fleet logs` --merge, --tail, --since and -f's last line: the pure parts (the --since parser,
the node's view of its log and its parser, the merge by time, the final line), and the node-side
programs that keep and read a log's times (log_times.py, log_view.sh) under a real `sh`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fleet.backends.hosts import logs as host_logs
from fleet.backends.hosts import node as remote
from fleet.backends.slurm.backend import refuse
from fleet.errors import UsageError
from fleet.run.logs import (
    BACKSTEP_S,
    DISTRUSTED_TAIL,
    View,
    Viewed,
    final_line,
    index_times,
    merged,
    parse_since,
    parse_view,
    placed,
    reread_tail,
)
from fleet.states import RunStatus
from tests.conftest import InProcessCLI

SH = shutil.which("dash") or "sh"
NOW = 1_800_000_000.0


def sh(script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The script as fleet's transport runs it: text on the stdin of a POSIX sh."""
    return subprocess.run([SH, "-s"], input=script, capture_output=True, text=True,
                          timeout=timeout)


# ---- --since ------------------------------------------------------------------------------
@pytest.mark.parametrize(("said", "back"), [
    ("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1.5h", 5400), ("0s", 0),
    (" 10m ", 600),
])
def test_since_a_duration_is_that_long_before_now(said: str, back: float) -> None:
    assert parse_since(said, NOW) == NOW - back


def test_since_an_iso_time_with_its_zone_is_that_instant() -> None:
    assert parse_since("2026-11-24T10:00:00+00:00", NOW) == \
        datetime(2026, 11, 24, 10, tzinfo=UTC).timestamp()
    assert parse_since("2026-11-24T10:00Z", NOW) == \
        datetime(2026, 11, 24, 10, tzinfo=UTC).timestamp()


def test_since_an_iso_time_without_a_zone_is_this_machines_time() -> None:
    assert parse_since("2026-11-24 10:00", NOW) == datetime(2026, 11, 24, 10).timestamp()


@pytest.mark.parametrize("said", ["10x", "", "m", "-5m", "10 m s", "yesterday", "5", "1e3s"])
def test_since_anything_else_is_refused_naming_the_option(said: str) -> None:
    with pytest.raises(UsageError, match=r"^--since .*neither a duration .* nor an ISO time"):
        parse_since(said, NOW)


def test_a_bad_since_through_the_cli_exits_2_naming_the_option(tmp_path: Path) -> None:
    r = InProcessCLI(tmp_path)("logs", "--since", "10 minutes")
    assert r.returncode == 2, r.stderr
    assert "--since '10 minutes': neither a duration" in r.stderr, r.stderr


def test_a_negative_tail_through_the_cli_exits_2(tmp_path: Path) -> None:
    r = InProcessCLI(tmp_path)("logs", "--tail", "-1")
    assert r.returncode == 2 and "--tail" in r.stderr, r.stderr


def test_only_no_option_at_all_is_the_plain_view() -> None:
    assert View().plain
    assert not View(merge=True).plain and not View(tail=0).plain
    assert not View(since=NOW).plain


@pytest.mark.parametrize(("view", "why"), [
    (View(merge=True), "--merge and --since read the times"),
    (View(since=NOW), "--merge and --since read the times"),
    (View(tail=3), "--tail: on Slurm, each node's log says the node's rank on its first line"),
])
def test_slurm_refuses_what_its_logs_cannot_give(view: View, why: str) -> None:
    with pytest.raises(UsageError, match=re.escape(why)):
        refuse(view)
    refuse(View())  # the plain view, as ever


# ---- the node's view of its log -----------------------------------------------------------
def test_parse_view_reads_times_lines_and_where_to_resume() -> None:
    out = "rc noise\nsize=20 now=105.5\n100.25 a b\n- c\r\n101 d\n- 50%\r100%\nend=17\n"
    v = parse_view(out)
    assert v == Viewed([(100.25, "a b"), (None, "c"), (101.0, "d"), (None, "100%")], 105.5, 17)


def test_parse_view_keeps_a_line_that_looks_like_its_own_frame() -> None:
    v = parse_view("size=9 now=1\n1.0 end=3\n- size=2\nend=9\n")
    assert v.lines == [(1.0, "end=3"), (None, "size=2")] and v.end == 9


@pytest.mark.parametrize("out", ["", "size=3 now=1\n1.0 a\n", "1.0 a\nend=2\n",
                                 "end=1\nsize=3 now=1\n"])
def test_parse_view_refuses_a_view_cut_short(out: str) -> None:
    with pytest.raises(ValueError, match="cut short"):
        parse_view(out)


@pytest.mark.parametrize(("stamps", "why"), [
    (["100", "nan", "101"], "a time that is not one: 'nan'"),
    (["inf"], "a time that is not one: 'inf'"),
    (["-5"], "a time that is not one: '-5'"),
    (["1e400"], "a time that is not one: '1e400'"),
    (["12:00"], "a time that is not one: '12:00'"),
    (["\x1b[31m"], "a time that is not one: '^[[31m'"),
    (["100", "1e12"], "a time after the node's own clock: '1e12'"),
    (["100", "104", "99.5"], "a time before an earlier line's: '99.5'"),
])
def test_a_time_index_that_is_not_fleets_is_set_aside(stamps: list[str], why: str) -> None:
    """node.times lies in the run directory, where the job can write: a bad entry makes the
    whole index untrusted, its lines untimed, never the node unreachable."""
    assert index_times(stamps, 200.0) == ([None] * len(stamps), why)


def test_a_clean_time_index_is_kept() -> None:
    assert index_times(["100", "100", "203.5", "-", "-"], 200.0) == (
        [100.0, 100.0, 203.5, None, None], "")


def test_a_small_step_back_of_the_nodes_clock_is_taken_in_order() -> None:
    """Review LOW 12: an NTP correction steps fleet's own node.times back; under BACKSTEP_S
    it keeps the index (the line takes the earlier line's time), beyond it sets it aside."""
    assert index_times(["100", "101.5", "100.2", "103"], 200.0) == (
        [100.0, 101.5, 101.5, 103.0], "")
    assert index_times(["104", str(104 - BACKSTEP_S)], 200.0)[1] == ""
    assert index_times(["104", "101.9"], 200.0)[1] == "a time before an earlier line's: '101.9'"


def test_a_set_aside_index_is_read_again_bounded() -> None:
    """--since on a node whose index is set aside reads only its last lines again, not the
    whole log; a --tail the user gave is that bound."""
    assert reread_tail(None) == DISTRUSTED_TAIL
    assert reread_tail(50) == 50


def test_parse_view_sets_a_nan_index_aside() -> None:
    v = parse_view("size=9 now=200\n100.5 a\nnan b\n- c\nend=9\n")
    assert v == Viewed([(None, "a"), (None, "b"), (None, "c")], 200.0, 9,
                       "a time that is not one: 'nan'")
    assert placed(v, 1.0) == [(199.0, "a"), (199.0, "b"), (199.0, "c")]


def test_placed_takes_the_clock_offset_off_and_dates_unstamped_lines_by_now() -> None:
    v = Viewed([(100.0, "a"), (None, "b")], 107.0, 4)
    assert placed(v, 2.5) == [(97.5, "a"), (104.5, "b")]


def test_merged_orders_by_time_a_tie_by_node_then_the_nodes_own_order() -> None:
    n1 = [(1.0, "n1 a"), (3.0, "n1 b"), (3.0, "n1 c")]
    n2 = [(0.5, "n2 a"), (3.0, "n2 b"), (4.0, "n2 c")]
    assert merged([n1, n2], None) == ["n2 a", "n1 a", "n1 b", "n1 c", "n2 b", "n2 c"]
    assert merged([n1, n2], 2) == ["n2 b", "n2 c"]
    assert merged([n1, n2], 0) == []
    assert merged([n1, n2], 99) == merged([n1, n2], None)
    # a tail a little longer than the stream is the whole stream, not its end counted back
    assert merged([n1, n2], 8) == merged([n1, n2], None)


def test_a_lines_time_that_is_not_a_number_is_set_aside_the_nodes_own_refused() -> None:
    for bad in ("nan", "inf", "-inf"):  # node.times: the job can write it
        v = parse_view(f"size=10 now=5.0\n{bad} line\nend=10\n")
        assert v.lines == [(None, "line")] and v.distrusted.startswith("a time that is not one")
    with pytest.raises(ValueError):  # `date` on the node, not the job's
        parse_view("size=10 now=nan\nend=10\n")


def test_the_final_line_is_the_runs_state_and_each_nodes_as_status_says_them() -> None:
    described = ["run r-1 (job.toml), started Tue Nov 24 10:00:00 2026: stopped",
                 "  node1            node rank 0 (ranks 0-1)  stopped (exit 143) by fleet stop  4s",
                 "  node2            node rank 1 (ranks 2-3)  stopped (exit 143) by fleet stop  4s"]
    assert final_line("r-1", RunStatus.STOPPED, described) == (
        "run r-1 stopped: node1 node rank 0 (ranks 0-1) stopped (exit 143) by fleet stop 4s; "
        "node2 node rank 1 (ranks 2-3) stopped (exit 143) by fleet stop 4s")
    assert final_line("r-2", RunStatus.SUCCEEDED, ["run r-2: succeeded"]) == "run r-2 succeeded"
    assert final_line("r-3", RunStatus.NEVER_STARTED, ["run r-3: never started\n  it ended"]) \
        == "run r-3 never started: it ended"


# ---- log_view.sh --------------------------------------------------------------------------
def write_log(d: Path, log: bytes, times: str | None) -> None:
    (d / "node.log").write_bytes(log)
    if times is not None:
        (d / "node.times").write_text(times)


def view(d: Path, since: float | None = None, tail: int | None = None) -> Viewed:
    r = sh(host_logs.view_script(str(d), since, tail))
    assert r.returncode == 0, r.stderr
    return parse_view(r.stdout)


def test_log_view_dates_each_line_by_the_first_stamp_that_covers_it(tmp_path: Path) -> None:
    # Offsets count bytes: "ééé" is 6 of them (were it 3, the stamp at 9 would date it).
    write_log(tmp_path, "a\nbb\nééé\ndd\nunfinished".encode(), "2 100.5\n5 101.0\n9 101.5\n"
              "12 102.0\n")
    v = view(tmp_path)
    assert v.lines == [(100.5, "a"), (101.0, "bb"), (102.0, "ééé"), (None, "dd")]
    assert v.end == 15  # the line still being written is left for the follower
    assert abs(v.now - time.time()) < 5


def test_log_view_since_keeps_lines_at_or_after_it_and_those_without_a_time(
        tmp_path: Path) -> None:
    write_log(tmp_path, b"a\nbb\nccc\ndd\n", "2 100.5\n5 101.0\n9 102.0\n")
    assert [line for _, line in view(tmp_path, since=101.0).lines] == ["bb", "ccc", "dd"]
    assert [line for _, line in view(tmp_path, since=101.5).lines] == ["ccc", "dd"]
    assert view(tmp_path, since=101.5).end == 12


def test_log_view_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    write_log(tmp_path, b"a\nbb\nccc\ndd\n", "2 100.5\n5 101.0\n12 102.0\n")
    assert view(tmp_path, tail=2).lines == [(102.0, "ccc"), (102.0, "dd")]
    assert view(tmp_path, tail=0).lines == []
    assert len(view(tmp_path, tail=10).lines) == 4
    assert view(tmp_path, since=100.9, tail=1).lines == [(102.0, "dd")]
    assert view(tmp_path, tail=0).end == 12


def test_log_view_without_an_index_says_no_times(tmp_path: Path) -> None:
    write_log(tmp_path, b"a\nb\n", None)
    assert view(tmp_path, since=NOW).lines == [(None, "a"), (None, "b")]


def test_log_view_of_a_missing_log_fails(tmp_path: Path) -> None:
    r = sh(host_logs.view_script(str(tmp_path / "gone"), None, None))
    assert r.returncode == 3 and "no node.log" in r.stderr


# ---- log_times.py, started by start.sh ----------------------------------------------------
def test_start_keeps_a_time_index_of_node_log_until_the_wrapper_ends(tmp_path: Path) -> None:
    # each write waits for the test to open its gate (a file): the stamps follow the gates
    gate = 'while [ ! -e {0} ]; do sleep 0.02; done\n'
    (tmp_path / "run.sh").write_text(
        'echo $$ > pid\necho one\n' + gate.format("go1") + 'printf "two\\nthree\\n"\n' +
        gate.format("go2") + 'printf "half"\n' + gate.format("go3") + 'echo " line"\n')
    index = tmp_path / "node.times"
    deadline = time.monotonic() + 20

    def wait(what: Callable[[], bool]) -> None:
        while not what():
            assert time.monotonic() < deadline, f"index: {index.read_text()!r}"
            time.sleep(0.02)

    def offsets() -> list[str]:
        return index.read_text().split()[0::2] if index.is_file() else []

    began = time.time()
    r = sh(remote.start_script(str(tmp_path), "r-1", sys.executable))
    assert r.returncode == 0, r.stderr
    pid = remote.parse_start(r.stdout)[0]
    assert pid is not None
    opened: list[float] = []
    for name, seen in (("go1", lambda: offsets() == ["4"]),
                       ("go2", lambda: offsets() == ["4", "14"]),
                       ("go3", lambda: (tmp_path / "node.log").read_bytes().endswith(b"half"))):
        wait(seen)
        assert offsets() == (["4"] if name == "go1" else ["4", "14"])  # "half": no stamp
        opened.append(time.time())
        (tmp_path / name).touch()
    wait(lambda: offsets()[-1:] == ["24"])
    stamps = [(int(o), float(t)) for o, t in map(str.split, index.read_text().splitlines())]
    assert [o for o, _ in stamps] == [4, 14, 24], stamps  # whole lines only, each once
    times = [t for _, t in stamps]
    # a stamp is written to the millisecond, rounded: compared within half of one
    half_ms = 0.0005 + 1e-6
    assert began - half_ms <= times[0] and times == sorted(times)
    assert times[-1] <= time.time() + half_ms
    # each line stamped as it came: "one" before the first gate opened, "two" after it, and
    # "half line" once it was whole, after the last
    assert times[0] - half_ms <= opened[0] <= times[1] + half_ms, (times, opened)
    assert times[1] - half_ms <= opened[1] <= opened[2] <= times[2] + half_ms, (times, opened)
    v = view(tmp_path)
    assert [line for _, line in v.lines] == ["one", "two", "three", "half line"]
    assert [t for t, _ in v.lines] == [times[0], times[1], times[1], times[2]]
    # The wrapper ended: so does the index's keeper, and nothing of it is left.
    deadline = time.monotonic() + 10
    while keepers(tmp_path):
        assert time.monotonic() < deadline, keepers(tmp_path)
        time.sleep(0.05)


def keepers(run_dir: Path) -> list[int]:
    """Processes of log_times.py for this run directory."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run_dir).encode() in argv and p.name.isdigit() and int(p.name) != os.getpid():
            found.append(int(p.name))
    return found


def test_start_without_a_python_keeps_no_index(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text("echo $$ > pid\necho one\n")
    r = sh(remote.start_script(str(tmp_path), "r-1"))
    assert r.returncode == 0, r.stderr
    time.sleep(0.3)
    assert not (tmp_path / "node.times").exists()
