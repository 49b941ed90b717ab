"""The data relay against a node that is not to be trusted, end to end through the real CLI: a
compromised node1 that rewrites what it passes on (every file's mode and time, or its bytes),
and a node2 that stops reading while it keeps saying it is alive. Each node's stand-in is its
own `python` (the inventory's), a wrapper that runs fleet's ferry program with an attack added
to it where the host's ~/attack.py says one, and passes every other command to the real python."""

from __future__ import annotations

import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_data import assert_clean, job, make_data
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

WRAPPER = f"""#!{sys.executable}
import os, sys
REAL = {sys.executable!r}
ATTACK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attack.py")
args = sys.argv[1:]
if (args[:1] == ["-c"] and len(args) > 2 and "fleet-ferry" in args[1] and args[2] == "recv"
        and os.path.exists(ATTACK)):
    text = os.fdopen(3, encoding="utf-8").read()
    head, sep, tail = text.rpartition('\\nif __name__ == "__main__":')
    with open(ATTACK) as f:
        attack = f.read()
    sys.argv = ["fleet-ferry", *args[2:]]
    exec(compile(head + "\\n" + attack + sep + tail, "fleet-ferry", "exec"),
         {{"__name__": "__main__"}})
else:
    os.execv(REAL, [REAL, *args])
"""

# node1 compromised: what it passes on to the next node goes through `alter(kind, payload)`
# (the frames parsed back out of whatever it is asked to send, however it is asked; None drops
# the frame)
REWRITE = """
_real_link_to = link_to
class _Rewriting:
    def __init__(self, s):
        self.s, self.buf = s, b""
    def sendall(self, data):
        self.send(data)
    def send(self, data):
        self.buf += bytes(data)
        while len(self.buf) >= HEAD.size:
            kind, n = HEAD.unpack(self.buf[:HEAD.size])
            if len(self.buf) < HEAD.size + n:
                break
            payload = alter(kind, self.buf[HEAD.size:HEAD.size + n])
            self.buf = self.buf[HEAD.size + n:]
            if payload is not None:  # None: the frame is dropped
                self.s.sendall(HEAD.pack(kind, len(payload)) + payload)
        return len(data)
    def __getattr__(self, name):
        return getattr(self.s, name)
def link_to(addr, port, key):
    return _Rewriting(_real_link_to(addr, port, key))
"""

SET_ID_1970 = REWRITE + """
def alter(kind, payload):
    if kind in (b"F", b"T"):
        h = json.loads(payload)
        h["mode"], h["mtime"] = 0o6777, 0
        payload = json.dumps(h).encode()
    return payload
"""

OTHER_BYTES = REWRITE + """
def alter(kind, payload):
    if kind == b"D" and payload:
        payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
    return payload
"""

# node2 (the relay's second node, 1) left out of every file's writers: it would skip them all
NOT_NODE2 = REWRITE + """
def alter(kind, payload):
    if kind == b"F":
        h = json.loads(payload)
        h["for"] = [i for i in h["for"] if i != 1]
        payload = json.dumps(h).encode()
    return payload
"""

# every file announced as a delta of no block (none of its bytes sent): node2 would build it
# from an old file it does not have
NO_BLOCKS = REWRITE + """
def alter(kind, payload):
    if kind == b"F":
        h = json.loads(payload)
        h["blocks"] = []
        payload = json.dumps(h).encode()
    return None if kind == b"D" else payload
"""

# node2 takes nothing from node1 (the relay link it accepted is never read) and says it is alive
DEAF = """
_real_accept_from = accept_from
class _Never:
    def read(self, n=-1):
        time.sleep(3600)
        return b""
class _Deaf(socket.socket):
    def makefile(self, *a, **k):
        return _Never()
def accept_from(server, key, deadline):
    c = _real_accept_from(server, key, deadline)
    return _Deaf(c.family, c.type, c.proto, fileno=c.detach())
"""


