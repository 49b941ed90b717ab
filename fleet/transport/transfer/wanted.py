"""What a pull asks of a node, pure: the node's listing read strictly (`parse_listing`), and per
file what to fetch (`wants`): nothing where the same bytes are here, only the blocks that
differ where a version or a partial file is."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fleet.nodeside import ferry
from fleet.transport.transfer.plan import Held


@dataclass(frozen=True)
class Want:
    """A file to fetch: all of it (blocks None), or only these blocks, each checked on the
    node against the digest it was chosen by (`known`), the whole file then `sha`."""

    rel: str
    size: int
    blocks: tuple[int, ...] | None = None
    known: tuple[str, ...] = ()
    sha: str = ""

    def item(self) -> str | dict[str, Any]:
        """As `ferry send` reads it."""
        if self.blocks is None:
            return self.rel
        return {"path": self.rel, "size": self.size, "blocks": list(self.blocks),
                "known": list(self.known), "sha": self.sha}

    @property
    def bytes(self) -> int:
        """What crosses the link for it."""
        if self.blocks is None:
            return self.size
        return sum(ferry.block_len(self.size, i) for i in self.blocks)


@dataclass
class Listing:
    """What `ferry list` said: whether the directory is there, its files (rel -> size), the
    paths asked for that are not there, and what was left out (rel -> why)."""

    root: bool = False
    files: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    truncated: bool = False


def parse_listing(out: str, asked: list[str]) -> Listing:
    """`ferry list`'s lines, as from an untrusted node: a name that leaves the directory, lies
    under no path asked for, or is malformed is not taken (nor a line that is not one of
    ferry's: rc noise)."""
    got = Listing()

    def under(rel: object) -> str | None:
        try:
            rel = ferry.safe_rel(rel)
        except ferry.Bad:
            return None
        return rel if any(rel == a or rel.startswith(a + "/") for a in asked) else None

    for line in out.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or len(obj) != 1:
            continue
        (key, value), = obj.items()
        if key == "root" and isinstance(value, bool):
            got.root = value
        elif key == "truncated":
            got.truncated = True
        elif key == "missing" and (rel := under(value)):
            got.missing.append(rel)
        elif (key == "skipped" and isinstance(value, list) and len(value) == 2
              and (rel := under(value[0]))):
            got.skipped[rel] = str(value[1])[:200]
        elif (key == "file" and isinstance(value, list) and len(value) == 3
              and (rel := under(value[0])) and type(value[1]) is int and value[1] >= 0):
            got.files[rel] = value[1]
    return got


def wants(files: dict[str, int], here: dict[str, Held], there: dict[str, Held]
          ) -> tuple[list[Want], list[str]]:
    """(what to fetch, the files already here): `here` is what this machine holds of each file
    (the file, or the partial file an interrupted pull left: `ferry hash` of the destination),
    `there` the node's hashes of those files. A file here with the node's size and sha256 is
    not fetched; one held in part (or an older version) gets only the blocks whose digests
    differ; any other comes whole (one the node holds only partially, too)."""
    fetch: list[Want] = []
    same: list[str] = []
    for rel, size in sorted(files.items()):
        mine, theirs = here.get(rel), there.get(rel)
        if mine is None or theirs is None or theirs.kind != "file" or theirs.size != size:
            fetch.append(Want(rel, size))
        elif mine.kind == "file" and (mine.size, mine.sha) == (theirs.size, theirs.sha):
            same.append(rel)
        else:
            differ = tuple(i for i, d in enumerate(theirs.blocks)
                           if i >= len(mine.blocks) or mine.blocks[i] != d)
            fetch.append(Want(rel, size, differ, theirs.blocks, theirs.sha))
    return fetch, same
