"""fleet's word to a node the stream reaches through another node, over its own connection."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import IO, Callable  # noqa: UP035 - Python 3.8

from fleet.nodeside.ferry.frames import Bad, Json

WORD_S = 120.0  # how long a relayed file waits, at its end, for fleet's word on it


class Tampered(Bad):
    """A relayed frame that does not match fleet's word: the node that passed it on altered
    it (or made it up)."""


class Word:
    """What fleet says to a node that the stream reaches through another node, over the node's
    own SSH connection (its stdin): each file's size, mode and time before it is sent, its
    sha256 as fleet read it after, and the files only to touch. A relayed stream is data from
    another node: a file in it is written only if fleet named it with the same size, mode and
    time, and replaces the old one only if its hash is fleet's; what is applied (mode, time)
    is fleet's; its T frames are not obeyed. Its stdin ending (fleet gone, or stopping it)
    ends the node's receiver at once."""

    def __init__(self, stdin: IO[bytes]) -> None:
        self.stdin = stdin
        self.cond = threading.Condition()
        self.shas: dict[tuple[int, str], str] = {}
        self.heads: dict[tuple[int, str], tuple[int, int, int]] = {}  # size, mode, mtime
        self.touch: list[Json] = []
        self.ended = False

    def listen(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in self.stdin:
                self.take(json.loads(line))
        os._exit(3)

    def take(self, obj: Json) -> None:
        """One line of fleet's word."""
        with self.cond:
            if "sha" in obj:
                root, rel, sha = obj["sha"]
                self.shas[(int(root), str(rel))] = str(sha)
            elif "file" in obj:
                root, rel, size, mode, mtime = obj["file"]
                self.heads[(int(root), str(rel))] = (int(size), int(mode), int(mtime))
            elif "touch" in obj:
                self.touch.append(obj["touch"])
            elif "end" in obj:
                self.ended = True
            self.cond.notify_all()

    def head(self, root: int, rel: str) -> tuple[int, int, int] | None:
        """fleet's (size, mode, mtime) of a file it sends; None: fleet sends no such file."""
        with self.cond:
            self.cond.wait_for(lambda: (root, rel) in self.heads or self.ended, WORD_S)
            return self.heads.get((root, rel))

    def check(self, root: int, rel: str, size: object, mode: object, mtime: object) -> int:
        """The mode to give a relayed file, fleet's; Tampered where the frame that began it
        does not say what fleet said of it (or fleet sends no such file)."""
        said = self.head(root, rel)
        if said is None:
            raise Tampered(f"{rel}: relayed, but fleet sends no such file")
        if (size, mode, mtime) != said:
            raise Tampered(f"{rel}: relayed as size {_shown(size)}, mode {_shown(mode, oct)}, "
                           f"time {_shown(mtime)}; fleet sent size {said[0]}, mode "
                           f"{oct(said[1])}, time {said[2]}")
        return said[1]

    def sha(self, root: int, rel: str) -> str | None:
        with self.cond:
            self.cond.wait_for(lambda: (root, rel) in self.shas or self.ended, WORD_S)
            return self.shas.get((root, rel))

    def touches(self) -> list[Json]:
        with self.cond:
            self.cond.wait_for(lambda: self.ended, WORD_S)
            return list(self.touch)


def _shown(v: object, fmt: Callable[[int], str] = str) -> str:
    """A value from a relayed frame, short (it is another node's, of any type and length)."""
    return fmt(v) if isinstance(v, int) and not isinstance(v, bool) else repr(v)[:24]