# node1 compromised: it stops passing the stream on to node2 (so it says, truly, that it waits
# to), as if node2 took nothing
STOPS = """
_real_link_to = link_to
class _Stopped:
    def __init__(self, s):
        self.s = s
    def send(self, data):
        time.sleep(3600)
        return 0
    def __getattr__(self, name):
        return getattr(self.s, name)
def link_to(addr, port, key):
    return _Stopped(_real_link_to(addr, port, key))
"""


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3) as bed:
        for h in bed.hosts:
            w = h.home / "python-wrapper"
            w.write_text(WRAPPER)
            w.chmod(0o755)
        yield bed


def attacked(tb: Testbed, host: str, attack: str | None) -> None:
    """The attack `host`'s ferry runs from now on (None: none)."""
    path = tb.host(host).home / "attack.py"
    if attack is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(attack)
        path.chmod(0o644)


def inventory(tb: Testbed, tmp_path: Path, workdir: str) -> None:
    tb.inventory(tmp_path / "inv.toml", workdir=workdir, per_host={
        h.name: {"python": str(h.home / "python-wrapper")} for h in tb.hosts})


def files_under(tb: Testbed, host: str, workdir: str) -> list[Path]:
    base = tb.host(host).home / workdir.removeprefix("~/")
    return [p for p in base.rglob("*") if p.is_file()] if base.exists() else []


