"""What a pull asks of a node, pure: the node's listing read strictly (`parse_listing`), per
file what to fetch (`wants`): nothing where the same bytes are here, only the blocks that
differ where a version or a partial file is, and the stream held to that (`Bound`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet.nodeside import ferry
from fleet.transport.transfer.plan import Held
from fleet.transport.transfer.report import human


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
        """As `ferry send` reads it: with the size listed, so that a file that changed since
        is left out there rather than sent at another size."""
        if self.blocks is None:
            return {"path": self.rel, "size": self.size}
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


def safe(rel: object) -> str | None:
    """A name a node listed, where it is a safe relative path (ferry.safe_rel); else None."""
    try:
        return ferry.safe_rel(rel)
    except ferry.Bad:
        return None


def entries(out: str) -> Iterator[tuple[str, Any]]:
    """`ferry list`'s lines as (key, value), each a JSON object of one key; any other line
    (rc noise, a damaged line) is passed over."""
    for line in out.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and len(obj) == 1:
            yield next(iter(obj.items()))


def parse_listing(out: str, asked: list[str]) -> Listing:
    """`ferry list`'s lines, as from an untrusted node: a name that leaves the directory, lies
    under no path asked for, or is malformed is not taken (nor a line that is not one of
    ferry's: rc noise). No more than ferry.LIST_MAX files or left-out names are taken: a
    listing longer than that is `truncated`, whoever said so."""
    got = Listing()

    def under(rel: object) -> str | None:
        rel = safe(rel)
        return rel if rel is not None and any(rel == a or rel.startswith(a + "/")
                                              for a in asked) else None

    for key, value in entries(out):
        if key == "root" and isinstance(value, bool):
            got.root = value
        elif key == "truncated":
            got.truncated = True
        elif key == "missing" and value in asked and value not in got.missing:
            got.missing.append(value)
        elif (key == "skipped" and isinstance(value, list) and len(value) == 2
              and (rel := under(value[0]))):
            got.skipped[rel] = str(value[1])[:200]
        elif (key == "file" and isinstance(value, list) and len(value) == 3
              and (rel := under(value[0])) and type(value[1]) is int and value[1] >= 0):
            got.files[rel] = value[1]
        if len(got.files) > ferry.LIST_MAX or len(got.skipped) > ferry.LIST_MAX:
            got.truncated = True
            break
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


def too_big(wanted: list[Want], held: dict[str, int], free: int) -> list[str]:
    """Why the files asked for cannot fit in the destination's `free` bytes (none: they fit):
    each needs its listed size less what its partial file here (`held`, rel -> size) already
    holds. A node lists any size it likes, so a pull is refused before anything is fetched,
    naming the file, rather than found out when the disk fills."""
    needs = {w.rel: max(0, w.size - held.get(w.rel, 0)) for w in wanted}
    out = [f"{rel} is listed at {human(n)}, more than the {human(free)} free here"
           for rel, n in needs.items() if n > free]
    total = sum(needs.values())
    if not out and total > free:
        out.append(f"the {len(needs)} files to fetch are listed at {human(total)} in all, "
                   f"more than the {human(free)} free here")
    return out


class Overrun(ferry.Bad):
    """A node that sent more than it listed, or other than it was asked for."""


class Bound:
    """The stream a pull asked for, held to that frame by frame before any frame is applied:
    only the files asked for, each at most once, at the size it was listed, with the blocks
    asked; no more blocks than that, none longer than its place in the file; nothing that
    only a relay sends (a touch). Overrun, naming the file, at the first frame past it: what
    a node sends is bounded by what it listed, never by what it says next."""

    def __init__(self, wanted: list[Want]) -> None:
        self.wanted = {w.rel: w for w in wanted}
        self.begun: set[str] = set()
        self.f: Want | None = None
        # the blocks of self.f in order, and the index of the next to come: a range for a
        # whole file, so that a huge listed size costs nothing until its data comes
        self.blocks: Sequence[int] = ()
        self.next = 0

    def check(self, kind: bytes, payload: bytes) -> None:
        if kind == b"F":
            self._begin(payload)
        elif kind == b"D":
            w = self.f
            if w is None:
                raise ferry.Bad("data outside a file")
            if self.next >= len(self.blocks):
                raise Overrun(f"it sent more of {w.rel} than it listed ({human(w.bytes)} "
                              "asked for)")
            i = self.blocks[self.next]
            self.next += 1
            if len(payload) > ferry.block_len(w.size, i):
                raise Overrun(f"it sent more of {w.rel} than it listed (a block {i} of "
                              f"{human(len(payload))}, in a file listed at {human(w.size)})")
        elif kind in (b"E", b"X"):
            self.f = None
        elif kind == b"T":
            raise Overrun("it sent a change of a file's time and mode, which a pull never asks")
        elif kind == b"Z" and self.f is not None:
            raise ferry.Bad(f"the stream ended inside {self.f.rel}")

    def _begin(self, payload: bytes) -> None:
        if self.f is not None:
            raise ferry.Bad(f"a file began inside {self.f.rel}")
        try:
            h = json.loads(payload)
        except ValueError as e:
            raise ferry.Bad("broken stream (a file header that is not JSON)") from e
        rel = h.get("path") if isinstance(h, dict) else None
        w = self.wanted.get(rel) if isinstance(rel, str) else None
        if w is None:
            raise Overrun(f"it sent {str(rel)[:200]!r}, which was not asked for")
        if rel in self.begun:
            raise Overrun(f"it sent {w.rel} twice")
        size, blocks = h.get("size"), h.get("blocks")
        if size != w.size or type(size) is not int:
            shown = human(size) if type(size) is int and size >= 0 else repr(size)[:40]
            raise Overrun(f"it sent more than it listed: {w.rel} was listed at "
                          f"{human(w.size)}, and it began sending {shown}"
                          if type(size) is int and size > w.size else
                          f"it sent {w.rel} at {shown}, not the {human(w.size)} it listed")
        if blocks != (None if w.blocks is None else list(w.blocks)):
            raise Overrun(f"it sent blocks of {w.rel} that were not asked for")
        self.begun.add(w.rel)
        self.f = w
        self.blocks = range(ferry.blocks_of(w.size)) if w.blocks is None else w.blocks
        self.next = 0
