"""fleet's word to a node the stream reaches through another node, over its own connection."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import IO

from fleet.nodeside.ferry.frames import Json

WORD_S = 120.0  # how long a relayed file waits, at its end, for fleet's word on it


class Word:
    """What fleet says to a node that the stream reaches through another node: the sha256 of
    each file as fleet read it, and the files only to touch, over the node's own SSH
    connection (its stdin). A relayed stream is data from another node: what it carries
    replaces a file only if fleet's word agrees, and its T frames are not obeyed. Its stdin
    ending (fleet gone, or stopping it) ends the node's receiver at once."""

    def __init__(self, stdin: IO[bytes]) -> None:
        self.stdin = stdin
        self.cond = threading.Condition()
        self.shas: dict[tuple[int, str], str] = {}
        self.touch: list[Json] = []
        self.ended = False

    def listen(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in self.stdin:
                obj = json.loads(line)
                with self.cond:
                    if "sha" in obj:
                        root, rel, sha = obj["sha"]
                        self.shas[(int(root), str(rel))] = str(sha)
                    elif "touch" in obj:
                        self.touch.append(obj["touch"])
                    elif "end" in obj:
                        self.ended = True
                    self.cond.notify_all()
        os._exit(3)

    def sha(self, root: int, rel: str) -> str | None:
        with self.cond:
            self.cond.wait_for(lambda: (root, rel) in self.shas or self.ended, WORD_S)
            return self.shas.get((root, rel))

    def touches(self) -> list[Json]:
        with self.cond:
            self.cond.wait_for(lambda: self.ended, WORD_S)
            return list(self.touch)
