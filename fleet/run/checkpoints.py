"""What fleet saw of a run's checkpoints (`[restart] checkpoints`), kept on this machine as it
happens (checkpoints.json in the run's record): each settled file, the job's own mtime when fleet
saw it settle, its sha256 and the nodes that hold it; and, pure, what to copy where and what to
prune after a poll, and which file a new attempt resumes from. The newest is decided from this
record, never re-derived from a node that may be gone."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleet.facts.checkpoints import Seen
from fleet.run.record import write_atomic

FILE = "checkpoints.json"


@dataclass
class Kept:
    """One checkpoint file as fleet saw it settle on the node that wrote it."""

    rel: str  # under the job's directory: ckpt/epoch=3.ckpt
    size: int
    mtime_ns: int
    writer: str
    sha256: str = ""  # once copied (both ends hashed it)
    holders: list[str] = field(default_factory=list)  # the writer and fleet's copies

    @property
    def seen(self) -> Seen:
        return Seen(self.size, self.mtime_ns)


@dataclass(frozen=True)
class Copy:
    """A file to copy: from the node that holds it to the nodes that lack it."""

    kept: Kept
    source: str
    targets: tuple[str, ...]


def load(run_dir: Path) -> dict[str, Kept]:
    """The record (rel -> Kept); empty where there is none, or where it does not read as one
    (fleet's own file: the next poll writes it again)."""
    try:
        data = json.loads((run_dir / FILE).read_text())
        return {k["rel"]: Kept(**k) for k in data["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save(run_dir: Path, kept: dict[str, Kept]) -> None:
    if run_dir.is_dir():
        files: list[dict[str, Any]] = [asdict(k) for k in sorted(
            kept.values(), key=lambda k: k.mtime_ns)]
        write_atomic(run_dir / FILE, json.dumps({"files": files}, indent=2) + "\n")


def fresh(kept: dict[str, Kept], settled: dict[str, dict[str, Seen]],
          listings: dict[str, dict[str, Seen]]) -> list[Copy]:
    """The copies one poll calls for, newest file first (a job that prunes fast may prune an
    older one before its turn): each file settled on a node (`settled`, per node) that fleet
    has not copied yet at that size and mtime goes from that node to every other listed node
    (`listings`) that lacks it, or holds a version fleet placed there itself (an older
    `last.ckpt`); a node holding a version of its own is never written over. The record gets
    each new file (its writer and holders), even where no node lacks it; one whose copy failed
    is asked for again by the next poll."""
    copies: list[Copy] = []
    new: dict[str, tuple[str, Seen]] = {}
    for node in sorted(settled):
        for rel, seen in settled[node].items():
            k = kept.get(rel)
            if (k is None or k.seen != seen or not k.sha256) and rel not in new:
                new[rel] = (node, seen)
    for rel, (writer, seen) in sorted(new.items(), key=lambda kv: -kv[1][1].mtime_ns):
        before = kept.get(rel)
        if before is not None and before.seen == seen:
            writer = before.writer
        holders = [n for n, files in sorted(listings.items()) if files.get(rel) == seen]
        targets = tuple(n for n, files in sorted(listings.items()) if n not in holders and (
            rel not in files or (before is not None and files[rel] == before.seen
                                 and n in before.holders)))
        kept[rel] = Kept(rel, seen.size, seen.mtime_ns, writer,
                         holders=holders or [writer]) if before is None or before.seen != seen \
            else before
        if targets:
            copies.append(Copy(kept[rel], writer if writer in holders or not holders
                               else holders[0], targets))
    return copies


def pruned(kept: dict[str, Kept], listings: dict[str, dict[str, Seen]]
           ) -> dict[str, list[str]]:
    """What the job pruned of its own, to prune of fleet's copies (rel -> the nodes whose copy
    goes), each dropped from the record: a file that the node writing the newest checkpoint
    held, and holds no longer. A copy of the same file elsewhere goes only where a listing
    shows it as fleet placed it. A holder whose copy is gone otherwise is only forgotten."""
    if not kept:
        return {}
    newest = max(kept.values(), key=lambda k: k.mtime_ns)
    writer = listings.get(newest.writer)
    out: dict[str, list[str]] = {}
    for rel, k in list(kept.items()):
        if k is newest:
            continue
        if writer is not None and newest.writer in k.holders and rel not in writer:
            out[rel] = [n for n in k.holders if n != newest.writer and
                        listings.get(n, {}).get(rel) == k.seen]
            del kept[rel]
            continue
        k.holders = [n for n in k.holders if n not in listings or listings[n].get(rel) == k.seen]
    return out


def newest_held(kept: dict[str, Kept], listings: dict[str, dict[str, Seen]]
                ) -> tuple[Kept | None, list[str]]:
    """The newest file fleet recorded (by the job's own mtime as fleet saw it settle) that a
    listed node still holds at that size and mtime, and the nodes that hold it."""
    for k in sorted(kept.values(), key=lambda k: k.mtime_ns, reverse=True):
        holders = [n for n, files in sorted(listings.items()) if files.get(k.rel) == k.seen]
        if holders:
            return k, holders
    return None, []
