"""The nodes' watcher program itself (fleet/nodeside/watcher.py, as shipped: bundled), two of
them on this machine over loopback, each beside a stand-in wrapper and a stop.sh that records
what it was told: a node's part that fails stops the master's, a master gone silent stops the
other node's, a stranger's connection changes nothing. The same program on real hosts, cut off
by iptables: tests/e2e/test_e2e_watcher.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet import nodeside
from fleet.nodeside.shared import nodemap
from fleet.nodeside.shared.watch_rules import Config

# Records its reason and stdin (the key, the wrapper), then ends the watcher that ran it, as
# the real stop.sh does (the watcher is the run's).
STOP_SH = '''d=$(dirname "$0")
{ echo "by=$1"; cat; } > "$d/stopped.tmp" && mv "$d/stopped.tmp" "$d/stopped_by"
kill "$PPID"
'''
AFTER = 2.0  # seconds: a loaded machine may hold a process for a second


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[19])


class Node:
    def __init__(self, root: Path, name: str) -> None:
        self.dir = root / name
        self.dir.mkdir()
        (self.dir / "stop.sh").write_text(STOP_SH)
        (self.dir / nodemap.WATCHER).write_text(nodeside.text(nodemap.WATCHER) + "\n")
        self.wrapper = subprocess.Popen(["sleep", "120"])
        self.watcher: subprocess.Popen[bytes] | None = None

    def watch(self, port: int) -> None:
        cfg = Config("r1", self.dir.name, ("node1", "node2"), "127.0.0.1", port, "tok" * 10,
                     f"key-{self.dir.name}", AFTER, 5.0)
        self.watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", str(self.dir / nodemap.WATCHER), str(self.dir),
             str(self.wrapper.pid), str(start_time(self.wrapper.pid))],
            stdin=subprocess.PIPE, env={**os.environ, "FLEET_RUN_ID": "r1"})
        assert self.watcher.stdin is not None
        self.watcher.stdin.write(cfg.dumps().encode())
        self.watcher.stdin.close()

    def end(self, code: int) -> None:
        (self.dir / nodemap.EXIT_CODE).write_text(f"{code}\n")
        self.wrapper.kill()
        self.wrapper.wait()

    def stopped_by(self, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while not (self.dir / "stopped_by").exists():
            assert time.monotonic() < deadline, (self.dir / nodemap.NODE_LOG).read_text() \
                if (self.dir / nodemap.NODE_LOG).exists() else "no word"
            time.sleep(0.05)
        return (self.dir / "stopped_by").read_text().splitlines()

    def close(self) -> None:
        for p in (self.watcher, self.wrapper):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    pair = Node(tmp_path, "node1"), Node(tmp_path, "node2")
    try:
        pair[0].watch(0)
        port = pair[0].dir / nodemap.WATCHER_PORT
        deadline = time.monotonic() + 10
        while not port.exists():
            assert time.monotonic() < deadline, "the master's watcher never listened"
            time.sleep(0.02)
        pair[1].watch(int(port.read_text()))
        yield pair
    finally:
        for n in pair:
            n.close()


def test_a_failed_part_stops_the_masters(nodes: tuple[Node, Node]) -> None:
    master, other = nodes
    # A stranger first: a line that is no message ends its link, nothing else.
    with socket.create_connection(("127.0.0.1", int(
            (master.dir / nodemap.WATCHER_PORT).read_text()))) as s:
        s.sendall(b"nonce " + b"ab" * 16 + b"\n" + b"0" * 64 + b' {"k":"stop"}\n')
    time.sleep(AFTER + 1)
    assert not (master.dir / "stopped_by").exists()
    other.end(3)
    said = master.stopped_by(10)
    assert said[0].startswith("by=fail-fast: node2 failed (exit 3; seen by the nodes' "), said
    assert said[1:] == ["key-node1", f"{master.wrapper.pid} {start_time(master.wrapper.pid)}"]
    assert other.watcher is not None and other.watcher.wait(10) == 0  # told its end, it went
    assert not (other.dir / "stopped_by").exists()
    assert "[fleet] watcher: stopping the run: fail-fast: node2 failed" in \
        (master.dir / nodemap.NODE_LOG).read_text()


def test_a_silent_master_stops_the_others_part(nodes: tuple[Node, Node]) -> None:
    master, other = nodes
    time.sleep(AFTER)  # linked
    assert master.watcher is not None
    assert not (other.dir / "stopped_by").exists()
    master.watcher.send_signal(signal.SIGSTOP)  # silent, its link open: a host cut off
    try:
        said = other.stopped_by(AFTER + 5)
        assert said[0].startswith("by=fail-fast: node1 unreachable (no word from it for 2s"), said
        assert said[1] == "key-node2"
    finally:
        master.watcher.send_signal(signal.SIGCONT)


def test_both_end_well_and_nothing_is_stopped(nodes: tuple[Node, Node]) -> None:
    master, other = nodes
    time.sleep(AFTER)
    other.end(0)
    master.end(0)
    assert master.watcher is not None and other.watcher is not None
    assert master.watcher.wait(10) == 0 and other.watcher.wait(10) == 0
    assert not (master.dir / "stopped_by").exists() and not (other.dir / "stopped_by").exists()
