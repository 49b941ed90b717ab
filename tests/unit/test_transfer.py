"""The data transfer engine without a network: ferry's names, blocks and paths; real streams
from send_file applied by a real Receiver in a scratch directory (a new file, a delta, a resume,
a shrink, a touch, a give-up, a bad hash, a write error); hostile streams refused with nothing
written outside the root; the relay's HMAC handshake over real sockets on 127.0.0.1; and
fleet.transport.transfer's pure steps (what a node holds and needs, the moves, the chains, the
reports)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest

from fleet.errors import HostError, RelayTampered, TransportError, WorkdirError
from fleet.nodeside import ferry
from fleet.transport.base import Pipe, Transport
from fleet.transport.transfer import plan, progress, pull, push, relay, report
from fleet.transport.transfer.plan import Held, Local, Move, Moved, Need
from fleet.transport.transfer.wanted import Want

B = ferry.BLOCK
MTIME = 1_700_000_000_123_456_789
KEY = b"k" * 32


# ---- helpers ------------------------------------------------------------------------------------
def data(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def put(path: Path, content: bytes, mode: int = 0o644, mtime_ns: int = MTIME) -> os.stat_result:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    os.chmod(path, mode)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return os.stat(path)


def local(rel: str, path: Path, hashed: bool = True) -> Local:
    return push.local_file(rel, path, hashed)


def send(lf: Local, blocks: list[int] | None, readers: list[int], root: int = 0,
         known: bool = True) -> list[bytes]:
    """The frames send_file writes for one file, one per write."""
    frames: list[bytes] = []
    ferry.send_file(frames.append, root, lf.rel, str(lf.path), lf.size, lf.mtime_ns, lf.mode,
                    blocks, readers, list(lf.blocks) if known and lf.blocks else None, lf.sha)
    return frames


def kinds(frames: list[bytes]) -> str:
    return "".join(f[:1].decode() for f in frames)


def frames_of(stream: bytes) -> list[tuple[bytes, bytes]]:
    src = io.BytesIO(stream)
    out: list[tuple[bytes, bytes]] = []
    while True:
        kind, payload = ferry.read_frame(src.read)
        if not kind:
            return out
        out.append((kind, payload))


class Node:
    """A Receiver in a scratch root, its reports collected (progress apart: `progress`)."""

    def __init__(self, root: Path, me: int = 0, strict: bool = False,
                 roots: list[str] | None = None) -> None:
        self.root = root
        self.reports: list[dict[str, object]] = []
        self.progress: list[int] = []
        self.recv = ferry.Receiver(roots or [str(root)], me, self._report, strict)

    def _report(self, obj: dict[str, object]) -> None:
        if set(obj) == {"at"}:
            self.progress.append(obj["at"])  # type: ignore[arg-type]
        else:
            self.reports.append(obj)

    def feed(self, *frames: bytes) -> bool:
        """Every frame, read back with read_frame; what the last apply returned."""
        more = True
        for kind, payload in frames_of(b"".join(frames)):
            more = self.recv.apply(kind, payload)
        return more

    def errors(self) -> list[dict[str, object]]:
        return [r["error"] for r in self.reports if "error" in r]  # type: ignore[misc]


def tree(top: Path) -> list[str]:
    """Every path under top, relative, sorted (symbolic links not followed)."""
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


def header(**kw: object) -> bytes:
    h: dict[str, object] = {"root": 0, "path": "f.bin", "size": 0, "mode": 0o644,
                            "mtime": MTIME, "blocks": None, "for": [0]}
    h.update(kw)
    return ferry.meta(b"F", h)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def end(b: bytes) -> bytes:
    return ferry.meta(b"E", {"sha256": sha(b)})


Z = ferry.frame(b"Z", b"")


# ---- names and blocks ---------------------------------------------------------------------------
def test_part_name_and_part_of_round_trip_nested_and_top_level() -> None:
    assert ferry.part_name("shard.bin") == ".shard.bin.fleet-part"
    assert ferry.part_name("data/train/shard.bin") == "data/train/.shard.bin.fleet-part"
    assert ferry.part_name(".hidden") == "..hidden.fleet-part"
    for rel in ("shard.bin", "data/train/shard.bin", ".hidden", "a/.b", "x.fleet-part"):
        assert ferry.part_of(ferry.part_name(rel)) == rel


def test_part_of_is_none_for_a_name_that_is_not_a_partial_file() -> None:
    for rel in ("shard.bin", "data/shard.bin", ".shard.bin", "shard.bin.fleet-part",
                "data/shard.fleet-part", ".fleet-part", "data/.fleet-part", "..fleet-part"):
        assert ferry.part_of(rel) is None, rel


def test_blocks_of_and_block_len_at_the_edges() -> None:
    assert ferry.blocks_of(0) == 0
    assert ferry.blocks_of(1) == 1
    assert ferry.blocks_of(B) == 1 and ferry.block_len(B, 0) == B and ferry.block_len(B, 1) == 0
    assert ferry.blocks_of(B + 1) == 2
    assert [ferry.block_len(B + 1, i) for i in range(3)] == [B, 1, 0]
    assert ferry.block_len(0, 0) == 0
    assert sum(ferry.block_len(5 * B + 7, i) for i in range(ferry.blocks_of(5 * B + 7))) == \
        5 * B + 7


def test_digest_is_a_prefix_of_the_sha256() -> None:
    assert ferry.digest(b"abc") == sha(b"abc")[:ferry.DIGEST_HEX]
    assert len(ferry.digest(b"")) == ferry.DIGEST_HEX == 32


@pytest.mark.parametrize("rel", ["..", "../x", "a/../../x", "a/..", "/etc/passwd", "/", "",
                                 "a//b", "a/", "./a", "a/./b", "a\0b", "a" * 4097])
def test_safe_rel_refuses_a_path_that_leaves_its_root(rel: str) -> None:
    with pytest.raises(ferry.Bad):
        ferry.safe_rel(rel)


@pytest.mark.parametrize("rel", [None, 5, b"a", ["a"], {"a": 1}])
def test_safe_rel_refuses_what_is_not_a_string(rel: object) -> None:
    with pytest.raises(ferry.Bad):
        ferry.safe_rel(rel)


def test_safe_rel_keeps_ordinary_paths() -> None:
    for rel in ("a", "a/b/c.bin", ".hidden/..x", "a..b", "é/空 白"):
        assert ferry.safe_rel(rel) == rel


def test_target_strict_refuses_a_path_through_a_symbolic_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "real").mkdir()
    (root / "real" / "file").symlink_to(outside / "x")
    assert ferry.target(str(root), "link/x") == str(root / "link/x")  # not strict: followed
    with pytest.raises(ferry.Bad, match="symbolic link"):
        ferry.target(str(root), "link/x", strict=True)
    with pytest.raises(ferry.Bad, match="symbolic link"):
        ferry.target(str(root), "real/file", strict=True)
    assert ferry.target(str(root), "real/new", strict=True) == str(root / "real/new")
    with pytest.raises(ferry.Bad):
        ferry.target(str(root), "../outside/x", strict=True)


# ---- hashing what a node holds ------------------------------------------------------------------
def test_hash_file_gives_size_sha_and_block_digests(tmp_path: Path) -> None:
    content = data(2 * B + 5)
    put(tmp_path / "f", content)
    size, whole, blocks = ferry.hash_file(str(tmp_path / "f"))
    assert (size, whole) == (len(content), sha(content))
    assert blocks == [ferry.digest(content[:B]), ferry.digest(content[B:2 * B]),
                      ferry.digest(content[2 * B:])]
    put(tmp_path / "empty", b"")
    assert ferry.hash_file(str(tmp_path / "empty")) == (0, sha(b""), [])


def test_cmd_hash_lists_the_partial_file_over_the_file_and_skips_what_is_not_there(
        tmp_path: Path) -> None:
    put(tmp_path / "d/a.bin", data(B + 3, 1))
    put(tmp_path / "d/.a.bin.fleet-part", data(B, 2))
    put(tmp_path / "b.bin", data(10, 3))
    out = io.StringIO()
    ferry.cmd_hash(str(tmp_path), ["d/a.bin", "b.bin", "missing"], out)
    held = plan.parse_held(out.getvalue(), {"d/a.bin", "b.bin", "missing"})
    assert set(held) == {"d/a.bin", "b.bin"}
    # the partial file's whole block, then the file's blocks after it (an interrupted update)
    _, whole, blocks = ferry.hash_file(str(tmp_path / "d/.a.bin.fleet-part"))
    rest = ferry.hash_file(str(tmp_path / "d/a.bin"), 1)[2]
    assert held["d/a.bin"] == Held("part", B + 3, whole, (blocks[0], *rest))
    assert held["b.bin"] == Held("file", 10, sha(data(10, 3)), (ferry.digest(data(10, 3)),))


def test_held_script_under_a_real_sh_hashes_each_directory(tmp_path: Path) -> None:
    """One round trip for every synced directory, each after its `#dir N` line; the block
    digests only (a push compares those: one pass of hashing on the node, not two)."""
    one, two = tmp_path / "one", tmp_path / "two"
    put(one / "x", b"x" * 10)
    put(two / "sub/y", b"y" * (B + 1))
    put(two / "sub/.z.fleet-part", b"z")
    asks = [(str(one), ["x", "gone"]), (str(two), ["sub/y", "sub/z"])]
    script = plan.held_script(sys.executable, asks)
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    helds = plan.parse_helds(r.stdout, asks)
    assert [sorted(h) for h in helds] == [["x"], ["sub/y", "sub/z"]]
    assert helds[0]["x"].sha == "" and helds[0]["x"].kind == "file"
    assert helds[1]["sub/y"].blocks == (ferry.digest(b"y" * B), ferry.digest(b"y"))
    assert helds[1]["sub/z"] == Held("part", 1, "", (ferry.digest(b"z"),))


def test_a_file_with_every_block_the_same_is_only_touched_and_one_block_off_is_sent(
        tmp_path: Path) -> None:
    body = data(3 * B + 5, 7)
    put(tmp_path / "f", body)
    lf = push.local_file("f", tmp_path / "f", True)
    assert lf.sha == sha(body) and lf.blocks == tuple(ferry.hash_file(str(tmp_path / "f"))[2])
    same = Held("file", len(body), "", lf.blocks)
    assert plan.need(lf, same) == Need(touch=True)
    off = Held("file", len(body), "", (*lf.blocks[:2], "0" * ferry.DIGEST_HEX, lf.blocks[3]))
    assert plan.need(lf, off) == Need(blocks=(2,))


# ---- frames -------------------------------------------------------------------------------------
def test_read_frame_reads_back_what_frame_wrote_and_ends_cleanly() -> None:
    stream = ferry.frame(b"D", b"abc") + ferry.meta(b"E", {"sha256": "x"}) + Z
    assert frames_of(stream) == [(b"D", b"abc"), (b"E", b'{"sha256":"x"}'), (b"Z", b"")]


def test_read_frame_reads_a_frame_that_arrives_in_pieces() -> None:
    stream = ferry.frame(b"D", b"0123456789")
    pos = [0]

    def trickle(n: int) -> bytes:  # a pipe that hands out 3 bytes at a time
        got = stream[pos[0]:pos[0] + min(n, 3)]
        pos[0] += len(got)
        return got
    assert ferry.read_frame(trickle) == (b"D", b"0123456789")


def test_a_stream_that_ends_mid_frame_is_an_eof_error() -> None:
    stream = ferry.frame(b"D", b"0123456789")
    for cut in (2, ferry.HEAD.size, len(stream) - 1):
        with pytest.raises(EOFError):
            ferry.read_frame(io.BytesIO(stream[:cut]).read)


# ---- round trips through a real Receiver --------------------------------------------------------
def test_a_new_file_arrives_whole_with_its_mode_and_time(tmp_path: Path) -> None:
    content = data(3 * B + 17)
    put(tmp_path / "src/d/f.bin", content, mode=0o640)
    lf = local("d/f.bin", tmp_path / "src/d/f.bin", hashed=False)
    frames = send(lf, None, [0])
    assert kinds(frames) == "FDDDDE"
    node = Node(tmp_path / "dst")
    assert node.feed(*frames, Z) is False
    dest = tmp_path / "dst/d/f.bin"
    assert dest.read_bytes() == content
    st = os.stat(dest)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_mtime_ns == MTIME
    assert node.reports == [{"ok": [0, "d/f.bin", sha(content)]}]
    assert node.progress == [B]  # said at its first block (then at most every REPORT_S)
    assert tree(tmp_path / "dst") == ["d", "d/f.bin"]  # no partial file left
    assert node.recv.files == 1 and node.recv.placed == len(content)


def test_send_file_returns_the_sha256_it_computed_while_reading(tmp_path: Path) -> None:
    content = data(B + 1)
    st = put(tmp_path / "f", content)
    sent: list[int] = []
    got = ferry.send_file(lambda b: None, 0, "f", str(tmp_path / "f"), st.st_size,
                          st.st_mtime_ns, 0o644, None, [0], sent=sent.append)
    assert got == sha(content) and sent == [B, 1]


def test_a_delta_sends_only_the_changed_block_and_keeps_the_rest(tmp_path: Path) -> None:
    old = data(4 * B + 100, 1)
    new = old[:2 * B + 5] + b"NEW!" + old[2 * B + 9:]
    dest = tmp_path / "dst/f.bin"
    put(dest, old, mode=0o600, mtime_ns=MTIME - 10**9)
    put(tmp_path / "src/f.bin", new, mode=0o755)
    lf = local("f.bin", tmp_path / "src/f.bin")
    size, whole, blocks = ferry.hash_file(str(dest))
    nd = plan.need(lf, Held("file", size, whole, tuple(blocks)))
    assert nd == Need(blocks=(2,))
    frames = send(lf, list(nd.blocks or ()), [0])
    assert kinds(frames) == "FDE"
    assert frames[1][ferry.HEAD.size:] == new[2 * B:3 * B]
    node = Node(tmp_path / "dst")
    node.feed(*frames, Z)
    assert dest.read_bytes() == new
    st = os.stat(dest)
    assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_mtime_ns == MTIME
    assert node.reports == [{"ok": [0, "f.bin", sha(new)]}]
    assert tree(tmp_path / "dst") == ["f.bin"]


def test_a_file_that_grows_sends_the_new_blocks_and_the_changed_last_one(tmp_path: Path) -> None:
    old = data(B + 10, 1)
    new = old + data(B, 2)
    put(tmp_path / "dst/f", old)
    put(tmp_path / "src/f", new)
    lf = local("f", tmp_path / "src/f")
    size, whole, blocks = ferry.hash_file(str(tmp_path / "dst/f"))
    nd = plan.need(lf, Held("file", size, whole, tuple(blocks)))
    assert nd.blocks == (1, 2)  # block 1 was short there
    node = Node(tmp_path / "dst")
    node.feed(*send(lf, list(nd.blocks or ()), [0]), Z)
    assert (tmp_path / "dst/f").read_bytes() == new


def test_a_partial_file_holding_the_first_blocks_is_resumed(tmp_path: Path) -> None:
    content = data(3 * B + 1000)
    put(tmp_path / "src/d/f.bin", content)
    put(tmp_path / "dst/d/.f.bin.fleet-part", content[:2 * B], mode=0o600)
    lf = local("d/f.bin", tmp_path / "src/d/f.bin")
    out = io.StringIO()
    ferry.cmd_hash(str(tmp_path / "dst"), ["d/f.bin"], out)
    held = plan.parse_held(out.getvalue(), {"d/f.bin"})["d/f.bin"]
    assert held.kind == "part"
    nd = plan.need(lf, held)
    assert nd == Need(blocks=(2, 3))
    frames = send(lf, [2, 3], [0])
    assert kinds(frames) == "FDDE"
    node = Node(tmp_path / "dst")
    node.feed(*frames, Z)
    assert (tmp_path / "dst/d/f.bin").read_bytes() == content
    assert tree(tmp_path / "dst") == ["d", "d/f.bin"]
    assert node.reports == [{"ok": [0, "d/f.bin", sha(content)]}]


def test_a_complete_partial_file_is_verified_and_renamed_with_no_data_sent(
        tmp_path: Path) -> None:
    content = data(2 * B)
    put(tmp_path / "src/f", content)
    put(tmp_path / "dst/.f.fleet-part", content)
    lf = local("f", tmp_path / "src/f")
    size, whole, blocks = ferry.hash_file(str(tmp_path / "dst/.f.fleet-part"))
    nd = plan.need(lf, Held("part", size, whole, tuple(blocks)))
    assert nd == Need(blocks=())  # not a touch: the file is not in place yet
    frames = send(lf, [], [0])
    assert kinds(frames) == "FE"
    Node(tmp_path / "dst").feed(*frames, Z)
    assert tree(tmp_path / "dst") == ["f"] and (tmp_path / "dst/f").read_bytes() == content


def test_a_file_that_shrinks_keeps_its_start_and_is_cut(tmp_path: Path) -> None:
    old = data(3 * B + 5)
    new = old[:2 * B]
    put(tmp_path / "dst/f", old)
    put(tmp_path / "src/f", new)
    lf = local("f", tmp_path / "src/f")
    size, whole, blocks = ferry.hash_file(str(tmp_path / "dst/f"))
    nd = plan.need(lf, Held("file", size, whole, tuple(blocks)))
    assert nd == Need(blocks=())
    node = Node(tmp_path / "dst")
    node.feed(*send(lf, [], [0]), Z)
    assert (tmp_path / "dst/f").read_bytes() == new
    assert node.reports == [{"ok": [0, "f", sha(new)]}]


def test_a_partial_file_longer_than_the_file_is_cut_to_its_size(tmp_path: Path) -> None:
    """A partial file of a longer version: its start is kept, the rest must not stay behind
    the end (the hash covers only the file's size)."""
    old = data(3 * B + 7)
    new = old[:2 * B]
    put(tmp_path / "src/f", new)
    put(tmp_path / "dst/.f.fleet-part", old)
    lf = local("f", tmp_path / "src/f")
    size, whole, blocks = ferry.hash_file(str(tmp_path / "dst/.f.fleet-part"))
    nd = plan.need(lf, Held("part", size, whole, tuple(blocks)))
    assert nd == Need(blocks=())
    node = Node(tmp_path / "dst")
    node.feed(*send(lf, [], [0]), Z)
    assert (tmp_path / "dst/f").read_bytes() == new
    assert node.reports == [{"ok": [0, "f", sha(new)]}]


def test_a_file_that_shrinks_inside_a_block_gets_its_last_block_again(tmp_path: Path) -> None:
    old = data(2 * B)
    new = old[:B + 10]
    put(tmp_path / "dst/f", old)
    put(tmp_path / "src/f", new)
    lf = local("f", tmp_path / "src/f")
    size, whole, blocks = ferry.hash_file(str(tmp_path / "dst/f"))
    nd = plan.need(lf, Held("file", size, whole, tuple(blocks)))
    assert nd == Need(blocks=(1,))
    Node(tmp_path / "dst").feed(*send(lf, [1], [0]), Z)
    assert (tmp_path / "dst/f").read_bytes() == new


def test_an_empty_file_arrives(tmp_path: Path) -> None:
    put(tmp_path / "src/empty", b"", mode=0o600)
    lf = local("empty", tmp_path / "src/empty", hashed=False)
    frames = send(lf, None, [0])
    assert kinds(frames) == "FE"
    node = Node(tmp_path / "dst")
    node.feed(*frames, Z)
    dest = tmp_path / "dst/empty"
    assert dest.read_bytes() == b"" and os.stat(dest).st_mtime_ns == MTIME
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    assert node.reports == [{"ok": [0, "empty", sha(b"")]}]


def test_a_touch_sets_only_the_time_and_mode(tmp_path: Path) -> None:
    content = data(100)
    dest = tmp_path / "dst/f"
    put(dest, content, mode=0o600, mtime_ns=5)
    ino = os.stat(dest).st_ino
    node = Node(tmp_path / "dst")
    node.feed(ferry.meta(b"T", {"root": 0, "path": "f", "mtime": MTIME, "mode": 0o751,
                                "for": [0]}), Z)
    st = os.stat(dest)
    assert dest.read_bytes() == content and st.st_ino == ino
    assert st.st_mtime_ns == MTIME and stat.S_IMODE(st.st_mode) == 0o751
    assert node.reports == [{"ok": [0, "f", ""]}]


def test_a_receiver_not_listed_in_for_writes_nothing_but_takes_every_frame(
        tmp_path: Path) -> None:
    put(tmp_path / "src/f", data(2 * B + 3))
    lf = local("f", tmp_path / "src/f", hashed=False)
    (tmp_path / "dst").mkdir()
    put(tmp_path / "dst/t", b"t", mtime_ns=5)
    node = Node(tmp_path / "dst", me=1)
    more = node.feed(*send(lf, None, [0, 2]),
                     ferry.meta(b"T", {"root": 0, "path": "t", "mtime": MTIME, "mode": 0o600,
                                       "for": [0]}), Z)
    assert more is False
    assert tree(tmp_path / "dst") == ["t"] and os.stat(tmp_path / "dst/t").st_mtime_ns == 5
    assert node.reports == [] and node.recv.files == 0 and node.recv.placed == 0


def test_an_x_frame_keeps_the_partial_file_for_the_next_attempt(tmp_path: Path) -> None:
    content = data(3 * B + 1)
    put(tmp_path / "src/f", content)
    lf = local("f", tmp_path / "src/f", hashed=False)
    frames = send(lf, None, [0])
    node = Node(tmp_path / "dst")
    node.feed(*frames[:3], ferry.meta(b"X", {"why": "changed"}))
    assert node.reports == [{"gave_up": [0, "f"]}]
    assert tree(tmp_path / "dst") == [".f.fleet-part"]
    assert (tmp_path / "dst/.f.fleet-part").read_bytes() == content[:2 * B]
    # the next attempt sends only the rest
    lf = local("f", tmp_path / "src/f")
    size, whole, blocks = ferry.hash_file(str(tmp_path / "dst/.f.fleet-part"))
    nd = plan.need(lf, Held("part", size, whole, tuple(blocks)))
    assert nd == Need(blocks=(2, 3))
    node.feed(*send(lf, [2, 3], [0]), Z)
    assert tree(tmp_path / "dst") == ["f"] and (tmp_path / "dst/f").read_bytes() == content


def test_a_wrong_sha256_removes_the_partial_file_and_keeps_the_old_one(tmp_path: Path) -> None:
    old, new = data(2 * B, 1), data(2 * B, 2)
    dest = tmp_path / "dst/f"
    put(dest, old)
    put(tmp_path / "src/f", new)
    lf = local("f", tmp_path / "src/f", hashed=False)
    frames = send(lf, None, [0])
    node = Node(tmp_path / "dst")
    node.feed(*frames[:-1], ferry.meta(b"E", {"sha256": "0" * 64}), Z)
    assert dest.read_bytes() == old and tree(tmp_path / "dst") == ["f"]
    [err] = node.errors()
    assert err["path"] == str(dest) and "sha256" in str(err["msg"])
    assert not any("ok" in r for r in node.reports) and node.recv.files == 0


def test_a_delta_whose_basis_changed_is_reported_not_written(tmp_path: Path) -> None:
    """The blocks were chosen by hashes of a file that is shorter now."""
    put(tmp_path / "src/f", data(3 * B))
    put(tmp_path / "dst/f", b"short")
    lf = local("f", tmp_path / "src/f")
    node = Node(tmp_path / "dst")
    node.feed(*send(lf, [2], [0]), Z)
    [err] = node.errors()
    assert "block 0 is not here to keep" in str(err["msg"])
    assert (tmp_path / "dst/f").read_bytes() == b"short"


def test_a_write_error_is_reported_once_and_the_stream_still_taken(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_bytes(b"a regular file, not a directory")
    put(tmp_path / "src/a", data(B + 1, 1))
    put(tmp_path / "src/b", data(10, 2))
    node = Node(root)
    more = node.feed(*send(local("d/a", tmp_path / "src/a", hashed=False), None, [0]),
                     *send(local("b", tmp_path / "src/b", hashed=False), None, [0]),
                     ferry.meta(b"T", {"root": 0, "path": "c", "mtime": 1, "mode": 0o644,
                                       "for": [0]}), Z)
    assert more is False
    assert len(node.reports) == 1
    [err] = node.errors()
    assert err["path"] == str(root / "d/a") and err["errno"] == "ENOTDIR"
    assert isinstance(err["free"], int)
    assert node.recv.failed == err and node.recv.broken and node.recv.files == 0
    assert root.read_bytes() == b"a regular file, not a directory"
    assert report.problem_text(err) == f"cannot write {root / 'd/a'}: Not a directory"


def test_a_write_error_on_one_root_stops_writes_to_the_others_too(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(b"")
    good = tmp_path / "good"
    put(tmp_path / "src/a", b"a")
    node = Node(good, roots=[str(bad), str(good)])
    node.feed(*send(local("a", tmp_path / "src/a", hashed=False), None, [0], root=0),
              *send(local("a", tmp_path / "src/a", hashed=False), None, [0], root=1), Z)
    assert len(node.errors()) == 1 and not good.exists()


# ---- hostile streams ----------------------------------------------------------------------------
HOSTILE = {
    "a path with ..": [header(path="../evil", size=1), ferry.frame(b"D", b"x"), end(b"x")],
    "a path with .. inside": [header(path="a/../../evil", size=1)],
    "an absolute path": [header(path="/ABS/evil", size=1)],
    "a path that is not a string": [header(path=["evil"])],
    "a root index past the roots": [header(root=1)],
    "a negative root index": [header(root=-1)],
    "a root that is a string": [header(root="0")],
    "no root": [ferry.meta(b"F", {"path": "f", "size": 0, "mode": 0, "mtime": 0})],
    "a touch with ..": [ferry.meta(b"T", {"root": 0, "path": "../evil", "mtime": 0,
                                          "mode": 0, "for": [0]})],
    "a D frame outside a file": [ferry.frame(b"D", b"x")],
    "an E frame outside a file": [end(b"")],
    "a file inside a file": [header(path="a", size=1), header(path="b", size=1)],
    "the end inside a file": [header(size=1), Z],
    "more blocks than announced": [header(size=3 * B, blocks=[1]), ferry.frame(b"D", b"x" * B),
                                   ferry.frame(b"D", b"x" * B)],
    "more blocks than the size holds": [header(size=1), ferry.frame(b"D", b"x"),
                                        ferry.frame(b"D", b""), end(b"x")],
    "fewer blocks than announced": [header(size=2 * B), ferry.frame(b"D", b"x" * B),
                                    end(b"x" * B)],
    "a block of the wrong size": [header(size=B + 1), ferry.frame(b"D", b"x" * B),
                                  ferry.frame(b"D", b"xx")],
    "a short block": [header(size=B), ferry.frame(b"D", b"x" * (B - 1))],
    "a block index past the end": [header(size=B, blocks=[1])],
    "a block index that is not a number": [header(size=B, blocks=["0"])],
    "a negative size": [header(size=-1)],
    "a size that is not a number": [header(size="1")],
    "a mode that is not a number": [header(mode="0644")],
    "blocks that are not a list": [header(size=B, blocks=0)],
    "a touch without a time": [ferry.meta(b"T", {"root": 0, "path": "f", "mode": 0,
                                                 "for": [0]})],
    "a frame kind not in FDEXTZ": [ferry.frame(b"Q", b"{}")],
    "a JSON frame that is not JSON": [ferry.frame(b"F", b"\xff\xfe{")],
    "a JSON frame that is not an object": [ferry.frame(b"F", b"[1]")],
    "a data frame over the limit": [ferry.HEAD.pack(b"D", B + 1) + b"x" * (B + 1)],
    "a JSON frame over the limit": [ferry.HEAD.pack(b"F", ferry.MAX_META + 1)],
}


@pytest.mark.parametrize("why", list(HOSTILE))
def test_a_hostile_stream_is_refused_and_writes_nothing_outside_the_root(
        tmp_path: Path, why: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    node = Node(root)
    with pytest.raises(ferry.Bad):
        node.feed(*HOSTILE[why])
    assert tree(tmp_path) == ["root"] + [str(Path("root") / p) for p in tree(root)]
    assert not any(p.name == "evil" for p in tmp_path.rglob("*"))
    assert not Path("/ABS").exists()
    assert all(".fleet-part" in p or p == "f.bin" for p in tree(root))  # only its own file


def test_strict_receiver_refuses_a_path_through_a_symbolic_link(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    node = Node(root, strict=True)
    with pytest.raises(ferry.Bad, match="symbolic link"):
        node.feed(header(path="link/evil", size=1), ferry.frame(b"D", b"x"), end(b"x"))
    # a node's touch is not obeyed at all here (a pull has none): nothing changes
    node.feed(ferry.meta(b"T", {"root": 0, "path": "link", "mtime": 0, "mode": 0o777,
                                "for": [0]}))
    assert tree(outside) == [] and stat.S_IMODE(os.stat(outside).st_mode) != 0o777


def test_strict_receiver_does_not_write_through_a_partial_file_that_is_a_link(
        tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.write_bytes(b"keep")
    (root / ".f.fleet-part").symlink_to(outside)
    node = Node(root, strict=True)
    node.feed(header(path="f", size=1), ferry.frame(b"D", b"x"), end(b"x"))
    [err] = node.errors()
    assert "symbolic link" in str(err["msg"]) and outside.read_bytes() == b"keep"
    assert not (root / "f").exists()


# ---- a file that changes while it is sent -------------------------------------------------------
def test_send_file_gives_up_with_an_x_frame_when_a_block_differs_from_its_digest(
        tmp_path: Path) -> None:
    st = put(tmp_path / "f", data(3 * B))
    known = [ferry.digest(b"what was hashed before")] * 3
    frames: list[bytes] = []
    with pytest.raises(ferry.Changed):
        ferry.send_file(frames.append, 0, "f", str(tmp_path / "f"), st.st_size, st.st_mtime_ns,
                        0o644, None, [0], known)
    assert kinds(frames) == "FX"
    node = Node(tmp_path / "dst")
    node.feed(*frames)  # the receiver takes it: the file given up, nothing in place
    assert node.reports == [{"gave_up": [0, "f"]}] and not (tmp_path / "dst/f").exists()


def test_send_file_refuses_a_file_whose_size_or_time_changed_since_it_was_listed(
        tmp_path: Path) -> None:
    st = put(tmp_path / "f", data(B))
    for size, mtime in ((st.st_size + 1, st.st_mtime_ns), (st.st_size, st.st_mtime_ns + 1)):
        frames: list[bytes] = []
        with pytest.raises(ferry.Changed, match="after it was listed"):
            ferry.send_file(frames.append, 0, "f", str(tmp_path / "f"), size, mtime, 0o644,
                            None, [0])
        assert frames == []  # nothing reached the stream


def test_send_file_gives_up_when_the_file_is_written_while_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    st = put(path, data(3 * B))
    frames: list[bytes] = []

    def meanwhile(n: int) -> None:  # someone writes the file after its first block went
        if len(frames) == 2:
            with open(path, "r+b") as f:
                f.seek(2 * B)
                f.write(b"late")
    with pytest.raises(ferry.Changed, match="while it was sent"):
        ferry.send_file(frames.append, 0, "f", str(path), st.st_size, st.st_mtime_ns, 0o644,
                        None, [0], sent=meanwhile)
    assert kinds(frames) == "FDDDX"


def test_send_file_gives_up_when_the_file_shrinks_while_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    st = put(path, data(3 * B))
    frames: list[bytes] = []

    def meanwhile(n: int) -> None:
        os.truncate(path, B + 5)
    with pytest.raises(ferry.Changed):
        ferry.send_file(frames.append, 0, "f", str(path), st.st_size, st.st_mtime_ns, 0o644,
                        None, [0], sent=meanwhile)
    # blocks read ahead before the cut may still go out, never an end: the file is given up
    k = kinds(frames)
    assert k[:2] == "FD" and k[-1] == "X" and set(k[1:-1]) == {"D"}, k
    assert len(k) - 2 <= 1 + ferry.AHEAD  # the one sent, and those read ahead of it


# ---- the relay link -----------------------------------------------------------------------------
def listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    return s


def in_thread(fn: Callable[[], socket.socket]) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []

    def run() -> None:
        try:
            got.append(fn())
        except BaseException as e:  # examined by the test
            got.append(e)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, got


def test_the_right_key_links_both_ends_and_data_flows(tmp_path: Path) -> None:
    server = listener()
    port = server.getsockname()[1]
    th, got = in_thread(lambda: ferry.accept_from(server, KEY, time.monotonic() + 10))
    out = ferry.link_to("127.0.0.1", port, KEY)
    th.join(10)
    inbound = got[0]
    assert isinstance(inbound, socket.socket)
    try:
        out.sendall(ferry.frame(b"D", b"relayed"))
        assert ferry.read_frame(inbound.makefile("rb").read) == (b"D", b"relayed")
        assert out.gettimeout() == ferry.STALL_S and inbound.gettimeout() == ferry.STALL_S
    finally:
        out.close()
        inbound.close()
        server.close()


def test_a_wrong_key_is_refused_by_both_sides() -> None:
    server = listener()
    port = server.getsockname()[1]
    th, got = in_thread(lambda: ferry.accept_from(server, KEY, time.monotonic() + 0.5))
    with pytest.raises((ferry.Bad, EOFError, OSError)):
        ferry.link_to("127.0.0.1", port, b"w" * 32)
    th.join(5)
    server.close()
    assert not th.is_alive()
    # never a socket; it kept waiting past the wrong key, until its deadline's words
    assert isinstance(got[0], ferry.Bad) and "never connected" in str(got[0]), got


def test_accept_from_skips_a_wrong_key_and_takes_the_right_one_after_it() -> None:
    server = listener()
    port = server.getsockname()[1]
    th, got = in_thread(lambda: ferry.accept_from(server, KEY, time.monotonic() + 10))
    with pytest.raises((ferry.Bad, EOFError, OSError)):
        ferry.link_to("127.0.0.1", port, b"w" * 32)
    out = ferry.link_to("127.0.0.1", port, KEY)
    th.join(10)
    try:
        assert isinstance(got[0], socket.socket)
    finally:
        out.close()
        server.close()
        if isinstance(got[0], socket.socket):
            got[0].close()


def test_link_to_refuses_a_listener_that_does_not_hold_the_key() -> None:
    """Both ends prove it: a listener that answers without the key is not linked to."""
    server = listener()
    port = server.getsockname()[1]

    def impostor() -> socket.socket:
        c, _ = server.accept()
        c.sendall(os.urandom(16))
        ferry._exactly(c.recv, 48)
        c.sendall(b"\0" * 32)
        return c
    th, got = in_thread(impostor)
    with pytest.raises(ferry.Bad, match="does not hold this transfer's key"):
        ferry.link_to("127.0.0.1", port, KEY)
    th.join(5)
    server.close()
    if isinstance(got[0], socket.socket):
        got[0].close()


def test_accept_from_gives_up_with_bad_at_its_deadline() -> None:
    server = listener()
    try:
        with pytest.raises(ferry.Bad, match="never connected"):
            ferry.accept_from(server, KEY, time.monotonic() + 0.2)
    finally:
        server.close()


# ---- plan: what a node holds and needs ----------------------------------------------------------
def d(c: str) -> str:
    return c * ferry.DIGEST_HEX


SHA = "a" * 64


def line(rel: object, kind: str, size: int | str, whole: str, blocks: str) -> str:
    return f"{json.dumps(rel)}\t{kind}\t{size}\t{whole}\t{blocks}"


def test_parse_held_reads_good_lines() -> None:
    out = "\n".join([line("a", "file", 2 * B, SHA, d("1") + d("2")),
                     line("dir/b c", "part", 5, SHA, d("3")),
                     line("e", "file", 0, SHA, "")]) + "\n"
    assert plan.parse_held(out, {"a", "dir/b c", "e"}) == {
        "a": Held("file", 2 * B, SHA, (d("1"), d("2"))),
        "dir/b c": Held("part", 5, SHA, (d("3"),)),
        "e": Held("file", 0, SHA, ()),
    }


@pytest.mark.parametrize("bad", [
    line("other", "file", 1, SHA, d("1")),  # a path not asked
    line("a", "file", 2 * B, SHA, d("1")),  # one digest for two blocks
    line("a", "file", 1, SHA, d("1") + d("2")),  # two for one
    line("a", "file", 1, SHA, d("1")[:-1]),  # a digest cut short
    line("a", "file", 1, "a" * 63, d("1")),  # a short sha256
    line("a", "file", 1, "a" * 65, d("1")),
    line("a", "dir", 1, SHA, d("1")),  # neither a file nor a partial file
    line("a", "file", -1, SHA, ""),
    line("a", "file", "1e3", SHA, ""),
    line("a", "file", "²", SHA, ""),
    line(5, "file", 1, SHA, d("1")),
    "a\tfile\t1\t" + SHA + "\t" + d("1"),  # the path not JSON
    line("a", "file", 1, SHA, d("1")) + "\textra",
    "garbage",
    "",
    "\t\t\t\t",
])
def test_parse_held_skips_a_malformed_line(bad: str) -> None:
    good = line("b", "file", 1, SHA, d("9"))
    assert plan.parse_held(bad + "\n" + good, {"a", "b"}) == {
        "b": Held("file", 1, SHA, (d("9"),))}


@pytest.mark.parametrize("rel", [["a"], {"a": 1}])
def test_parse_held_skips_a_line_whose_path_is_not_a_string(rel: object) -> None:
    assert plan.parse_held(line(rel, "file", 1, SHA, d("1")), {"a"}) == {}


def lf(size: int, blocks: tuple[str, ...] | None, whole: str | None = SHA) -> Local:
    return Local("f", Path("/nowhere/f"), size, MTIME, 0o644, whole if blocks else None, blocks)


def test_need_everything_where_nothing_is_held_or_nothing_was_hashed() -> None:
    assert plan.need(lf(3 * B, (d("1"), d("2"), d("3"))), None) == Need()
    assert plan.need(lf(B, None), Held("file", B, SHA, (d("1"),))) == Need()
    assert Need().blocks is None and not Need().touch


def test_need_only_a_touch_where_the_same_content_is_there() -> None:
    blocks = (d("1"), d("2"))
    assert plan.need(lf(2 * B, blocks), Held("file", 2 * B, SHA, blocks)) == Need(touch=True)
    assert plan.need(lf(2 * B, blocks), Held("file", 2 * B, "", blocks)) == Need(touch=True)
    # the same blocks in a partial file are not in place yet; another block is not the same
    # content (the blocks decide: a node that asks for blocks only sends no whole sha256)
    assert plan.need(lf(2 * B, blocks), Held("part", 2 * B, SHA, blocks)) == Need(blocks=())
    assert plan.need(lf(2 * B, blocks), Held("file", 2 * B, SHA, (d("1"), d("3")))) == \
        Need(blocks=(1,))


def test_need_the_rest_of_a_partial_file() -> None:
    mine = (d("1"), d("2"), d("3"), d("4"))
    assert plan.need(lf(4 * B, mine), Held("part", 2 * B, "c" * 64, mine[:2])) == \
        Need(blocks=(2, 3))
    assert plan.need(lf(4 * B, mine), Held("part", 0, "c" * 64, ())) == \
        Need(blocks=(0, 1, 2, 3))


def test_need_just_the_block_that_differs_in_the_middle() -> None:
    mine = (d("1"), d("2"), d("3"), d("4"))
    there = (d("1"), d("x"), d("3"), d("4"))
    assert plan.need(lf(4 * B, mine), Held("file", 4 * B, "c" * 64, there)) == \
        Need(blocks=(1,))


# ---- plan: the moves ----------------------------------------------------------------------------
F4 = lf(4 * B - 10, (d("1"), d("2"), d("3"), d("4")))


def test_plan_moves_sends_the_union_of_what_the_writers_need() -> None:
    [m] = plan.plan_moves([(0, F4, {0: Need(blocks=(3, 1)), 2: Need(blocks=(1, 2)),
                                        1: Need(touch=True)})])
    assert m == Move(0, F4, (1, 2, 3), (0, 2), (1,))
    assert plan.moved_bytes(m) == 3 * B - 10


def test_plan_moves_sends_every_block_if_any_writer_needs_every_block() -> None:
    for needs in ({0: Need(), 1: Need(blocks=(1,))}, {0: Need(blocks=(1,)), 1: Need()},
                  {0: Need(blocks=(1,)), 1: Need(), 2: Need(blocks=(2,))}):
        [m] = plan.plan_moves([(1, F4, needs)])
        assert m.blocks is None and m.root == 1 and m.writers == tuple(sorted(needs))
        assert plan.moved_bytes(m) == F4.size


def test_plan_moves_keeps_a_file_only_touched_and_drops_one_nobody_needs() -> None:
    other = lf(5, (d("5"),))
    moves = plan.plan_moves([(0, F4, {0: Need(touch=True), 1: Need(touch=True)}),
                                 (0, other, {})])
    assert moves == [Move(0, F4, (), (), (0, 1))]
    assert plan.moved_bytes(moves[0]) == 0


def test_plan_moves_a_writer_that_holds_it_all_already_still_writes_it() -> None:
    [m] = plan.plan_moves([(0, F4, {0: Need(blocks=())})])
    assert m.blocks == () and m.writers == (0,) and plan.moved_bytes(m) == 0


def test_moved_per_node_counts_what_each_writer_writes_kept_and_touched_per_root() -> None:
    small = lf(10, (d("9"),))
    moves = plan.plan_moves([
        (0, F4, {0: Need(blocks=(1,)), 1: Need(blocks=(3,)), 2: Need(touch=True)}),
        (0, small, {1: Need(touch=True), 2: Need()}),
        (1, small, {0: Need(blocks=())})])
    # nodes 0 and 1 each write the blocks both need (the stream carries their union)
    both = B + (F4.size - 3 * B)
    assert plan.moved_per_node(moves) == {
        (0, 0): Moved(files=1, sent=both, kept=F4.size - both, touched=0),
        (1, 0): Moved(files=1, sent=both, kept=F4.size - both, touched=1),
        (2, 0): Moved(files=1, sent=10, kept=0, touched=1),
        (0, 1): Moved(files=1, sent=0, kept=10, touched=0),
    }


# ---- plan: the route ----------------------------------------------------------------------------
def test_chains_all_linked_is_one_chain() -> None:
    assert plan.chains(["a", "b", "c"], {"a": True, "b": True}) == [["a", "b", "c"]]


def test_chains_a_break_in_the_middle_feeds_the_next_node_from_here() -> None:
    assert plan.chains(["a", "b", "c", "d"], {"a": True, "b": False, "c": True}) == \
        [["a", "b"], ["c", "d"]]
    assert plan.chains(["a", "b", "c"], {"a": True}) == [["a", "b"], ["c"]]  # unknown: cut


def test_chains_all_broken_is_one_chain_a_node() -> None:
    assert plan.chains(["a", "b", "c"], {"a": False, "b": False}) == [["a"], ["b"], ["c"]]
    assert plan.chains(["a"], {}) == [["a"]]
    assert plan.chains([], {}) == []


# ---- report: the reports ------------------------------------------------------------------------
@pytest.mark.parametrize("obj,want", [
    ({"port": 40000}, {"port": 40000, "why": ""}),
    ({"port": 0, "why": "cannot listen on node2: Name or service not known"}, None),
    ({"linked": True}, {"linked": True, "why": ""}),
    ({"linked": False, "why": "connection refused"}, None),
    ({"linked": False, "why": 5}, {"linked": False, "why": ""}),
    ({"at": 0}, None),
    ({"at": 123456789}, None),
    ({"waiting": 0}, None), ({"waiting": 21.5}, None),
    ({"unread": 0}, None), ({"unread": 212992}, None),
    ({"ok": [0, "d/f.bin", SHA]}, None),
    ({"ok": [1, "f", ""]}, None),  # a touch
    ({"gave_up": [0, "f"]}, None),
    ({"error": {"msg": "No space left on device", "errno": "ENOSPC", "path": "/w/f"}}, None),
    ({"error": {"msg": "x", "relay": "in"}}, None),
    ({"done": {"files": 2, "bytes": 10, "failed": False}}, None),
])
def test_parse_report_takes_each_valid_shape(obj: dict[str, object],
                                            want: dict[str, object] | None) -> None:
    assert report.parse_report(json.dumps(obj).encode()) == (want or obj)


@pytest.mark.parametrize("text", [
    b'{"at": 1, "x": 2}',  # an extra key
    b'{"linked": true, "why": "", "more": 1}',
    b'{"why": "x", "linked": false}',  # why first: not how a receiver writes it
    b'{"ok": [0, "f", ""], "done": {}}',
    b'{"port": -1}', b'{"port": 65536}', b'{"port": "22"}',
    b'{"linked": "yes"}', b'{"linked": 1}',
    b'{"at": -1}', b'{"at": 1.5}', b'{"at": "1"}',
    b'{"waiting": -1}', b'{"waiting": NaN}', b'{"waiting": Infinity}', b'{"waiting": true}',
    b'{"waiting": "5"}', b'{"waiting": 1e12}',
    b'{"unread": -1}', b'{"unread": 1.5}', b'{"unread": true}', b'{"unread": "5"}',
    b'{"ok": [true, "f", ""]}',  # a bool is not a root index
    b'{"ok": [0, "f"]}', b'{"ok": [0, "f", "abc"]}', b'{"ok": ["0", "f", ""]}',
    b'{"ok": [0, 5, ""]}', b'{"ok": {"root": 0}}',
    b'{"gave_up": "f"}', b'{"error": "disk full"}', b'{"done": true}',
    b'{"hello": 1}', b"{}", b"[1, 2]", b'"at"', b"5", b"null",
    b"not json", b"\xff\xfe", b"",
    b"Welcome to node1! Last login: ...",
])
def test_parse_report_rejects_what_is_not_a_report(text: bytes) -> None:
    assert report.parse_report(text) is None


def states(now: float, **said: tuple[float, float]) -> dict[str, report.NodeState]:
    """Node states from name=(seconds waiting to pass data on, seconds since it placed a byte)."""
    out = {}
    for name, (waiting, still) in said.items():
        st = report.NodeState(name)
        st.waiting, st.moved = waiting, now - still
        out[name] = st
    return out


def test_takes_nothing_names_the_next_node_when_both_bounds_are_passed() -> None:
    routes = [["a", "b", "c"]]
    assert report.takes_nothing(routes, states(100.0, a=(20, 20), b=(0, 20), c=(0, 20)), 100.0,
                                20) == ("a", "b")


@pytest.mark.parametrize("said", [
    {"a": (19.9, 60), "b": (0, 60)},  # a waited, but not yet for the bound
    {"a": (60, 60), "b": (0, 5)},  # b places bytes (copying the blocks it keeps, say)
])
def test_takes_nothing_is_none_while_the_next_node_is_not_proven_deaf(
        said: dict[str, tuple[float, float]]) -> None:
    assert report.takes_nothing([["a", "b"]], states(100.0, **said), 100.0, 20) is None


def test_takes_nothing_names_the_node_further_on_that_holds_the_chain_up() -> None:
    """b waits on c in turn: b is not the one that stopped reading, c is."""
    st = states(100.0, a=(60, 60), b=(60, 60), c=(0, 60))
    assert report.takes_nothing([["a", "b", "c"]], st, 100.0, 20) == ("b", "c")


def test_takes_nothing_leaves_a_silent_node_to_the_silence_bound() -> None:
    """A cut link: b says nothing at all, so it is not deaf but silent (named by STALL_S as
    having stopped answering, not as the far end of a stalled link)."""
    st = states(100.0, a=(60, 60), b=(0, 60))
    st["b"].last = 100.0 - report.HEARD_S
    assert report.takes_nothing([["a", "b"]], st, 100.0, 20) is None
    st["b"].last = 100.0 - 0.5
    assert report.takes_nothing([["a", "b"]], st, 100.0, 20) == ("a", "b")


def test_takes_nothing_skips_a_node_that_ended_or_is_done() -> None:
    st = states(100.0, a=(60, 60), b=(0, 60))
    st["b"].done = True
    assert report.takes_nothing([["a", "b"]], st, 100.0, 20) is None


def test_relayer_is_the_node_before_in_its_chain() -> None:
    routes = [["a", "b", "c"], ["d"]]
    assert [report.relayer(routes, n) for n in "abcd"] == [None, "a", "b", None]


def test_forward_says_how_long_what_waits_has_moved_nothing() -> None:
    """A next node that reads nothing: the send blocks, and waiting() grows from 0 (bounded in
    time: the test only needs it to be positive)."""
    mine, theirs = socket.socketpair()
    fwd = ferry.Forward(mine)
    assert fwd.waiting() == 0.0

    def send() -> None:
        with contextlib.suppress(OSError):
            fwd.send(b"x" * (64 * B))
    th = threading.Thread(target=send, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 10
        while fwd.waiting() == 0.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)
        assert fwd.waiting() > 0.0
    finally:
        theirs.close()  # the send fails at once (a blocked send is not woken by its own close)
        th.join(10)
        fwd.close()
    assert fwd.waiting() == 0.0  # the send ended


def test_parse_report_rejects_an_overlong_line() -> None:
    ok = json.dumps({"error": {"msg": "x" * (report.LINE_MAX - 30)}}).encode()
    assert len(ok) <= report.LINE_MAX and report.parse_report(ok) is not None
    long = json.dumps({"error": {"msg": "x" * report.LINE_MAX}}).encode()
    assert report.parse_report(long) is None


def test_problem_text_for_a_full_disk_names_the_path_the_free_space_and_the_partial_file(
) -> None:
    for code in ("ENOSPC", "EDQUOT"):
        text = report.problem_text({"path": "/w/data/shard.bin", "errno": code, "kept": True,
                                      "msg": "No space left on device", "free": 3 << 29})
        assert text.startswith("no space left writing /w/data/shard.bin (1.5 GiB free there): ")
        assert "set `workdir` for this host to a larger disk" in text
        assert "(in /w/data/.shard.bin.fleet-part)" in text
        assert "sends only the rest" in text
    text = report.problem_text({"path": "top.bin", "errno": "ENOSPC", "msg": "x", "kept": True})
    assert "free there" not in text and "(in .top.bin.fleet-part)" in text
    # a delta's partial copy is removed on failure: the message must not promise it
    text = report.problem_text({"path": "top.bin", "errno": "ENOSPC", "msg": "x",
                                  "kept": False})
    assert "fleet-part" not in text and "Nothing of that file was kept" in text


def test_problem_text_for_other_errors() -> None:
    assert report.problem_text({"path": "/w/f", "errno": "EACCES",
                                  "msg": "Permission denied", "free": 10}) == \
        "cannot write /w/f: Permission denied"
    assert report.problem_text({"path": "/w/f"}) == "cannot write /w/f: failed"
    assert report.problem_text({"msg": "the stream ended before its end", "relay": "in"}) == \
        "the stream ended before its end"
    assert report.problem_text({}) == "failed"


def test_problem_text_of_a_real_full_disk_error_from_a_receiver(tmp_path: Path) -> None:
    err = ferry._problem(OSError(28, "No space left on device"), str(tmp_path / "d/f.bin"))
    assert err["errno"] == "ENOSPC" and isinstance(err["free"], int)
    err["kept"] = True
    text = report.problem_text(err)
    assert text.startswith(f"no space left writing {tmp_path / 'd/f.bin'} (")
    assert str(tmp_path / "d/.f.bin.fleet-part") in text


@pytest.mark.parametrize("n,text", [
    (0, "0 bytes"), (1023, "1023 bytes"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
    (5 << 20, "5.0 MiB"), (3 << 30, "3.0 GiB"), (2 << 40, "2.0 TiB"), (4096 << 40, "4096.0 TiB"),
])
def test_human(n: int, text: str) -> None:
    assert report.human(n) == text


# ---- a malformed header that is JSON: refused, not a crash --------------------------------------
@pytest.mark.parametrize("frames", [
    [header(path="f", **{"for": 5})],
    [header(path="f", **{"for": "x"})],
    [header(path="f", mtime=10**30), end(b"")],
], ids=["for an int", "for a string", "mtime out of range"])
def test_a_header_of_the_wrong_type_is_bad_not_a_crash(tmp_path: Path,
                                                        frames: list[bytes]) -> None:
    node = Node(tmp_path)
    with contextlib.suppress(ferry.Bad):
        node.feed(*frames)
    assert node.errors() or tree(tmp_path) == []
    assert not (tmp_path / "f").exists() and not (tmp_path / ".f.fleet-part").exists()


# ---- the other way: fetch (a pull's engine) from a node, here a local one -----------------------
def local_node() -> Transport:
    from fleet.config.inventory import Host
    from fleet.transport.local import LocalTransport
    return LocalTransport(Host("here", "localhost", transport="local"))


def test_fetch_brings_a_nodes_files_here_verified(tmp_path: Path) -> None:
    node, here = tmp_path / "node", tmp_path / "here"
    (node / "ckpt").mkdir(parents=True)
    big = os.urandom(3 * ferry.BLOCK + 17)
    (node / "ckpt" / "model.pt").write_bytes(big)
    (node / "log.txt").write_text("done\n")
    here.mkdir()
    got = pull.fetch(local_node(), sys.executable, str(node),
                     [Want("ckpt/model.pt", len(big)), Want("log.txt", 5),
                      Want("missing.bin", 1)], here)
    assert (here / "ckpt" / "model.pt").read_bytes() == big
    assert (here / "log.txt").read_text() == "done\n"
    assert got == {"ckpt/model.pt": hashlib.sha256(big).hexdigest(),
                   "log.txt": hashlib.sha256(b"done\n").hexdigest()}
    assert not list(here.rglob("*.fleet-part"))


class HostileNode(Transport):
    """A node whose `ferry send` is replaced by a program that sends `frames` after the mark."""

    def __init__(self, frames: bytes) -> None:
        from fleet.config.inventory import Host
        super().__init__(Host("evil", "localhost", transport="local"))
        self.frames = frames

    def connect(self, hello: bool = True) -> None: ...
    def run(self, script, timeout=60.0, what=""):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def stream(self, script, on_lines, stop=None, received=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def _put(self, path: str, data: bytes, mode: int) -> str:
        raise NotImplementedError

    def open_port(self, address, port):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def pipe(self, script: str) -> Pipe:
        import re

        from fleet.transport.local import _LocalPipe
        mark = re.search(r"FERRY-[0-9a-f]{16}", script)
        assert mark
        payload = (b"rc noise\n" + mark.group().encode() + b"\n" + self.frames).hex()
        return _LocalPipe(f"{sys.executable} -c 'import sys; sys.stdout.buffer.write("
                          f"bytes.fromhex(\"{payload}\"))'")


def evil_file(path: str, data: bytes = b"pwned\n") -> bytes:
    return (ferry.meta(b"F", {"root": 0, "path": path, "size": len(data), "mode": 0o755,
                              "mtime": 0, "blocks": None, "for": [0]})
            + ferry.frame(b"D", data)
            + ferry.meta(b"E", {"sha256": hashlib.sha256(data).hexdigest()}))


@pytest.mark.parametrize("path", ["../escaped", "/tmp/escaped", "a/../../escaped"])
def test_fetch_refuses_a_path_that_leaves_the_destination(tmp_path: Path, path: str) -> None:
    here = tmp_path / "here"
    here.mkdir()
    with pytest.raises(WorkdirError, match="broke the protocol"):
        pull.fetch(HostileNode(evil_file(path)), sys.executable, "/x", [Want("a", 6)], here)
    assert not (tmp_path / "escaped").exists() and not list(here.iterdir())


def test_fetch_never_writes_through_a_link_in_the_destination(tmp_path: Path) -> None:
    here, outside = tmp_path / "here", tmp_path / "outside"
    here.mkdir()
    outside.mkdir()
    (here / "ckpt").symlink_to(outside)
    with pytest.raises(WorkdirError, match=f"{here}/ckpt: a symbolic link on this machine"):
        pull.fetch(HostileNode(evil_file("ckpt/x.pt") + ferry.frame(b"Z", b"")),
                   sys.executable, "/x", [Want("ckpt/x.pt", 6)], here)
    assert not list(outside.iterdir())


def test_fetch_keeps_nothing_whose_hash_the_node_got_wrong(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    frames = (ferry.meta(b"F", {"root": 0, "path": "w.pt", "size": 3, "mode": 0o644,
                                "mtime": 0, "blocks": None, "for": [0]})
              + ferry.frame(b"D", b"abc") + ferry.meta(b"E", {"sha256": "0" * 64})
              + ferry.frame(b"Z", b""))
    with pytest.raises(WorkdirError, match="w.pt"):
        pull.fetch(HostileNode(frames), sys.executable, "/x", [Want("w.pt", 3)], here)
    assert not list(here.iterdir())


# ---- progress -----------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def bar_states(at: dict[str, int], expected: int) -> dict[str, report.NodeState]:
    return {n: report.NodeState(n, expected=expected, at=a) for n, a in at.items()}


def test_without_a_terminal_progress_is_a_line_every_ten_seconds(tmp_path: Path) -> None:
    from fleet.console import Console
    err = io.StringIO()
    clock = Clock()
    states = bar_states({"node1": 0, "node2": 0}, 100 << 20)
    bar = progress.Bar(Console(out=io.StringIO(), err=err), 100 << 20, states,
                       ["node1", "node2"], clock)
    for step in range(1, 26):  # 25 s, a frame every second
        clock.now += 1
        states["node1"].at = states["node2"].at = step * (2 << 20)
        bar.tick()
    lines = err.getvalue().splitlines()
    assert len(lines) == 2, lines  # at 10 s and 20 s
    assert lines[1] == "fleet: data 40.0 MiB of 100.0 MiB on each of 2 nodes, 2.0 MiB/s, 30s left"
    bar.end()
    assert len(err.getvalue().splitlines()) == 2  # no terminal: nothing to erase


def test_progress_names_each_node_where_they_differ() -> None:
    from fleet.console import Console
    states = bar_states({"node1": 60 << 20, "node2": 30 << 20}, 100 << 20)
    bar = progress.Bar(Console(out=io.StringIO(), err=io.StringIO()), 100 << 20, states,
                       ["node1", "node2"], Clock())
    said = bar.text(bar.t0 + 10)
    assert said.endswith("  node1 60% node2 30%")
    assert "45.0 MiB of 100.0 MiB on each of 2 nodes, " in said, said
    # the line up to its time left fits an 80-column terminal (fleet: and a frame's width)
    assert len("fleet: " + said.split("  node1")[0]) <= 79, said


def test_on_a_terminal_progress_is_one_line_redrawn_and_erased(tmp_path: Path) -> None:
    from fleet.console import Console

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True
    err, clock = Tty(), Clock()
    states = bar_states({"node1": 0}, 64 << 20)
    bar = progress.Bar(Console(out=io.StringIO(), err=err, live=True), 64 << 20, states,
                       ["node1"], clock)
    for _ in range(8):
        clock.now += 0.5
        states["node1"].at += 4 << 20
        bar.tick()
    bar.end()
    text = err.getvalue()
    assert "\n" not in text and text.count("\r\033[K") == 9  # 8 draws and the erase
    assert "32.0 MiB of 64.0 MiB in place" in text


# ---- a relayed stream is another node's data: fleet's own word decides ---------------------------
def relayed_node(root: Path, shas: dict[tuple[int, str], str], ended: bool = True,
                 heads: dict[tuple[int, str], tuple[int, int, int]] | None = None) -> Node:
    """A node the stream reaches through another, and fleet's word to it: each head's size,
    mode and time, every block sent, written by this node (0) alone."""
    node = Node(root)
    word = ferry.Word(io.BytesIO())
    word.shas.update(shas)
    for (root, rel), h in (heads or {}).items():
        word.take({"file": [root, rel, *h, None, [0]]})
    word.ended = ended
    node.recv.word = word
    return node


def told(data: bytes, mode: int = 0o755, mtime: int = 0) -> tuple[int, int, int]:
    """fleet's word on a file evil_file sends (size, mode, time)."""
    return len(data), mode, mtime


def test_a_relayed_file_replaces_its_target_only_as_fleet_said(tmp_path: Path) -> None:
    good, evil = b"weights" * 1000, b"trojan!" * 1000  # the same size: only the hash differs
    node = relayed_node(tmp_path / "dst", {(0, "model.py"): sha(good)},
                        heads={(0, "model.py"): told(good)})
    # the node before (or someone on the wire) sends other bytes, with their own matching hash
    node.feed(evil_file("model.py", evil))
    assert not (tmp_path / "dst" / "model.py").exists()
    assert [(e["path"].rsplit("/", 1)[1], e.get("tampered"))  # type: ignore[union-attr]
            for e in node.errors()] == [("model.py", True)]
    assert not list((tmp_path / "dst").glob(".*.fleet-part"))


def test_a_relayed_file_fleet_never_sent_is_tampering(tmp_path: Path) -> None:
    node = relayed_node(tmp_path / "dst", {})
    with pytest.raises(ferry.Tampered, match="train.py: relayed, but fleet sends no such file"):
        node.feed(evil_file("train.py"))
    assert not list((tmp_path / "dst").rglob("*"))


@pytest.mark.parametrize("said", [(7000, 0o6777, MTIME), (7000, 0o644, 0), (6999, 0o644, MTIME)])
def test_a_relayed_header_that_is_not_fleets_word_is_tampering(
        tmp_path: Path, said: tuple[int, int, int]) -> None:
    """A relaying node that changes a file's mode, time or size: refused before a byte is
    written, whatever the bytes (here fleet's own)."""
    good = b"weights" * 1000
    node = relayed_node(tmp_path / "dst", {(0, "model.py"): sha(good)},
                        heads={(0, "model.py"): (len(good), 0o644, MTIME)})
    frames = (ferry.meta(b"F", {"root": 0, "path": "model.py", "size": said[0], "mode": said[1],
                                "mtime": said[2], "blocks": None, "for": [0]}))
    with pytest.raises(ferry.Tampered, match="model.py: relayed as .*; fleet sent size 7000, "
                                             "mode 0o644"):
        node.feed(frames)
    assert not list((tmp_path / "dst").rglob("*"))


def test_a_relayed_file_fleet_vouches_for_is_placed_with_fleets_mode_and_time(
        tmp_path: Path) -> None:
    good = b"weights" * 1000
    node = relayed_node(tmp_path / "dst", {(0, "model.py"): sha(good)},
                        heads={(0, "model.py"): told(good, 0o750, MTIME)})
    node.feed(ferry.meta(b"F", {"root": 0, "path": "model.py", "size": len(good), "mode": 0o750,
                                "mtime": MTIME, "blocks": None, "for": [0]}),
              ferry.frame(b"D", good), end(good), ferry.frame(b"Z", b""))
    st = os.stat(tmp_path / "dst" / "model.py")
    assert (tmp_path / "dst" / "model.py").read_bytes() == good
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_mtime_ns == MTIME


def test_no_file_is_ever_given_a_set_id_or_sticky_bit_or_write_for_others(tmp_path: Path) -> None:
    """Whatever the source says (here fleet's own stream, and fleet's word to a relayed node)."""
    node = Node(tmp_path / "head")
    node.feed(ferry.meta(b"F", {"root": 0, "path": "tool", "size": 2, "mode": 0o7777,
                                "mtime": MTIME, "blocks": None, "for": [0]}),
              ferry.frame(b"D", b"hi"), end(b"hi"))
    assert stat.S_IMODE(os.stat(tmp_path / "head" / "tool").st_mode) == 0o775
    relayed = relayed_node(tmp_path / "relayed", {(0, "tool"): sha(b"hi")},
                           heads={(0, "tool"): (2, 0o6777, MTIME)})
    relayed.feed(ferry.meta(b"F", {"root": 0, "path": "tool", "size": 2, "mode": 0o6777,
                                   "mtime": MTIME, "blocks": None, "for": [0]}),
                 ferry.frame(b"D", b"hi"), end(b"hi"))
    assert stat.S_IMODE(os.stat(tmp_path / "relayed" / "tool").st_mode) == 0o775
    relayed.recv.touch_all([{"root": 0, "path": "tool", "mtime": MTIME, "mode": 0o4777,
                             "for": [0]}])
    assert stat.S_IMODE(os.stat(tmp_path / "relayed" / "tool").st_mode) == 0o775


def test_the_word_takes_each_line_fleet_says() -> None:
    word = ferry.Word(io.BytesIO())
    for line in ({"file": [0, "a", 3, 0o644, MTIME, [0], [0, 2]]}, {"sha": [0, "a", "ab" * 32]},
                 {"touch": {"root": 1, "path": "b"}}, {"end": True}):
        word.take(line)
    assert word.heads == {(0, "a"): (3, 0o644, MTIME, [0], [0, 2])}
    assert word.shas == {(0, "a"): "ab" * 32}
    assert word.touches() == [{"root": 1, "path": "b"}]
    assert word.head(0, "other") is None  # fleet has ended: no such file, at once
    frame = {"size": 3, "mode": 0o644, "mtime": MTIME, "blocks": [0], "for": [0, 2]}
    assert word.check(0, "a", frame) == (3, 0o644, MTIME, [0], [0, 2])


@pytest.mark.parametrize(("key", "value"), [
    ("blocks", None), ("blocks", []), ("blocks", [0, 1]), ("blocks", [True]),
    ("for", [0]), ("for", [2, 0]), ("for", [0, 2, 1]), ("for", None), ("for", [0, 2.0])])
def test_a_relayed_header_with_other_blocks_or_writers_than_fleets_word_is_tampering(
        key: str, value: object) -> None:
    """Which blocks come and which nodes write the file are fleet's word too: a node left out
    of a file by the node before it, or a new file said to be a delta of nothing, is tampering
    (not a file skipped, or "cannot write")."""
    word = ferry.Word(io.BytesIO())
    word.take({"file": [0, "a", 3, 0o644, MTIME, [0], [0, 2]]})
    frame = {"size": 3, "mode": 0o644, "mtime": MTIME, "blocks": [0], "for": [0, 2], key: value}
    with pytest.raises(ferry.Tampered, match=r"a: relayed as size 3, .*; fleet sent size 3, "
                                             r"mode 0o644, time \d+, blocks \[0\], writers "
                                             r"\[0, 2\]$"):
        word.check(0, "a", frame)


def test_a_relayed_node_left_out_of_a_files_writers_refuses_it_and_writes_nothing(
        tmp_path: Path) -> None:
    node = relayed_node(tmp_path / "dst", {(0, "model.py"): sha(b"pwned\n")},
                        heads={(0, "model.py"): (6, 0o755, 0)})
    frames = (ferry.meta(b"F", {"root": 0, "path": "model.py", "size": 6, "mode": 0o755,
                                "mtime": 0, "blocks": None, "for": [1]})
              + ferry.frame(b"D", b"pwned\n") + end(b"pwned\n"))
    with pytest.raises(ferry.Tampered, match="writers \\[1\\]; fleet sent .*writers \\[0\\]"):
        node.feed(frames)
    assert not list((tmp_path / "dst").rglob("*"))


def test_a_relayed_touch_is_not_obeyed(tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    put(dst / "f", b"x", mode=0o644)
    node = relayed_node(dst, {})
    node.feed(ferry.meta(b"T", {"root": 0, "path": "f", "mtime": 0, "mode": 0o4777,
                                "for": [0]}), ferry.frame(b"Z", b""))
    assert stat.S_IMODE(os.stat(dst / "f").st_mode) == 0o644
    node.recv.touch_all([{"root": 0, "path": "f", "mtime": MTIME, "mode": 0o600, "for": [0]}])
    assert stat.S_IMODE(os.stat(dst / "f").st_mode) == 0o600  # fleet's own word is


def test_fetch_writes_only_the_files_asked_for(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    with pytest.raises(WorkdirError, match="was not asked for"):
        pull.fetch(HostileNode(evil_file(".git/hooks/pre-commit") + ferry.frame(b"Z", b"")),
                   sys.executable, "/x", [Want("ckpt.pt", 6)], here)
    assert not list(here.iterdir())


def test_fetch_keeps_nothing_of_a_file_sent_past_what_was_listed(tmp_path: Path) -> None:
    """One block listed, two sent: the second is refused before it is written, and the
    partial file of the first goes too (a node that broke the protocol seeds no resume)."""
    here = tmp_path / "here"
    here.mkdir()
    frames = (ferry.meta(b"F", {"root": 0, "path": "m.pt", "size": 5, "mode": 0o644,
                                "mtime": 0, "blocks": None, "for": [0]})
              + ferry.frame(b"D", b"a" * 5) * 2)
    with pytest.raises(WorkdirError, match=r"evil: broke the protocol .*: it sent more of m\.pt "
                                           r"than it listed \(5 bytes asked for\); nothing of "
                                           "that file was kept"):
        pull.fetch(HostileNode(frames), sys.executable, "/x", [Want("m.pt", 5)], here)
    assert not list(here.iterdir())


def test_fetch_writes_nothing_of_a_file_sent_larger_than_listed(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    with pytest.raises(WorkdirError, match="a was listed at 5 bytes, and it began sending 6 b"):
        pull.fetch(HostileNode(evil_file("a") + ferry.frame(b"Z", b"")), sys.executable, "/x",
                   [Want("a", 5)], here)
    assert not list(here.iterdir())


def test_fetch_takes_no_set_id_bit_and_no_write_for_others(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    frames = (ferry.meta(b"F", {"root": 0, "path": "tool", "size": 2, "mode": 0o6777,
                                "mtime": MTIME, "blocks": None, "for": [0]})
              + ferry.frame(b"D", b"hi") + ferry.meta(b"E", {"sha256": sha(b"hi")})
              + ferry.frame(b"Z", b""))
    pull.fetch(HostileNode(frames), sys.executable, "/x", [Want("tool", 2)], here)
    assert stat.S_IMODE(os.stat(here / "tool").st_mode) == 0o755


def test_fetch_refuses_a_stream_cut_before_its_end(tmp_path: Path) -> None:
    here = tmp_path / "here"
    here.mkdir()
    with pytest.raises(TransportError, match="ended before its end"):
        pull.fetch(HostileNode(evil_file("a")), sys.executable, "/x", [Want("a", 6)], here)


def test_an_interrupted_update_resumes_with_only_the_changed_blocks(tmp_path: Path) -> None:
    """An update of a 10-block file whose last block changed, cut after 4 blocks were copied:
    the next transfer keeps the partial file's 4 blocks and the old file's 5 after them, and
    sends the one block that changed, not the whole tail."""
    old = data(10 * B, 1)
    new = old[:9 * B] + data(B, 2)
    dst = tmp_path / "dst"
    put(dst / "f", old)
    put(dst / ".f.fleet-part", old[:4 * B])
    put(tmp_path / "src/f", new)
    out = io.StringIO()
    ferry.cmd_hash(str(dst), ["f"], out)
    held = plan.parse_held(out.getvalue(), {"f"})["f"]
    lf = local("f", tmp_path / "src/f", hashed=True)
    nd = plan.need(lf, held)
    assert nd == Need(blocks=(9,))
    node = Node(dst)
    node.feed(*send(lf, [9], [0]), Z)
    assert (dst / "f").read_bytes() == new and not (dst / ".f.fleet-part").exists()


def test_a_line_printed_while_the_bar_is_drawn_takes_its_place() -> None:
    """A phase line from another thread (the preflight's) must not land on the bar's line."""
    from fleet.console import Console

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True
    err, clock = Tty(), Clock()
    console = Console(out=io.StringIO(), err=err, live=True)
    states = bar_states({"node1": 0}, 64 << 20)
    bar = progress.Bar(console, 64 << 20, states, ["node1"], clock)
    clock.now += 1
    states["node1"].at = 8 << 20
    bar.tick()
    console.info("preflight: rendezvous port 29500 free on node1")
    assert err.getvalue().endswith("\r\033[K" + "fleet: preflight: rendezvous port 29500 free on "
                                   "node1\n")
    bar.end()  # nothing drawn since: nothing to erase
    assert err.getvalue().endswith("node1\n")


# ---- an edit within the second: no stale bytecode ----------------------------------------------
def test_a_replaced_python_file_loses_its_cached_bytecode(tmp_path: Path) -> None:
    """Python trusts a .pyc whose source has the same size and whole-second mtime: an edit of
    the same length within the second would run the old code."""
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in ("version.cpython-311.pyc", "version.cpython-38.opt-1.pyc",
                 "versions.cpython-311.pyc", "other.cpython-311.pyc"):
        (cache / name).write_bytes(b"old")
    ferry.forget_bytecode(str(tmp_path / "version.py"))
    assert sorted(p.name for p in cache.iterdir()) == ["other.cpython-311.pyc",
                                                       "versions.cpython-311.pyc"]


def test_the_bundle_removes_the_bytecode_of_the_python_files_it_replaces(tmp_path: Path) -> None:
    from fleet.transport.sync import stale_bytecode
    cache = tmp_path / "pkg" / "__pycache__"
    cache.mkdir(parents=True)
    (cache / "mod.cpython-311.pyc").write_bytes(b"old")
    (cache / "keep.cpython-311.pyc").write_bytes(b"old")
    globs = stale_bytecode([f"{tmp_path}/pkg/mod.py", f"{tmp_path}/data.bin"])
    assert len(globs) == 1
    subprocess.run(["sh", "-c", f"rm -f {globs[0]}"], check=True)
    assert [p.name for p in cache.iterdir()] == ["keep.cpython-311.pyc"]


def test_no_time_left_is_guessed_from_the_first_bytes() -> None:
    """Before 1% is in place the rate is mostly the transfer's start: no hours-off guess."""
    from fleet.console import Console
    states = bar_states({"node1": 2 << 10}, 96 << 20)
    bar = progress.Bar(Console(out=io.StringIO(), err=io.StringIO()), 96 << 20, states,
                       ["node1"], Clock())
    assert bar.text(bar.t0 + 0.3).endswith("in place, 6.7 KiB/s, time left: estimating")
    states["node1"].at = 48 << 20
    assert bar.text(bar.t0 + 4).endswith("in place, 12.0 MiB/s, 4s left")


NO_TRANSPORT = cast(Transport, None)  # a Transfer whose receivers are never started


def test_only_the_first_node_of_a_chain_to_find_tampering_names_the_one_before_it() -> None:
    """node2 passes node1's altered frames on unchanged, and node3 finds them altered too:
    node1 is named, never node2 (the node before a node that found tampering itself)."""
    from fleet.console import Console
    names = ["node1", "node2", "node3", "node4"]
    tr = relay.Transfer([relay.Target(n, NO_TRANSPORT, "python3", n, ("/x",)) for n in names],
                        [], Console(out=io.StringIO(), err=io.StringIO()))
    tr.routes = [["node1", "node2", "node3"], ["node4"]]
    for n in ("node2", "node3", "node4"):  # node4 is fed from here: no relaying node to name
        tr.states[n].error = {"msg": "main.py: relayed as ...", "tampered": True}
    with pytest.raises(RelayTampered) as e:
        tr._check_tampered()
    assert list(e.value.failures) == ["node1"]
    assert "what it relayed to node2 does not match" in e.value.failures["node1"]


def stalled_transfer() -> relay.Transfer:
    """node1 -> node2 -> node3, node1 having waited to pass data on to node2, which placed none."""
    from fleet.console import Console
    names = ["node1", "node2", "node3"]
    tr = relay.Transfer([relay.Target(n, NO_TRANSPORT, "python3", n, ("/x",)) for n in names],
                        [], Console(out=io.StringIO(), err=io.StringIO()))
    tr.routes = [names]
    tr.deaf, tr.cause = ("node1", "node2"), "node2"
    return tr


def test_a_relaying_nodes_word_alone_that_the_next_takes_nothing_names_both_ends() -> None:
    tr = stalled_transfer()
    with pytest.raises(HostError) as e:
        tr._check()
    failures = e.value.failures
    assert sorted(failures) == ["node1", "node2"]
    assert failures["node1"] == failures["node2"]
    assert failures["node2"].startswith("the relay link node1 -> node2 stalled: node1 says it "
                                        "waited 20s to pass data on to node2; node2 placed none")


def test_the_next_nodes_own_word_of_data_unread_confirms_it_takes_nothing() -> None:
    tr = stalled_transfer()
    tr.states["node2"].unread = 2 << 20
    with pytest.raises(HostError) as e:
        tr._check()
    failures = e.value.failures
    assert list(failures) == ["node2"]
    assert failures["node2"].startswith("takes nothing: node1 waited 20s to pass it data and it "
                                        "placed none meanwhile, with 2.0 MiB from node1 unread")


@pytest.mark.parametrize("unread", [0, 4096])
def test_a_node_that_says_it_could_not_pass_data_on_blames_the_next_only_if_it_confirms(
        unread: int) -> None:
    tr = stalled_transfer()
    tr.deaf, tr.cause = None, "node1"
    tr.states["node1"].error = {"msg": "passing the data on failed: timed out", "relay": "out"}
    tr.states["node2"].unread = unread
    with pytest.raises(HostError) as e:
        tr._check()
    failures = e.value.failures
    if unread:
        assert list(failures) == ["node2"]
        assert failures["node2"].startswith("takes nothing from node1, which could not pass")
    else:
        assert sorted(failures) == ["node1", "node2"]
        assert failures["node1"].startswith("the relay link node1 -> node2 stalled: node1 says "
                                            "it could not pass the data on (passing the data")


class NeverWaits(threading.Condition):
    """A Word's condition that fails the test where the Word would wait for more of fleet's
    word (WORD_S) instead of answering from what it already holds."""

    def wait(self, timeout: float | None = None) -> bool:
        raise AssertionError(f"waited for fleet's word (up to {timeout}s)")


def test_a_relayed_file_is_only_ever_the_next_one_fleet_announced() -> None:
    """In stream order: a frame for a file fleet did not announce next is tampering as soon as
    fleet's word says it went past the one announced (not after WORD_S); one fleet gave up
    before its first frame ("skip") is passed over."""
    word = ferry.Word(io.BytesIO())
    word.cond = NeverWaits()  # each answer below is known from the word already taken
    frame = {"size": 3, "mode": 0o644, "mtime": MTIME, "blocks": None, "for": [0]}
    for rel in ("a", "b", "c"):
        word.take({"file": [0, rel, 3, 0o644, MTIME, None, [0]]})
    word.take({"skip": [0, "a"]})
    assert word.check(0, "b", frame).size == 3
    with pytest.raises(ferry.Tampered, match="b: relayed, but fleet sends no such file next"):
        word.check(0, "b", frame)  # b again (a replay): c is next
    word.take({"sha": [0, "c", "ab" * 32]})
    assert word.check(0, "c", frame).size == 3
    word.take({"file": [0, "d", 3, 0o644, MTIME, None, [0]]})
    word.take({"sha": [0, "d", "ab" * 32]})  # d went, so e (never announced) is not next
    with pytest.raises(ferry.Tampered, match="e: relayed, but fleet sends no such file next"):
        word.check(0, "e", frame)
