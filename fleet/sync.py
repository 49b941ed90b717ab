"""Syncs local directories to a node: what changed, with the run's own files, in one compressed
tar that the node verifies and unpacks in one command."""

from __future__ import annotations

import fnmatch
import io
import os
import posixpath
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import RemoteCommandError
from fleet.shell import AND, quote, sh
from fleet.transport import Transport

Manifest = dict[str, tuple[int, int]]  # relative path -> (size, mtime in whole seconds)


@dataclass(frozen=True)
class SyncStats:
    files: int  # files sent
    bytes: int  # their total size before compression
    unchanged: int


def excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    """A pattern matches any path component, or with a leading '/' a path from the root."""
    for pat in patterns:
        if pat.startswith("/"):
            if rel == pat[1:] or rel.startswith(pat[1:] + "/"):
                return True
        elif any(fnmatch.fnmatch(part, pat) for part in rel.split("/")):
            return True
    return False


def local_manifest(root: Path, exclude: tuple[str, ...]) -> Manifest:
    out: Manifest = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames
                       if not excluded(d if rel_dir == "." else f"{rel_dir}/{d}", exclude)]
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if excluded(rel, exclude):
                continue
            st = os.stat(os.path.join(dirpath, name))
            out[rel] = (st.st_size, int(st.st_mtime))
    return out


def manifest_script(dest: str) -> str:
    return sh("mkdir", "-p", dest) + f" {AND} " + sh("cd", dest) + f" {AND} " + \
        sh("find", ".", "-type", "f", "-printf", r"%P\t%s\t%T@\n")


def parse_manifest(out: str) -> Manifest:
    """`path<TAB>size<TAB>mtime` lines; anything else (there should be nothing) is skipped."""
    found: Manifest = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1].isdigit():
            try:
                found[parts[0]] = (int(parts[1]), int(float(parts[2])))
            except ValueError:
                continue
    return found


# ---- one bundle per node: every file of a launch in one tar, one listing before it -----------
def listing_script(dirs: list[str], private: tuple[str, ...] = (),
                   make: tuple[str, ...] = ()) -> str:
    """One round trip: create the directories (`private` ones 0700), and list each of `dirs`,
    each listing after a `#dir N` line (see parse_listing)."""
    lines = [sh("mkdir", "-p", "-m", "700", *private)] if private else []
    if make or dirs:
        lines.append(sh("mkdir", "-p", *make, *dirs))
    for i, d in enumerate(dirs):
        lines.append(f"echo '#dir {i}'")
        lines.append(f"( {manifest_script(d)} )")
    return "\n".join(lines) if lines else "true"


def parse_listing(out: str, count: int) -> list[Manifest]:
    """Per listed directory its manifest (parse_manifest), in order."""
    parts: list[list[str]] = [[] for _ in range(count)]
    at = -1
    for line in out.splitlines():
        if line.startswith("#dir ") and line[5:].strip().isdigit():
            at = int(line[5:].strip())
        elif 0 <= at < count:
            parts[at].append(line)
    return [parse_manifest("\n".join(p)) for p in parts]


def changed(local: Manifest, remote: Manifest) -> list[str]:
    return sorted(rel for rel, meta in local.items() if remote.get(rel) != meta)


@dataclass(frozen=True)
class Entry:
    """One file of a bundle: where it goes on the node, and its content (a local file's, or
    bytes made here) and mode."""

    dest: str
    mode: int
    source: Path | None = None
    data: bytes = b""


def bundle_root(entries: list[Entry]) -> str:
    """The deepest directory that holds every entry (the bundle is unpacked there)."""
    return posixpath.commonpath([posixpath.dirname(e.dest) for e in entries])


def bundle(entries: list[Entry], root: str) -> bytes:
    """A gzip tar of the entries, paths relative to root; local files keep their mtime (the
    next listing compares it), made ones get now."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for e in entries:
            name = posixpath.relpath(e.dest, root)
            if e.source is not None:
                info = tar.gettarinfo(str(e.source), arcname=name)
                info.mode = e.mode if e.mode else info.mode
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(e.source, "rb") as f:
                    tar.addfile(info, f)
            else:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(e.data), e.mode, now
                tar.addfile(info, io.BytesIO(e.data))
    return buf.getvalue()


def code_entries(root: Path, dest: str, rels: list[str]) -> list[Entry]:
    """The changed files of a synced directory, with their local modes."""
    return [Entry(f"{dest}/{rel}", os.stat(root / rel).st_mode & 0o7777, source=root / rel)
            for rel in rels]


def send(t: Transport, entries: list[Entry], tag: str) -> None:
    """The entries to the node in one verified bundle, unpacked in place: two round trips (the
    file, then one command that checks it whole and unpacks it), whatever their number."""
    root = bundle_root(entries)
    name = f"{root}/.fleet-bundle-{tag}.tar.gz"
    t.write(name, bundle(entries, root), 0o600, what=f"unpack into {root}",
            then=f"tar -xzpf {quote(name)} --no-same-owner -C {quote(root)}; s=$?; "
                 f"rm -f {quote(name)}; exit $s")


def sync_dir(t: Transport, root: Path, dest: str, exclude: tuple[str, ...],
             tag: str, local: Manifest | None = None) -> SyncStats:
    """Make `dest` on the node hold every file of `root` (extra files on the node are kept)."""
    local = local if local is not None else local_manifest(root, exclude)
    r = t.run(listing_script([dest]), what=f"list {dest}")
    if not r.ok:
        raise RemoteCommandError(t.host.name, f"list {dest}", r.code, r.err)
    rels = changed(local, parse_listing(r.out, 1)[0])
    if rels:
        send(t, code_entries(root, dest, rels), tag)
    return SyncStats(len(rels), sum(local[rel][0] for rel in rels), len(local) - len(rels))
