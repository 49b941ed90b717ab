"""What a transfer moves, pure: whether a node's changes are streamed at all, what each node
holds and lacks (block by block), the moves of the stream, the relay's chains, and what each
node got."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fleet.nodedata import number
from fleet.nodeside import ferry
from fleet.shell import quote
from fleet.transport.sync import Manifest, Scan
from fleet.transport.transfer.agent import agent

# ---- 0. whether a node's changes are streamed at all -------------------------------------------
BUNDLE_MAX = 8 << 20  # a node's changes up to this size go in its one bundle (transport.sync.send)


def streams(changed_bytes: int, resumes: bool) -> bool:
    """A node's changes are streamed when they are larger than BUNDLE_MAX, or when a partial
    file of an interrupted transfer is there to resume; else they go in its one bundle, with
    the run's own files (one round trip, no receiver to start)."""
    return changed_bytes > BUNDLE_MAX or resumes


# ---- 1. what each node lacks --------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """What a node holds of a file: its partial file's pieces ("part") or the file's ("file")."""

    kind: str
    size: int
    sha: str
    blocks: tuple[str, ...]


def hash_script(python: str, root: str, rels: list[str], whole_sha: bool = True) -> str:
    """`ferry hash`; without `whole_sha`, the block digests only (half the hashing: what a
    push compares, see need)."""
    return agent(python, f"hash {quote(root)}" + ("" if whole_sha else " blocks"),
                 json.dumps(rels))


def parse_held(out: str, asked: set[str]) -> dict[str, Held]:
    """`ferry hash`'s lines; a line for a path not asked, or malformed, is skipped."""
    held: dict[str, Held] = {}
    d = ferry.DIGEST_HEX
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) != 5:
            continue
        try:
            rel = json.loads(parts[0])
        except ValueError:
            continue
        size = number(parts[2])
        blocks = parts[4]
        if (not isinstance(rel, str) or rel not in asked or parts[1] not in ("part", "file")
                or size is None or len(parts[3]) not in (0, 64) or len(blocks) % d
                or len(blocks) // d != ferry.blocks_of(size)):
            continue
        held[rel] = Held(parts[1], size, parts[3],
                         tuple(blocks[i:i + d] for i in range(0, len(blocks), d)))
    return held


@dataclass(frozen=True)
class Dir:
    """One synced directory: what is sent (a scan of it), and per node its absolute path there,
    its listing, and the files it gets through the transfer."""

    scan: Scan
    roots: dict[str, str]
    there: dict[str, Manifest]
    rels: dict[str, list[str]]


def held_script(python: str, asks: list[tuple[str, list[str]]]) -> str:
    """One round trip: `ferry hash` of each (root, paths), each after a `#dir N` line."""
    lines = []
    for i, (root, rels) in enumerate(asks):
        lines.append(f"echo '#dir {i}'")
        lines.append(hash_script(python, root, rels, whole_sha=False))
    return "\n".join(lines)


def parse_helds(out: str, asks: list[tuple[str, list[str]]]) -> list[dict[str, Held]]:
    parts: list[list[str]] = [[] for _ in asks]
    at = -1
    for line in out.splitlines():
        if line.startswith("#dir ") and (n := number(line[5:], len(asks))) is not None:
            at = n
        elif 0 <= at < len(asks):
            parts[at].append(line)
    return [parse_held("\n".join(p), set(asks[i][1])) for i, p in enumerate(parts)]


@dataclass(frozen=True)
class Local:
    """A file here, as the stream sends it."""

    rel: str
    path: Path
    size: int
    mtime_ns: int
    mode: int
    sha: str | None = None  # known only where a node holds a version to compare with
    blocks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Need:
    """What one node needs of one file: nothing, its time only ("touch"), some blocks, or all
    (blocks None)."""

    touch: bool = False
    blocks: tuple[int, ...] | None = None


def need(local: Local, held: Held | None) -> Need:
    if held is None or local.blocks is None:
        return Need()
    # Every block's digest the same (128 bits of sha256 each): the same bytes. The node's whole
    # sha256 would say no more (a node can lie about either) and cost a second pass there.
    if held.kind == "file" and held.size == local.size and held.blocks == local.blocks:
        return Need(touch=True)
    return Need(blocks=tuple(i for i, b in enumerate(local.blocks)
                             if i >= len(held.blocks) or held.blocks[i] != b))


def candidates(rels: list[str], there: Manifest) -> list[str]:
    """Of the changed files, those the node holds something of (the file, a partial one)."""
    return [r for r in rels if r in there or ferry.part_name(r) in there]


@dataclass(frozen=True)
class Move:
    """One file of the stream: the blocks sent (None: all) and who writes or only touches it."""

    root: int
    local: Local
    blocks: tuple[int, ...] | None
    writers: tuple[int, ...]
    touchers: tuple[int, ...]


def plan_moves(files: list[tuple[int, Local, dict[int, Need]]]) -> list[Move]:
    """Per file, what the stream carries: the union of what its writers need (every block if
    any needs every block; each writer takes the others from what it holds)."""
    moves = []
    for root, local, needs in files:
        writers = tuple(sorted(n for n, nd in needs.items() if not nd.touch))
        touchers = tuple(sorted(n for n, nd in needs.items() if nd.touch))
        if not writers and not touchers:
            continue
        blocks: tuple[int, ...] | None = ()
        for n in writers:
            nb = needs[n].blocks
            blocks = None if nb is None or blocks is None else tuple(sorted({*blocks, *nb}))
        moves.append(Move(root, local, blocks, writers, touchers))
    return moves


def moved_bytes(m: Move) -> int:
    if m.blocks is None:
        return m.local.size
    return sum(ferry.block_len(m.local.size, i) for i in m.blocks)


# ---- 2. the route -------------------------------------------------------------------------------
def chains(order: list[str], linked: dict[str, bool]) -> list[list[str]]:
    """The nodes in order, cut after every node whose link to the next failed."""
    out: list[list[str]] = []
    for name in order:
        if out and linked.get(out[-1][-1], False):
            out[-1].append(name)
        else:
            out.append([name])
    return out


# ---- what each node got ------------------------------------------------------------------------
@dataclass(frozen=True)
class Moved:
    """What one node got of one synced directory: files written, the bytes sent for them,
    the bytes of them it already held (verified, kept), files only touched."""

    files: int = 0
    sent: int = 0
    kept: int = 0
    touched: int = 0


def moved_per_node(moves: list[Move]) -> dict[tuple[int, int], Moved]:
    """(node index, root) -> Moved. A writer writes every block the stream carries for its
    file (the union of what its writers need), and keeps the rest from what it holds."""
    out: dict[tuple[int, int], Moved] = {}
    for mv in moves:
        sent = moved_bytes(mv)
        for i in mv.writers:
            m = out.get((i, mv.root), Moved())
            out[(i, mv.root)] = Moved(m.files + 1, m.sent + sent,
                                      m.kept + mv.local.size - sent, m.touched)
        for i in mv.touchers:
            m = out.get((i, mv.root), Moved())
            out[(i, mv.root)] = Moved(m.files, m.sent, m.kept, m.touched + 1)
    return out
