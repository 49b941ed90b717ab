"""What both ends share: names of files and partial files, blocks, hashing, the frame format."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import IO, Any, Callable, Dict  # noqa: UP035 - Python 3.8

Json = Dict[str, Any]  # noqa: UP006 - evaluated at run time, on Python 3.8 too
Write = Callable[[bytes], None]
Read = Callable[[int], bytes]

BLOCK = 1 << 20
HEAD = struct.Struct(">cI")
MAX_META = 1 << 20  # a JSON frame longer than this: a broken stream
PART = ".fleet-part"
DIGEST_HEX = 32  # hex digits kept of a block's sha256
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class Bad(Exception):
    """A stream or a request that breaks the protocol (a path outside the root, say)."""


class Linked(Bad):
    """A path on the receiving side that passes through a symbolic link: the receiver's own
    directory is what is wrong, not the stream, and it is named so."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is a symbolic link: not written through")
        self.path = path


# ---- names and blocks: pure ---------------------------------------------------------------------
def part_name(rel: str) -> str:
    head, _, tail = rel.rpartition("/")
    return f"{head}/.{tail}{PART}" if head else f".{tail}{PART}"


def part_of(rel: str) -> str | None:
    """The file a partial file belongs to, or None if `rel` is not one."""
    head, _, tail = rel.rpartition("/")
    if not (tail.startswith(".") and tail.endswith(PART)) or len(tail) <= len(PART) + 1:
        return None
    name = tail[1:-len(PART)]
    return f"{head}/{name}" if head else name


def blocks_of(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK


def block_len(size: int, i: int) -> int:
    return max(0, min(BLOCK, size - i * BLOCK))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


def safe_rel(rel: object) -> str:
    """A relative path that stays under its root: no empty, '.' or '..' part, not absolute, no
    NUL. Paths in a stream are data from the other end, never trusted."""
    if not isinstance(rel, str) or not rel or len(rel) > 4096 or "\0" in rel:
        raise Bad(f"bad path {rel!r}")
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise Bad(f"path {rel!r} leaves its directory")
    return rel


def target(root: str, rel: str, strict: bool = False) -> str:
    """root/rel; with `strict` (this machine receiving from a node), no part of it under root
    may be a symbolic link (a node must not make a file land elsewhere)."""
    rel = safe_rel(rel)
    path = os.path.join(root, rel)
    if strict:
        at = root
        for p in rel.split("/"):
            at = os.path.join(at, p)
            if os.path.islink(at):
                raise Linked(at)
    return path


# ---- hashing what a node has ------------------------------------------------------------------
def hash_file(path: str, start: int = 0, whole_sha: bool = True) -> tuple[int, str, list[str]]:
    """(size, sha256, block digests) of a file, read once; from block `start` on (the size is
    then the whole file's, the hash and digests of what was read). Without `whole_sha`, the
    sha256 is "" (one pass of hashing instead of two)."""
    whole = hashlib.sha256() if whole_sha else None
    blocks = []
    size = start * BLOCK
    with open(path, "rb") as f:
        f.seek(size)
        while True:
            b = f.read(BLOCK)
            if not b:
                break
            if whole is not None:
                whole.update(b)
            blocks.append(digest(b))
            size += len(b)
    return size, whole.hexdigest() if whole is not None else "", blocks


def cmd_hash(root: str, rels: list[str], out: IO[str], whole_sha: bool = True) -> None:
    """Per file, what a transfer can keep of it; one line each: JSON path, TAB, "part" or
    "file", TAB, size, TAB, sha256 (empty without `whole_sha`: a push compares the blocks),
    TAB, the block digests run together. With a partial file:
    its whole blocks, then the file's blocks after them (see kept_from); else the file's. A
    file that is not there (or cannot be read) gets no line."""
    for rel in rels:
        final, part = target(root, rel), target(root, part_name(rel))
        try:
            if os.path.isfile(part):
                kind = "part"
                size, sha, blocks = hash_file(part, 0, whole_sha)
                keep = kept_from(size, final)
                if keep is not None:
                    size, _, rest = hash_file(final, keep, False)
                    blocks = blocks[:keep] + rest
            elif os.path.isfile(final):
                kind = "file"
                size, sha, blocks = hash_file(final, 0, whole_sha)
            else:
                continue
        except OSError:
            continue
        out.write(f"{json.dumps(rel)}\t{kind}\t{size}\t{sha}\t{''.join(blocks)}\n")


def kept_from(part_size: int, final: str) -> int | None:
    """Where a partial file left by an interrupted update ends and the old file takes over:
    its whole blocks are kept, and the old file's blocks after them (an update copies the
    old file's blocks in order, so an interrupted one holds only a prefix). None where the
    old file is not there or no longer than that prefix."""
    keep = part_size // BLOCK
    try:
        return keep if os.path.getsize(final) > keep * BLOCK else None
    except OSError:
        return None


# ---- frames -------------------------------------------------------------------------------------
def frame(kind: bytes, payload: bytes) -> bytes:
    return HEAD.pack(kind, len(payload)) + payload


def meta(kind: bytes, obj: Json) -> bytes:
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def read_frame(read: Read) -> tuple[bytes, bytes]:
    """(kind, payload) from a reader's read(n); ('', b'') at a clean end of input."""
    head = _exactly(read, HEAD.size, start=True)
    if not head:
        return b"", b""
    kind, n = HEAD.unpack(head)
    if kind not in b"FDEXTZ" or (kind != b"D" and n > MAX_META) or n > BLOCK:
        raise Bad(f"broken stream (a frame {kind!r} of {n} bytes)")
    return kind, _exactly(read, n)


def _exactly(read: Read, n: int, start: bool = False) -> bytes:
    if n == 0:
        return b""
    got = read(n)
    if not got and start:
        return b""
    while len(got) < n:
        more = read(n - len(got))
        if not more:
            raise EOFError("the stream ended mid-frame")
        got += more
    return got

