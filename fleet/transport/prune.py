"""What an earlier sync left in a node's code directory that is no longer synced (deleted here,
or now ignored): fleet keeps there the list of files it synced (`.fleet-files`), and removes
only those of them that are not synced now and are still as fleet left them (same size and
time); whatever the job wrote there, or changed since, stays. Pure, but for the listing line."""

from __future__ import annotations

import json
import posixpath

from fleet.shell import quote, sh
from fleet.transport.sync import Entry, Manifest, same_time

FILES = ".fleet-files"  # in the code directory: what the last sync put there, as JSON
REMOVE = ".fleet-remove.sh"  # in the code directory, for the length of one unpack
MARK = "#was"
NAMES_PER_LINE = 64


def listing_lines(code_dir: str) -> list[str]:
    """Lines for transport.sync.listing_script: the record after a `#was` line (nothing where
    there is none yet)."""
    return [f"echo '{MARK}'", sh("cat", f"{code_dir}/{FILES}") + " 2>/dev/null; echo"]


def parse_was(out: str) -> Manifest:
    """The record read back (the line after a listing's `#was` line): relative path -> (size,
    mtime ns). A node's text names files to remove there, so only safe relative paths count
    (no absolute path, no `..`, no empty part) with two whole numbers; anything else is
    dropped, and output that is not the record gives an empty one."""
    lines = out.splitlines()
    at = lines.index(MARK) if MARK in lines else len(lines)
    try:
        said = json.loads(lines[at + 1]) if at + 1 < len(lines) and lines[at + 1] else {}
    except ValueError:
        return {}
    if not isinstance(said, dict):
        return {}
    return {rel: (meta[0], meta[1]) for rel, meta in said.items()
            if safe(rel) and isinstance(meta, list) and len(meta) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in meta)}


def safe(rel: object) -> bool:
    """A path that stays inside the directory it is relative to."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def record(now: Manifest) -> bytes:
    """The record of this sync: every file synced, with the size and time it has on the node."""
    return json.dumps({rel: list(meta) for rel, meta in sorted(now.items())},
                      separators=(",", ":")).encode()


def stale(was: Manifest, now: Manifest, there: Manifest) -> list[str]:
    """The files the last sync put there that this one does not send, which the node still
    holds as that sync left them."""
    def untouched(rel: str) -> bool:
        held, left = there.get(rel), was[rel]
        return held is not None and held[0] == left[0] and same_time(held[1], left[1])

    return sorted(rel for rel in was if rel not in now and untouched(rel))


def bytecode(rels: list[str], there: Manifest) -> list[str]:
    """The cached bytecode, on the node, of the .py files among rels (pkg/__pycache__/a.*.pyc):
    without its source Python ignores it, but it would be stale if the file came back."""
    stems = [posixpath.join(posixpath.dirname(r), "__pycache__", posixpath.basename(r)[:-3])
             + "." for r in rels if r.endswith(".py")]
    return sorted(p for p in there if p.endswith(".pyc")
                  and any(p.startswith(s) and "/" not in p[len(s):] for s in stems))


def removal_script(code_dir: str, rels: list[str], there: Manifest) -> str:
    """A sh script that removes rels (and their bytecode) from code_dir, then each directory
    they leave empty, deepest first (a directory left behind would still import as a
    namespace package); it never fails the launch."""
    files = rels + bytecode(rels, there)
    dirs: set[str] = set()
    for rel in files:
        parent = posixpath.dirname(rel)
        while parent:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    paths = [f"{code_dir}/{r}" for r in files]
    lines = ["rm -f -- " + " ".join(quote(p) for p in paths[i:i + NAMES_PER_LINE])
             for i in range(0, len(paths), NAMES_PER_LINE)]
    lines += [f"rmdir -- {quote(f'{code_dir}/{d}')} 2>/dev/null"
              for d in sorted(dirs, key=lambda d: (-d.count("/"), d))]
    return "\n".join([*lines, "exit 0", ""])


def entries(code_dir: str, now: Manifest, rels: list[str],
            there: Manifest) -> tuple[list[Entry], tuple[str, ...]]:
    """What a sync adds to the code directory's bundle: the new record and, where files are
    stale (rels), the script that removes them, with the paths transport.sync.send runs after
    unpacking."""
    out = [Entry(f"{code_dir}/{FILES}", 0o644, data=record(now))]
    if not rels:
        return out, ()
    script = f"{code_dir}/{REMOVE}"
    out.append(Entry(script, 0o600, data=removal_script(code_dir, rels, there).encode()))
    return out, (script,)
