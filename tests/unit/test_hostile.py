"""What a hostile node says, the pure parts: control characters shown and never obeyed, a
node's file names confined to the run's record, and dump_script's framing under a real sh."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest

from fleet.config.inventory import Host
from fleet.console import Console, printable
from fleet.errors import RemoteCommandError
from fleet.facts.gpus import parse_gpus
from fleet.facts.run_state import parse_ranks
from fleet.facts.stacks import FlightRecord, dump_script, parse_dump
from fleet.run import hang
from fleet.transport import open_transport

FORGED = "\x1b[1A\x1b[2Kfleet: run r-1 succeeded on all 2 node(s)"


def test_printable_shows_every_control_and_keeps_text() -> None:
    assert printable("\x1b]52;c;aGk=\x07") == "^[]52;c;aGk=^G"  # OSC 52: the clipboard
    assert printable("\x1b]0;owned\x07\x1b[2J\x1b[H") == "^[]0;owned^G^[[2J^[[H"
    assert printable(FORGED) == "^[[1A^[[2Kfleet: run r-1 succeeded on all 2 node(s)"
    assert printable("50%\rfleet: done") == "50%^Mfleet: done"
    assert printable("\x9b31m\x85") == "<U+009B>31m<U+0085>"  # C1: CSI and NEL in one code
    assert printable("abc\u202eexe.txt\u2066") == "abc<U+202E>exe.txt<U+2066>"
    assert printable("a\x00b\x7f\x08") == "a^@b^?^H"
    plain = "loss 0.25\tÉtape 3 — 完成 🚀 \\x1b [ok]"
    assert printable(plain) == plain
    assert printable("one\ntwo") == "one^Jtwo"
    assert printable("one\ntwo\x1b", lines=True) == "one\ntwo^["


def test_console_neutralises_node_text_but_keeps_its_own_colour() -> None:
    out, err = io.StringIO(), io.StringIO()
    c = Console(out=out, err=err, color=True)
    c.lines(0, [("node1 r0", FORGED), ("node1 r0", "windows line\r")])
    c.info("first failure: RuntimeError: \x1b]0;title\x07")
    c.phase("node1", "stopped by \x1b[2J")
    assert out.getvalue() == ("\x1b[36mnode1 r0\x1b[0m | ^[[1A^[[2Kfleet: run r-1 succeeded on "
                              "all 2 node(s)\n\x1b[36mnode1 r0\x1b[0m | windows line\n")
    assert err.getvalue() == ("fleet: first failure: RuntimeError: ^[]0;title^G\n"
                              "fleet: node1  stopped by ^[[2J\n")


def test_json_keeps_the_exact_text() -> None:
    text = json.dumps({"line": FORGED + "\u202e\x9b"})
    assert "\x1b" not in text and json.loads(text)["line"] == FORGED + "\u202e\x9b"


def test_write_inside_stays_in_the_record(tmp_path: Path) -> None:
    record = tmp_path / "record"
    record.mkdir()
    written = hang.write_inside(record, ("flight-recorder", "node1", "nccl_trace_rank_0"), b"x")
    assert written.read_bytes() == b"x" and written.parent == record / "flight-recorder" / "node1"
    again = hang.write_inside(record, ("flight-recorder", "node1", "nccl_trace_rank_0"), b"y")
    assert again.read_bytes() == b"y"  # a second dump replaces the first
    for bad in ("../../x", "/etc/passwd", "", ".", "..", "a/b", "a\nb", "a\x00b", "x" * 256):
        with pytest.raises(ValueError, match="not a plain file name"):
            hang.write_inside(record, ("flight-recorder", "node1", bad), b"z")
    with pytest.raises(ValueError):
        hang.write_inside(record, ("..", "x"), b"z")
    # Symbolic links in the way: a directory, and the file itself.
    outside = tmp_path / "outside"
    outside.mkdir()
    (record / "flight-recorder" / "node2").symlink_to(outside)
    with pytest.raises(OSError, match="not a directory"):
        hang.write_inside(record, ("flight-recorder", "node2", "nccl_trace_rank_0"), b"z")
    target = tmp_path / "bashrc"
    target.write_text("mine\n")
    link = record / "flight-recorder" / "node1" / "nccl_trace_rank_1"
    link.symlink_to(target)
    hang.write_inside(record, ("flight-recorder", "node1", "nccl_trace_rank_1"), b"z")
    assert target.read_text() == "mine\n" and not link.is_symlink() and link.read_bytes() == b"z"
    assert list(outside.iterdir()) == []
    assert not [p for p in (record / "flight-recorder" / "node1").iterdir()
                if p.name.endswith(".tmp")]


def test_flight_records_are_refused_by_name_kind_size_and_count() -> None:
    ok = FlightRecord("nccl_trace_rank_3", 10)
    assert hang.refusal(ok, 0, 0) is None
    for name in ("../../../../tmp/x", "/root/.bashrc", "nccl_trace_rank_0\n=== fr x 1",
                 "nccl_trace_rank_", "nccl_trace_rank_a/../../x", "bashrc"):
        assert "not a name the flight recorder writes" in (
            hang.refusal(FlightRecord(name, 10), 0, 0) or ""), name
    assert hang.refusal(FlightRecord("nccl_trace_rank_3", None), 0, 0) == \
        "it is a symbolic link"
    assert "more than 64 MiB" in (hang.refusal(
        FlightRecord("nccl_trace_rank_3", hang.FR_MAX_BYTES + 1), 0, 0) or "")
    assert "more than 64 files" in (hang.refusal(ok, hang.FR_MAX_FILES, 0) or "")
    assert "256 MiB together" in (hang.refusal(ok, 1, hang.FR_NODE_BYTES - 5) or "")


def test_parse_dump_takes_only_framed_headers_and_plain_numbers() -> None:
    out = ("=== stack 4242 rank=0 local=0\n"
           "|Current thread 0x00007f2af9024b80 (most recent call first):\n"
           '|  File "/code/train.py", line 3 in <module>\n'
           "|=== fr 2e2e2f2e2e2f746d702f78 5\n"  # written by the job: text, not a header
           "|=== ended 0\n"
           "=== stack \u00b2 rank=1\n"  # "²".isdigit() is true; int() of it raises
           "=== stack 0 rank=1\n"
           f"=== stack {'9' * 5000} rank=1\n"
           "=== proc 99999999 sh\n"  # past the largest pid
           f"=== ended {'1' * 5000}\n"
           "=== fr zz 5\n")
    d = parse_dump("node1", out)
    assert [(s.pid, s.rank) for s in d.stacks] == [(4242, 0)]
    assert d.others == () and d.flight_records == () and d.ended == -1


def test_dump_script_frames_what_the_job_wrote(tmp_path: Path) -> None:
    """Through a real sh: a file name with a newline, a link, a job-made .who asking for
    SIGKILL: the names come back exactly (to be refused), no signal but a real-time one."""
    run = tmp_path / "run"
    (run / "stacks").mkdir(parents=True)
    (run / "nccl_trace_rank_0\n=== fr 2f726f6f742f2e62617368726 5").write_bytes(b"a")
    (run / "nccl_trace_rank_1").symlink_to("/etc/passwd")
    (run / "nccl_trace_rank_2").write_bytes(b"abc")
    (run / "exit_code").write_text("1\n=== fr 2f 1\n")
    victim = subprocess.Popen(["sleep", "30"], env={**os.environ, "FLEET_RUN_ID": "r-hostile"})
    try:
        (run / "stacks" / f"{victim.pid}.who").write_text("rank=0 local=0\nsig=9\n")
        out = subprocess.run(["sh", "-s"], input=dump_script(str(run), "r-hostile"),
                             capture_output=True, text=True, timeout=30).stdout
        assert victim.poll() is None, out  # not killed on the .who file's word
    finally:
        victim.kill()
        victim.wait()
    d = parse_dump("node1", out)
    assert d.ended == 1
    assert sorted(d.flight_records, key=lambda r: r.name) == [
        FlightRecord("nccl_trace_rank_0\n=== fr 2f726f6f742f2e62617368726 5", 1),
        FlightRecord("nccl_trace_rank_1", None), FlightRecord("nccl_trace_rank_2", 3)]


def test_numbers_from_nodes_are_plain_ascii_and_bounded() -> None:
    assert parse_ranks("0 4\n1 \u00b2\n2 " + "9" * 5000 + "\n3 5\n") == {0: 4, 3: 5}
    assert parse_gpus("=== gpus\n\u00b2, GPU-x, 1, 2, 0, A100\n").gpus == ()


def test_fetch_reads_a_regular_file_within_its_limit_only(tmp_path: Path) -> None:
    (tmp_path / "small").write_bytes(b"abc")
    (tmp_path / "big").write_bytes(b"x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "small")
    with open_transport(Host("n1", "localhost", transport="local")) as t:
        assert hang.fetch(t, str(tmp_path / "small"), 10) == b"abc"
        with pytest.raises(ValueError, match="grew past 10 bytes"):
            hang.fetch(t, str(tmp_path / "big"), 10)
        with pytest.raises(RemoteCommandError, match="not a regular file"):
            hang.fetch(t, str(tmp_path / "link"), 10)


def test_a_nodes_number_is_plain_ascii_and_bounded() -> None:
    from fleet.nodedata import number

    assert number(" 42\n") == 42 and number("-3", signed=True) == -3
    for bad in ("²", "٣", "1e3", "0x10", "-3", "", None, "9" * 5000, " 1 2"):
        assert number(bad) is None, bad
    assert number("70000", limit=1 << 16) is None and number("65535", limit=1 << 16) == 65535
