"""Streams of a node's output, without a network: lines split in linear time and bounded memory,
lines longer than the cap handed on in pieces, lines redrawn with "\\r" (progress bars), the
byte offset a broken stream resumes from, the end waited for on its own, and a link to a node
that is given up only when no connection answers within the limit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from fleet.backends.hosts import node as remote
from fleet.config.inventory import Host
from fleet.errors import TransportError
from fleet.facts import run_state
from fleet.states import NodeStatus
from fleet.transport.base import Transport
from fleet.transport.lines import LINE_CAP, Lines, Partial, Received
from fleet.transport.link import Link, within
from fleet.transport.local import LocalTransport

TOKEN = "0123456789abcdef"
CHUNK = b"x" * 65536


def flood(mib: int) -> Lines:
    lines = Lines(None, lambda out: None)
    for _ in range(mib * 16):
        lines.feed(CHUNK)
    lines.feed(b"\n")
    lines.close()
    return lines


def test_newline_free_output_is_split_in_linear_time() -> None:
    """The old splitter copied its whole buffer again for every 64 KiB chunk: 64 MiB without a
    newline cost 32 GiB of copying (41 s). Counted here: each byte is copied a bounded number
    of times, whatever the size."""
    small, large = flood(4).copied, flood(32).copied
    assert small <= 3 * (4 << 20) and large <= 3 * (32 << 20), (small, large)
    assert large <= 8.1 * small


def test_a_flood_holds_no_more_than_the_cap() -> None:
    tracemalloc.start()
    try:
        flood(16)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * LINE_CAP, peak  # the cap, a chunk, and the piece's text


def test_a_line_over_the_cap_comes_in_pieces_and_says_so() -> None:
    got: list[str] = []
    lines = Lines(None, got.extend, cap=1000)
    line = "".join(f"{i:09d}," for i in range(250))  # 2500 bytes
    for i in range(0, len(line), 300):
        lines.feed(line[i:i + 300].encode())
    lines.feed(b"\nnext\n")
    lines.close()
    assert got[:3] == [line[:1000], line[1000:2000], line[2000:]]
    assert [type(g) for g in got[:3]] == [Partial, Partial, str]  # the last piece ends it
    assert got[3] == ("[fleet: the line above was 2500 bytes long, more than the 1000 a line "
                      "may have: it is shown in 3 pieces]")
    assert isinstance(got[3], Partial) and got[4:] == ["next"]


def test_pieces_never_split_a_character() -> None:
    got: list[str] = []
    lines = Lines(None, got.extend, cap=1000)
    data = ("é" * 1500 + "\n").encode()  # 2 bytes each: the cap falls inside one
    for i in range(0, len(data), 99):
        lines.feed(data[i:i + 99])
    lines.close()
    assert len(got) == 4  # three pieces and the note
    assert "".join(got[:-1]) == "é" * 1500 and "\ufffd" not in "".join(got)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_progress_bar_shows_a_state_every_interval_and_its_last_as_the_line() -> None:
    clock, got = Clock(), []
    lines = Lines(None, got.extend, clock=clock, progress_s=5)
    lines.feed(b"epoch 1\n\r  0%|")
    for pct in range(10, 100, 10):  # each state whole once the next began: 0% shown at once
        clock.now += 1
        lines.feed(f"\r {pct}%|".encode())
    clock.now = 111
    lines.tick()  # the newest held state (80%), due now
    clock.now = 113
    lines.tick()  # the bar stands at 90%, but the last state shown is too recent
    clock.now = 116
    lines.tick()  # now it is shown
    lines.feed(b"\r100%|done\n")  # 90% is not shown twice; the line is the last state
    lines.close()
    assert got == ["epoch 1", "  0%|", " 50%|", " 80%|", " 90%|", "100%|done"]
    assert [type(g) for g in got] == [str, Partial, Partial, Partial, Partial, str]


def test_carriage_return_newline_is_one_end_of_line_even_across_chunks() -> None:
    got: list[str] = []
    lines = Lines(None, got.extend)
    lines.feed(b"a\r")
    lines.feed(b"\nb\r\nc")
    lines.close()
    assert got == ["a", "b", "c"] and not any(isinstance(g, Partial) for g in got)


def test_bytes_count_for_the_watchdog_though_they_end_no_line() -> None:
    clock, got = Clock(), []
    seen = Received()
    lines = Lines(None, got.extend, seen, clock=clock, progress_s=5)
    lines.feed(b"\r 1%")
    clock.now += 3
    lines.feed(b"\r 2%")
    assert seen.arrived == clock.now and got == [" 1%"]


def test_offset_resumes_a_stream_where_it_broke() -> None:
    """What a broken stream handed on ends at `offset`; a stream from there gives the rest: no
    line lost, none twice."""
    log = b"".join(f"line {i}\n".encode() for i in range(1000)) + b"half a line"
    framed = f"banner\nFLEET-{TOKEN}-BEGIN\n".encode() + log
    first: list[str] = []
    seen = Received()
    lines = Lines(TOKEN, first.extend, seen)
    cut = len(framed) - 3000  # the connection breaks here, mid-line
    for i in range(0, cut, 777):
        lines.feed(framed[i:min(i + 777, cut)])
    rest: list[str] = []
    again = Lines(TOKEN, rest.extend, seen)
    again.feed(f"\nFLEET-{TOKEN}-BEGIN\n".encode() + log[seen.offset:] +
               f"\n\nFLEET-{TOKEN}-END\n".encode())
    again.close()
    assert first + rest == [f"line {i}" for i in range(1000)] + ["half a line"]


def test_follow_from_an_offset_and_wait_for_the_end(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "node.log").write_text("one\ntwo\n")
    local = LocalTransport(Host("here", "localhost", transport="local"))
    got: list[str] = []
    assert remote.follow(local, str(run_dir), None, got.extend, received=Received(4)) == 0
    assert got == ["two"]
    # The end, without the lock: the wrapper's pid, then its recorded exit code.
    sleeper = subprocess.Popen(["sleep", "0.5"])
    (run_dir / "pid").write_text(str(sleeper.pid))
    waiter = threading.Thread(target=lambda: got.append(
        str(remote.wait_end(local, str(run_dir), sleeper.pid, ""))))
    waiter.start()
    sleeper.wait()
    (run_dir / "exit_code").write_text("3\n")
    waiter.join(30)
    assert got[-1].startswith("NodeState(status=<NodeStatus.FAILED"), got


def test_local_stream_of_a_progress_bar() -> None:
    local = LocalTransport(Host("here", "localhost", transport="local"))
    got: list[str] = []
    code = local.stream("printf 'a\\rb\\rc\\n'; printf 'x%.0s' $(seq 3); echo", got.extend)
    assert code == 0 and got == ["c", "xxx"]  # a and b came with their line's end


def test_within_waits_no_longer_than_its_timeout_and_closes_what_comes_late() -> None:
    late: list[str] = []
    gate = threading.Event()
    assert within(lambda: "now", 5) == "now"
    assert isinstance(within(lambda: 1 / 0, 5), ZeroDivisionError)
    assert within(lambda: gate.wait(10) and "late", 0.1, late.append) is None
    gate.set()
    deadline = time.monotonic() + 10
    while not late and time.monotonic() < deadline:
        time.sleep(0.01)
    assert late == ["late"]


class FakeTransport(Transport):
    """Answers `true` as told: at once, never (stalls), or with a lost connection."""

    def __init__(self, mode: str) -> None:
        super().__init__(Host("n1", "10.0.0.1"))
        self.mode, self.closed = mode, False
        self.home = "/home/u"

    def connect(self, hello: bool = True) -> None:
        return None

    def run(self, script: str, timeout: float | None = 60.0, what: str = ""):  # type: ignore[no-untyped-def]
        if self.mode == "stall":
            time.sleep(timeout or 0)
        if self.mode != "ok" or self.closed:
            raise TransportError("connection to 10.0.0.1 was lost")
        from fleet.transport.framing import Result
        return Result(what, 0, "", "")

    def stream(self, script, on_lines, stop=None, received=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def _put(self, path: str, data: bytes, mode: int) -> str:
        raise NotImplementedError

    def pipe(self, script):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def open_port(self, address, port):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


def test_a_link_that_stops_answering_is_replaced_by_a_fresh_connection() -> None:
    ts: dict[str, Transport] = {"n1": FakeTransport("lost")}
    old = ts["n1"]
    link = Link(ts, "n1", 4, connect=lambda t, timeout: FakeTransport("ok"))
    assert link.answers(2) == (None, False)
    assert ts["n1"] is not old and old.closed and link.generation == 1  # type: ignore[attr-defined]


def test_a_link_is_lost_only_when_no_connection_answers_within_the_limit() -> None:
    tries: list[float] = []

    def refuse(t: Transport, timeout: float) -> Transport:
        tries.append(timeout)
        raise TransportError("cannot connect to 10.0.0.1:22: Connection refused")

    link = Link({"n1": FakeTransport("stall")}, "n1", 4, connect=refuse)
    stop, lost = threading.Event(), []
    link.keep(stop, lambda: False, lost.append)
    silent = re.match(r"no answer for (\d+)s on its connection or a fresh one ", lost[0])
    # the silence the link itself saw before it gave up: the whole limit, not its first miss
    assert len(lost) == 1 and silent and int(silent[1]) >= 4, lost
    assert "(watchdog.unreachable_after = 4s)" in lost[0]
    assert "Connection refused" in lost[0] and tries  # a fresh connection was tried first


def test_a_broken_stream_recovers_on_a_newer_connection_or_gives_up() -> None:
    link = Link({"n1": FakeTransport("ok")}, "n1", 4,
                connect=lambda t, timeout: FakeTransport("ok"))
    assert link.recover(0, threading.Event()) and link.generation == 1
    link.give_up()
    assert not link.recover(1, threading.Event())


@pytest.mark.skipif(sys.platform != "linux", reason="flock and /proc")
def test_end_script_returns_at_the_lock_release(tmp_path: Path) -> None:
    """run.sh's lock: the end is seen the moment the lock holder exits, though its pid lives
    on (a zombie nobody reaps answers kill -0)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "locked").touch()
    holder = subprocess.Popen(["flock", "-x", str(run_dir / "lock"), "sh", "-c",
                               f"echo $$ > {run_dir}/pid; sleep 0.5; echo 0 > {run_dir}/exit_code"])
    deadline = time.monotonic() + 10
    while not (run_dir / "pid").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    out = subprocess.run(["sh", "-c", remote.end_script(str(run_dir), holder.pid)],
                         capture_output=True, text=True, timeout=30, env=dict(os.environ))
    holder.wait()
    assert run_state.parse_state(out.stdout).status is NodeStatus.SUCCEEDED


def test_an_unframed_stream_keeps_its_blank_lines() -> None:
    """A local stream has no markers: a blank line (torchrun's banner begins with one) is a
    line, not the end marker (before, it ended the stream: the local inventory showed no line)."""
    local = LocalTransport(Host("here", "localhost", transport="local"))
    got: list[str] = []
    assert local.stream('printf "\\n"; echo a; echo; echo b', got.extend) == 0
    assert got == ["", "a", "", "b"]
