"""fleet's word to a node the stream reaches through another node, over its own connection."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import IO, Callable, NamedTuple, Sequence  # noqa: UP035 - Python 3.8

from fleet.nodeside.ferry.frames import Bad, Json

WORD_S = 120.0  # how long a relayed file waits, at its end, for fleet's word on it


class Tampered(Bad):
    """A relayed frame that does not match fleet's word: the node that passed it on altered
    it (or made it up)."""


class Head(NamedTuple):
    """fleet's word on one file it sends: what the frame that begins it must say."""

    size: int
    mode: int
    mtime: int
    blocks: list[int] | None  # the blocks sent (None: every block)
    writers: list[int]  # the nodes that write it (the frame's "for")


class Word:
    """What fleet says to a node that the stream reaches through another node, over the node's
    own SSH connection (its stdin): each file's size, mode, time, blocks sent and writers
    before it is sent, its sha256 as fleet read it after, and the files only to touch. A
    relayed stream is data from another node: a file in it is written only if fleet named it
    with the same size, mode, time, blocks and writers, and replaces the old one only if its
    hash is fleet's; what is applied (mode, time, blocks, whether to write it) is fleet's; its
    T frames are not obeyed. Its stdin ending (fleet gone, or stopping it) ends the node's
    receiver at once."""

    def __init__(self, stdin: IO[bytes]) -> None:
        self.stdin = stdin
        self.cond = threading.Condition()
        self.shas: dict[tuple[int, str], str] = {}
        self.heads: dict[tuple[int, str], Head] = {}
        # The files fleet announced and has not yet sent past or given up (each with its line's
        # number): the stream brings them in this order, so a relayed file is only ever the
        # first of them.
        self.pending: list[tuple[tuple[int, str], int]] = []
        self.lines = 0
        self.touch: list[Json] = []
        self.ended = False

    def listen(self) -> None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            for line in self.stdin:
                self.take(json.loads(line))
        os._exit(3)

    def take(self, obj: Json) -> None:
        """One line of fleet's word."""
        with self.cond:
            self.lines += 1
            if "sha" in obj:
                root, rel, sha = obj["sha"]
                self.shas[(int(root), str(rel))] = str(sha)
            elif "file" in obj:
                root, rel, size, mode, mtime, blocks, writers = obj["file"]
                self.heads[(int(root), str(rel))] = Head(
                    int(size), int(mode), int(mtime),
                    None if blocks is None else [int(i) for i in blocks],
                    [int(i) for i in writers])
                self.pending.append(((int(root), str(rel)), self.lines))
            elif "skip" in obj:  # fleet gave it up before its first frame (changed, unreadable)
                root, rel = obj["skip"]
                self.pending = [p for p in self.pending if p[0] != (int(root), str(rel))]
            elif "touch" in obj:
                self.touch.append(obj["touch"])
            elif "end" in obj:
                self.ended = True
            self.cond.notify_all()

    def head(self, root: int, rel: str) -> Head | None:
        """fleet's word on the file a relayed frame begins, in stream order: None where it is
        not the next file fleet sends. Where the next one fleet announced is another, any line
        of fleet's after that announcement but its "skip" says fleet sent that other one: the
        frame is not fleet's, at once (not after WORD_S)."""
        key = (root, rel)

        def told() -> bool:
            if self.ended or (self.pending and self.pending[0][0] == key):
                return True
            return bool(self.pending) and self.lines > self.pending[0][1]
        with self.cond:
            self.cond.wait_for(told, WORD_S)
            if not self.pending or self.pending[0][0] != key:
                return None
            self.pending.pop(0)
            return self.heads.get(key)

    def check(self, root: int, rel: str, frame: Json) -> Head:
        """fleet's word on a relayed file, the frame that began it (F) checked against it: what
        to apply. Tampered where the frame does not say what fleet said of it (size, mode,
        time, blocks or writers), or fleet sends no such file."""
        said = self.head(root, rel)
        if said is None:
            raise Tampered(f"{rel}: relayed, but fleet sends no such file next")
        got = (frame.get("size"), frame.get("mode"), frame.get("mtime"), frame.get("blocks"),
               frame.get("for"))
        if not _same(list(got), list(said)):
            raise Tampered(f"{rel}: relayed as {_told(got)}; fleet sent {_told(said)}")
        return said

    def sha(self, root: int, rel: str) -> str | None:
        with self.cond:
            self.cond.wait_for(lambda: (root, rel) in self.shas or self.ended, WORD_S)
            return self.shas.get((root, rel))

    def touches(self) -> list[Json]:
        with self.cond:
            self.cond.wait_for(lambda: self.ended, WORD_S)
            return list(self.touch)


def _same(got: object, said: object) -> bool:
    """A frame's value is fleet's: the same ints (a bool is no int here), or both None."""
    if isinstance(said, list):
        return isinstance(got, list) and len(got) == len(said) and all(
            _same(got[i], said[i]) for i in range(len(said)))
    if said is None:
        return got is None
    return isinstance(got, int) and not isinstance(got, bool) and got == said


def _shown(v: object, fmt: Callable[[int], str] = str) -> str:
    """A value from a relayed frame, short (it is another node's, of any type and length)."""
    return fmt(v) if isinstance(v, int) and not isinstance(v, bool) else repr(v)[:24]


def _told(h: Sequence[object]) -> str:
    """A file's size, mode, time, blocks and writers, short."""
    size, mode, mtime, blocks, writers = h
    return (f"size {_shown(size)}, mode {_shown(mode, oct)}, time {_shown(mtime)}, blocks "
            f"{'all' if blocks is None else repr(blocks)[:40]}, writers {repr(writers)[:40]}")
