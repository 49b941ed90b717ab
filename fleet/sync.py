"""Syncs a local directory to a node: one compressed tar of only the files that changed."""

from __future__ import annotations

import fnmatch
import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import RemoteCommandError
from fleet.shell import AND, sh
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


def remote_manifest(t: Transport, dest: str) -> Manifest:
    r = t.run(manifest_script(dest), what=f"list {dest}")
    if not r.ok:
        raise RemoteCommandError(t.host.name, f"list {dest}", r.code, r.err)
    return parse_manifest(r.out)


def sync_dir(t: Transport, root: Path, dest: str, exclude: tuple[str, ...],
             local: Manifest | None = None) -> SyncStats:
    """Make `dest` on the node hold every file of `root` (extra files on the node are kept)."""
    local = local if local is not None else local_manifest(root, exclude)
    remote = remote_manifest(t, dest)
    changed = sorted(rel for rel, meta in local.items() if remote.get(rel) != meta)
    if not changed:
        return SyncStats(0, 0, len(local))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for rel in changed:
            tar.add(root / rel, arcname=rel, recursive=False)
    bundle = f"{dest}/.fleet-sync.tar.gz"
    t.write(bundle, buf.getvalue(), 0o600)
    r = t.run(sh("tar", "-xzf", bundle, "-C", dest) + f" {AND} " + sh("rm", "-f", bundle))
    if not r.ok:
        raise RemoteCommandError(t.host.name, f"unpack into {dest}", r.code, r.err)
    return SyncStats(len(changed), sum(local[rel][0] for rel in changed),
                     len(local) - len(changed))