def test_a_relaying_node_that_rewrites_modes_and_times_is_named_and_nothing_applied(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    inventory(tb, tmp_path, "~/fleet-trust-a")
    make_data(tmp_path / "data", [10])
    attacked(tb, "node1", SET_ID_1970)
    try:
        r = cli("up", str(job(tmp_path, 29851)), timeout=180)
    finally:
        attacked(tb, "node1", None)
    out = r.stdout + r.stderr
    assert r.returncode == 7, out
    assert re.search(r"node1: what it relayed to node2 does not match what fleet sent "
                     r"\(.*relayed as .*mode 0o6777.*; fleet sent", r.stderr), out
    assert "nothing was started" in r.stderr, out
    for host in ("node2", "node3"):
        for p in files_under(tb, host, "~/fleet-trust-a"):
            st = p.stat()
            assert not st.st_mode & 0o7002 and st.st_mtime > 1e9, (host, p, oct(st.st_mode))
    assert_clean(tb)


def test_a_relaying_node_that_alters_the_bytes_is_named_as_tampering(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    inventory(tb, tmp_path, "~/fleet-trust-b")
    make_data(tmp_path / "data", [10])
    attacked(tb, "node1", OTHER_BYTES)
    try:
        r = cli("up", str(job(tmp_path, 29852)), timeout=180)
    finally:
        attacked(tb, "node1", None)
    out = r.stdout + r.stderr
    assert r.returncode == 7, out  # not "cannot write" (5)
    assert re.search(r"node1: what it relayed to node2 does not match what fleet sent "
                     r"\(.*sha256.*\): nothing of it was applied on node2. node1 altered",
                     r.stderr), out
    assert "cannot write" not in r.stderr, out
    for host in ("node2", "node3"):  # no file of it replaced anything
        assert not [p for p in files_under(tb, host, "~/fleet-trust-b")
                    if p.name.startswith("shard")], host
    assert_clean(tb)


@pytest.mark.parametrize(("attack", "said", "port"), [
    (NOT_NODE2, r"writers \[0, 2\]; fleet sent .*writers \[0, 1, 2\]", 29855),
    (NO_BLOCKS, r"blocks \[\], .*; fleet sent .*blocks all", 29856)], ids=["writers", "blocks"])
def test_a_relaying_node_that_rewrites_which_blocks_or_writers_is_named_as_tampering(
        cli: CLI, tb: Testbed, tmp_path: Path, attack: str, said: str, port: int) -> None:
    """fleet's word names each file's blocks and writers too: a node left out of a file by the
    node before it is not blamed for not having it, and a file said to be a delta of nothing is
    not "cannot write" on the next node."""
    workdir = f"~/fleet-trust-{port}"
    inventory(tb, tmp_path, workdir)
    make_data(tmp_path / "data", [9])  # over transfer.BUNDLE_MAX: relayed
    attacked(tb, "node1", attack)
    try:
        r = cli("up", str(job(tmp_path, port)), timeout=180)
    finally:
        attacked(tb, "node1", None)
    out = r.stdout + r.stderr
    assert r.returncode == 7, out
    assert re.search(r"node1: what it relayed to node2 does not match what fleet sent \(.*"
                     + said, r.stderr), out
    assert not re.search(r"^\s+node(2|3):", r.stderr, re.M), out  # only node1 is blamed
    assert "nothing was started" in r.stderr, out
    for host in ("node2", "node3"):  # nothing of it written, no partial file left
        assert not [p for p in files_under(tb, host, workdir) if "shard" in p.name], host
    assert_clean(tb)


def test_a_relayed_node_that_stops_reading_is_named_promptly(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    inventory(tb, tmp_path, "~/fleet-trust-c")
    # more than the relay link's socket buffers and node1's own hold: node1 must wait on node2
    make_data(tmp_path / "data", [48])
    attacked(tb, "node2", DEAF)
    try:
        # half the 300 s and more it took before the fix: a fleet that waits that long fails here
        r = cli("up", str(job(tmp_path, 29853)), timeout=150)
    finally:
        attacked(tb, "node2", None)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    # the 20 s bound on a node that takes nothing, not the relay socket's own stall (300 s)
    assert re.search(r"node2: takes nothing: node1 waited 20s to pass it data", r.stderr), out
    assert not re.search(r"^\s+node(1|3):", r.stderr, re.M), out  # only node2 is blamed
    assert_clean(tb)


def test_modes_set_by_fleets_own_word_reach_every_relayed_node(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    """No attack: every node gets the files, with this machine's mode and time (but a set-id
    bit or a write for others, which no node is ever given)."""
    inventory(tb, tmp_path, "~/fleet-trust-d")
    make_data(tmp_path / "data", [10])
    tool = tmp_path / "data" / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o4777)
    r = cli("up", str(job(tmp_path, 29854)), timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    want = (tmp_path / "data" / "shard0.bin").stat()
    for host in ("node1", "node2", "node3"):
        got = {p.name: p.stat() for p in files_under(tb, host, "~/fleet-trust-d")}
        assert stat.S_IMODE(got["tool.sh"].st_mode) == 0o775, host
        assert got["shard0.bin"].st_mtime_ns == want.st_mtime_ns, host
        assert stat.S_IMODE(got["shard0.bin"].st_mode) == stat.S_IMODE(want.st_mode), host
    assert_clean(tb)


def test_a_relaying_node_that_stops_passing_data_on_does_not_get_the_next_one_blamed(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    """node1 says it waits on node2; node2, over its own connection, says nothing from node1
    waits unread in its socket: node1's word alone blames no node, both ends are named."""
    inventory(tb, tmp_path, "~/fleet-trust-e")
    make_data(tmp_path / "data", [9])  # over transfer.BUNDLE_MAX: relayed
    attacked(tb, "node1", STOPS)
    try:
        r = cli("up", str(job(tmp_path, 29857)), timeout=150)
    finally:
        attacked(tb, "node1", None)
    out = r.stdout + r.stderr
    assert r.returncode == 3, out
    # both ends of the link named, the same words said once
    assert re.search(r"^\s+node1, node2: the relay link node1 -> node2 stalled: node1 says it "
                     r"waited 20s to pass data on to node2; node2 placed none", r.stderr,
                     re.M), out
    assert "takes nothing:" not in r.stderr, out
    assert_clean(tb)
