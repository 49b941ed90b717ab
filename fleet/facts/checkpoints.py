"""A node's checkpoint directory (`[restart] checkpoints`), as fleet polls it while a run goes
on: one `ferry list` of it (the command) and a strict, pure parser of what the node said. Every
name, size and time comes from a node and is data: a name that leaves the directory, a link, a
size or time out of bounds, or a line that is not ferry's is not taken."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from fleet.nodeside import ferry
from fleet.shell import quote
from fleet.transport.transfer.agent import agent
from fleet.transport.transfer.wanted import entries, safe

SIZE_MAX = 1 << 42  # 4 TiB: a file listed larger is no checkpoint fleet copies
MTIME_MAX = 1 << 62  # nanoseconds since the epoch (year 2116): later is not a file's time
FILES_MAX = 10000  # files taken from one listing: a checkpoint directory holds far fewer


@dataclass(frozen=True)
class Seen:
    """A file as a listing showed it: its size and the job's own mtime (ns)."""

    size: int
    mtime_ns: int


@dataclass
class Listing:
    """What one node's checkpoint directory holds (rel under the job's directory -> Seen), and
    what was left out (rel -> why)."""

    there: bool = False  # whether the directory is there at all
    files: dict[str, Seen] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    truncated: bool = False


def command(python: str, job_dir: str, ckpt: str) -> str:
    """`ferry list` of job_dir/ckpt: names relative to job_dir, links never followed."""
    return agent(python, f"list {quote(job_dir)}", json.dumps([ckpt]))


def parse(out: str, ckpt: str) -> Listing:
    """`ferry list`'s lines, from an untrusted node: only regular files under `ckpt`, by a safe
    relative name, with a whole size from 0 to SIZE_MAX and a whole mtime from 0 to MTIME_MAX;
    no more than FILES_MAX of them (then `truncated`)."""
    got = Listing()

    def under(rel: object) -> str | None:
        rel = safe(rel)
        return rel if rel is not None and rel.startswith(ckpt + "/") and \
            ferry.part_of(rel) is None else None

    for key, value in entries(out):
        if key == "root" and isinstance(value, bool):
            got.there = value
        elif key == "missing" and value == ckpt:
            got.files.clear()
        elif key == "truncated":
            got.truncated = True
        elif (key == "skipped" and isinstance(value, list) and len(value) == 2
              and (rel := under(value[0]))):
            got.skipped[rel] = str(value[1])[:200]
        elif key == "file" and isinstance(value, list) and len(value) == 3 and \
                (rel := under(value[0])):
            size, mtime = value[1], value[2]
            if type(size) is int and type(mtime) is int and 0 <= size <= SIZE_MAX and \
                    0 <= mtime <= MTIME_MAX:
                got.files[rel] = Seen(size, mtime)
            else:
                got.skipped[rel] = "a size or time out of bounds"
        if len(got.files) >= FILES_MAX or len(got.skipped) >= FILES_MAX:
            got.truncated = True
            break
    return got


def settled(before: dict[str, Seen] | None, now: dict[str, Seen]) -> dict[str, Seen]:
    """The files that did not change between two polls (the same size and mtime in both): the
    job has finished writing them. Nothing before a first poll."""
    if before is None:
        return {}
    return {rel: s for rel, s in now.items() if before.get(rel) == s}
