"""The watcher program heals (fleet/nodeside/watcher.py, as shipped): three watchers on this
machine over loopback (the master's, another node's, a standby spare's), each beside stand-ins
for stop.sh and the next attempt's heal.sh that record what they were told. The other node
falls silent: the master's watcher writes healed.json, stops its own part and starts its part
of the next attempt, and the spare starts its part in the lost node's place. On real hosts:
tests/e2e/test_e2e_watcher.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet import nodeside
from fleet.nodeside.shared import nodemap
from fleet.nodeside.shared.heal_rules import HEALED, Heal, parse_healed
from fleet.nodeside.shared.watch_rules import Config
from tests.unit.test_watcher_program import start_time

STOP_SH = '''d=$(dirname "$0")
{ echo "by=$1"; cat; } > "$d/stopped.tmp" && mv "$d/stopped.tmp" "$d/stopped_by"
'''
HEAL_SH = '''d=$(dirname "$0")
echo "$1" > "$d/heal.tmp" && mv "$d/heal.tmp" "$d/healed_with"
'''
AFTER = 2.0
NODES = ("node1", "node2")


class Watched:
    def __init__(self, root: Path, name: str, part: bool) -> None:
        self.dir = root / name
        self.dir.mkdir()
        (self.dir / "stop.sh").write_text(STOP_SH)
        (self.dir / "heal.sh").write_text(HEAL_SH)
        (self.dir / nodemap.WATCHER).write_text(nodeside.text(nodemap.WATCHER) + "\n")
        self.wrapper = subprocess.Popen(["sleep", "120"]) if part else None
        self.watcher: subprocess.Popen[bytes] | None = None

    def watch(self, port: int) -> None:
        heal = Heal(2, "r1-a2", str(self.dir / "heal.sh"), ("spare1",))
        cfg = Config("r1", self.dir.name, NODES, "127.0.0.1", port, "tok" * 10,
                     f"key-{self.dir.name}", AFTER, 5.0, heal)
        w = self.wrapper
        self.watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", str(self.dir / nodemap.WATCHER), str(self.dir),
             str(w.pid if w else 0), str(start_time(w.pid) if w else 0)],
            stdin=subprocess.PIPE, env={**os.environ, "FLEET_RUN_ID": "r1"})
        assert self.watcher.stdin is not None
        self.watcher.stdin.write(cfg.dumps().encode())
        self.watcher.stdin.close()

    def told(self, name: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while not (self.dir / name).exists():
            log = self.dir / nodemap.NODE_LOG
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no word"
            time.sleep(0.05)
        return (self.dir / name).read_text().splitlines()

    def close(self) -> None:
        for p in (self.watcher, self.wrapper):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Watched, Watched, Watched]]:
    three = (Watched(tmp_path, "node1", True), Watched(tmp_path, "node2", True),
             Watched(tmp_path, "spare1", False))
    try:
        three[0].watch(0)
        port = three[0].dir / nodemap.WATCHER_PORT
        deadline = time.monotonic() + 10
        while not port.exists():
            assert time.monotonic() < deadline, "the master's watcher never listened"
            time.sleep(0.02)
        for x in three[1:]:
            x.watch(int(port.read_text()))
        yield three
    finally:
        for x in three:
            x.close()


def test_a_lost_node_is_healed_by_the_standby_spare(
        run: tuple[Watched, Watched, Watched]) -> None:
    master, other, spare = run
    time.sleep(AFTER)  # linked
    assert other.watcher is not None
    other.watcher.send_signal(signal.SIGSTOP)  # silent, its link open: a host cut off
    try:
        assert master.told("healed_with", AFTER + 8) == ["node2"]
        said = master.told("stopped_by", 5)
        assert said[0].startswith("by=healed: node2 unreachable; attempt 2 started with "
                                  "spare1 in its place"), said
        assert said[1:] == ["key-node1", f"{master.wrapper.pid} "  # type: ignore[union-attr]
                            f"{start_time(master.wrapper.pid)}"]  # type: ignore[union-attr]
        assert spare.told("healed_with", 5) == ["node2"]
        assert not (spare.dir / "stopped_by").exists()  # nothing of its own to stop
        assert spare.watcher is not None and spare.watcher.wait(10) == 0
        healed = parse_healed((master.dir / HEALED).read_text(), "r1", NODES, ("spare1",))
        assert (healed.attempt, healed.run, healed.lost, healed.spare) == (2, "r1-a2", "node2",
                                                                          "spare1")
    finally:
        other.watcher.send_signal(signal.SIGCONT)


def test_without_a_standby_spare_heard_of_the_run_fails_fast(tmp_path: Path) -> None:
    master, other = Watched(tmp_path, "node1", True), Watched(tmp_path, "node2", True)
    try:
        master.watch(0)
        port = master.dir / nodemap.WATCHER_PORT
        deadline = time.monotonic() + 10
        while not port.exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        other.watch(int(port.read_text()))
        time.sleep(AFTER)
        assert other.watcher is not None
        other.watcher.send_signal(signal.SIGSTOP)
        said = master.told("stopped_by", AFTER + 8)
        assert said[0].startswith("by=fail-fast: node2 unreachable"), said
        assert said[0].endswith("; not healed: no standby spare answered"), said
        assert not (master.dir / "healed_with").exists()
        assert not (master.dir / HEALED).exists()
    finally:
        if other.watcher is not None:
            other.watcher.send_signal(signal.SIGCONT)
        master.close()
        other.close()
