"""Syncs local directories to a node: what changed, with the run's files, in one verified tar."""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import posixpath
import stat
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import WorkdirError
from fleet.nodedata import number
from fleet.shell import AND, quote, sh
from fleet.transport.base import Transport
from fleet.transport.ignore import NOTIFY, PULLED, Ignores, ignores, keeps_notify

Manifest = dict[str, tuple[int, int]]  # relative path -> (size, mtime in nanoseconds)
NS = 10**9


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


SPARSE_MIN = 1 << 20  # a file this large, with under half of it on disk, is called sparse


@dataclass(frozen=True)
class Scan:
    """What a local directory sends, by the rules in scan(): per relative path the file read
    (a link's target) with its size and mtime, and what is not sent, with why."""

    root: Path
    files: dict[str, Path]
    manifest: Manifest
    skipped: tuple[tuple[str, str], ...] = ()
    sparse: tuple[str, ...] = ()
    ignored: tuple[tuple[str, str], ...] = ()  # (path, the file that leaves it out); dirs end in /


def scan(root: Path, exclude: tuple[str, ...], ignore_files: bool = False,
         never: tuple[str, ...] = ()) -> Scan:
    """The files of a directory fleet sends, one rule per kind (docs/JOBS.md, What is synced):
    what .gitignore and .fleetignore leave out (with `ignore_files`: a workdir), a folder below
    root that `fleet pull` marked (PULLED), a TOML file holding a `[notify]` (a link judged by
    its target too) and a file whose real path is in `never` (the job file): named in `ignored`.
    Regular files are sent; a link inside root is followed (sent under its name); a link out of
    root, a dangling link, a link to a directory that holds it and special files: named in
    `skipped`; a sparse file is sent whole (`sparse`); an unreadable file stops everything."""
    top = os.path.realpath(root)
    files: dict[str, Path] = {}
    meta: Manifest = {}
    skipped: list[tuple[str, str]] = []
    sparse: list[str] = []
    unreadable: list[str] = []
    ignored: list[tuple[str, str]] = []
    rules: Ignores | None = ignores(root) if ignore_files else None

    def left_out(rel: str, is_dir: bool) -> bool:
        """Ignored, and named so (a directory where .fleetignore may send a file is walked)."""
        why = rules.why(rel, is_dir) if rules is not None else None
        if why is None or (is_dir and rules is not None and rules.reincludes):
            return False
        ignored.append((rel + "/" if is_dir else rel, why))
        return True

    def inside(real: str) -> bool:
        return real == top or real.startswith(top.rstrip("/") + "/")

    def walk(real_dir: str, rel_dir: str) -> None:
        try:
            entries = sorted(os.scandir(real_dir), key=lambda e: e.name)
        except OSError as e:
            unreadable.append(f"{rel_dir or '.'}/ ({e.strerror})")
            return
        if rel_dir and any(e.name == PULLED for e in entries):  # `fleet pull`'s results
            ignored.append((rel_dir + "/", PULLED))
            return
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if excluded(rel, exclude):
                continue
            path = os.path.join(real_dir, entry.name)
            try:
                st = os.lstat(path)
            except OSError as e:
                unreadable.append(f"{rel} ({e.strerror})")
                continue
            link = stat.S_ISLNK(st.st_mode)
            if link:
                target = os.path.realpath(path)
                if not os.path.exists(target):
                    skipped.append((rel, f"a dangling link (to {os.readlink(path)})"))
                    continue
                if not inside(target):
                    skipped.append((rel, f"a link to {target}, outside {root}"))
                    continue
                try:
                    st = os.stat(target)
                except OSError as e:
                    unreadable.append(f"{rel} ({e.strerror})")
                    continue
                path = target
            if stat.S_ISDIR(st.st_mode):
                real = os.path.realpath(path)
                if link and (real_dir == real or real_dir.startswith(real.rstrip("/") + "/")):
                    skipped.append((rel, "a link to a directory that holds it (a loop)"))
                    continue
                if not left_out(rel, True):
                    walk(real, rel)
            elif stat.S_ISREG(st.st_mode) and left_out(rel, False):
                continue
            elif stat.S_ISREG(st.st_mode) and (
                    path in never or keeps_notify(rel, path)  # path: real already
                    or (link and keeps_notify(os.path.basename(path), path))):
                ignored.append((rel, NOTIFY))
                continue
            elif stat.S_ISREG(st.st_mode):
                if not os.access(path, os.R_OK):
                    unreadable.append(f"{rel} (permission denied)")
                    continue
                files[rel] = Path(path)
                meta[rel] = (st.st_size, st.st_mtime_ns)
                if st.st_size >= SPARSE_MIN and st.st_blocks * 512 < st.st_size // 2:
                    sparse.append(rel)
            else:
                skipped.append((rel, f"{_kind(st.st_mode)}: only regular files are sent"))

    walk(top, "")
    if unreadable:
        shown = ", ".join(unreadable[:5]) + (f" and {len(unreadable) - 5} more"
                                             if len(unreadable) > 5 else "")
        raise WorkdirError(f"{root}: cannot read {shown}; make them readable, or leave them "
                           "out with `exclude = [...]` in the job (nothing was started)")
    return Scan(root, files, meta, tuple(skipped), tuple(sparse), tuple(ignored))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device")):
        if test(mode):
            return name
    return "a special file"


def local_manifest(root: Path, exclude: tuple[str, ...]) -> Manifest:
    return scan(root, exclude).manifest


def manifest_script(dest: str) -> str:
    return sh("mkdir", "-p", dest) + f" {AND} " + sh("cd", dest) + f" {AND} " + \
        sh("find", ".", "-type", "f", "-printf", r"%P\t%s\t%T@\n")


def parse_manifest(out: str) -> Manifest:
    """`path<TAB>size<TAB>mtime` lines (find's `%T@`: seconds, a point, the fraction); anything
    else (there should be nothing) is skipped."""
    found: Manifest = {}
    for line in out.splitlines():
        parts = line.split("\t")
        size = number(parts[1]) if len(parts) == 3 else None
        mtime = time_ns(parts[2]) if len(parts) == 3 else None
        if size is not None and mtime is not None:
            found[parts[0]] = (size, mtime)
    return found


def time_ns(text: str) -> int | None:
    """`1763945123.1234567890` (or whole seconds) as nanoseconds; None if it is not that."""
    secs, _, frac = text.partition(".")
    whole = number(secs)
    if whole is None or not (frac.isascii() and (frac.isdigit() or frac == "")):
        return None
    return whole * NS + int((frac + "0" * 9)[:9])


def same_time(a: int, b: int) -> bool:
    """Equal times, to the precision of the coarser side: a filesystem that keeps whole seconds
    (some NFS, FAT) is compared to the second, any other to the nanosecond (an edit within the
    second of the last sync is a change)."""
    if a % NS == 0 or b % NS == 0:
        return a // NS == b // NS
    return a == b


# ---- one bundle per node: every file of a launch in one tar, one listing before it -----------
def listing_script(dirs: list[str], private: tuple[str, ...] = (),
                   make: tuple[str, ...] = (), then: tuple[str, ...] = ()) -> str:
    """One round trip: create the directories (`private` ones 0700), and list each of `dirs`,
    each listing after a `#dir N` line (see parse_listing); `then`, lines whose output follows
    an `#end` line (transport.prune's record)."""
    lines = [sh("mkdir", "-p", "-m", "700", *private)] if private else []
    if make or dirs:
        lines.append(sh("mkdir", "-p", *make, *dirs))
    for i, d in enumerate(dirs):
        lines.append(f"echo '#dir {i}'")
        lines.append(f"( {manifest_script(d)} )")
    if then:
        lines += ["echo '#end'", *then]
    return "\n".join(lines) if lines else "true"


def parse_listing(out: str, count: int) -> list[Manifest]:
    """Per listed directory its manifest (parse_manifest), in order."""
    parts: list[list[str]] = [[] for _ in range(count)]
    at = -1
    for line in out.splitlines():
        if line.startswith("#dir ") and (n := number(line[5:], count)) is not None:
            at = n
        elif line == "#end":
            at = -1
        elif 0 <= at < count:
            parts[at].append(line)
    return [parse_manifest("\n".join(p)) for p in parts]


def changed(local: Manifest, remote: Manifest) -> list[str]:
    """Files whose size or time differ there (or that are not there)."""
    def differs(rel: str, meta: tuple[int, int]) -> bool:
        there = remote.get(rel)
        return there is None or there[0] != meta[0] or not same_time(meta[1], there[1])
    return sorted(rel for rel, meta in local.items() if differs(rel, meta))


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


class _Hashing(io.RawIOBase):
    """A file read once: what tar takes from it is hashed on the way (the manifest records the
    bytes sent, not the file as it is later)."""

    def __init__(self, f: io.BufferedReader) -> None:
        self.f, self.h = f, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def bundle(entries: list[Entry], root: str) -> tuple[bytes, dict[str, str]]:
    """A gzip tar of the entries, paths relative to root; local files keep their mtime (the
    next listing compares it), made ones get now. With it, the sha256 of each local file's
    bytes as they went in, by destination. A file that shrank while it was read stops the
    launch (WorkdirError); one that grew is sent as long as it was when its header was
    written, and its hash is of exactly those bytes."""
    buf = io.BytesIO()
    now = int(time.time())
    sent: dict[str, str] = {}
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for e in entries:
            name = posixpath.relpath(e.dest, root)
            if e.source is not None:
                with open(e.source, "rb") as f:
                    info = tar.gettarinfo(arcname=name, fileobj=f)
                    info.mode = e.mode if e.mode else info.mode
                    # The time to the nanosecond (GNU tar sets it from the pax header), so that
                    # the next listing sees an edit made within the same second
                    ns = os.fstat(f.fileno()).st_mtime_ns
                    info.mtime = ns // NS
                    info.pax_headers = {**info.pax_headers, "mtime": f"{ns // NS}.{ns % NS:09d}"}
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    reader = _Hashing(f)
                    try:
                        tar.addfile(info, reader)
                    except OSError as err:
                        raise WorkdirError(
                            f"{e.source}: changed while fleet read it ({err}); start again "
                            "once it is written") from err
                    sent[e.dest] = reader.h.hexdigest()
            else:
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(e.data), e.mode, now
                tar.addfile(info, io.BytesIO(e.data))
    return buf.getvalue(), sent


def code_entries(root: Path | Scan, dest: str, rels: list[str]) -> list[Entry]:
    """The changed files of a synced directory (or of a scan of it: links followed), with
    their local modes."""
    def source(rel: str) -> Path:
        return root.files[rel] if isinstance(root, Scan) else root / rel

    return [Entry(f"{dest}/{rel}", os.stat(source(rel)).st_mode & 0o7777, source=source(rel))
            for rel in rels]


def send(t: Transport, entries: list[Entry], tag: str,
         after: tuple[str, ...] = ()) -> dict[str, str]:
    """The entries to the node in one verified bundle, unpacked in place: two round trips (the
    file, then one command that checks it whole and unpacks it), whatever their number; once
    unpacked, the sh scripts among them named in `after` run, and go. The sha256 of every
    local file's bytes as sent, by destination."""
    root = bundle_root(entries)
    name = f"{root}/.fleet-bundle-{tag}.tar.gz"
    data, sent = bundle(entries, root)
    stale = "".join(f"; rm -f {pyc}" for pyc in stale_bytecode([e.dest for e in entries]))
    run = "".join(f"; [ $s -ne 0 ] || sh {quote(p)}; rm -f {quote(p)}" for p in after)
    t.write(name, data, 0o600, what=f"unpack into {root}",
            then=f"tar -xzpf {quote(name)} --no-same-owner -C {quote(root)}; s=$?; "
                 f"rm -f {quote(name)}{stale}{run}; exit $s")
    return sent


def stale_bytecode(dests: list[str]) -> list[str]:
    """Per replaced .py file, the shell glob of its cached bytecode: Python trusts a .pyc
    whose source has the same size and the same mtime in whole seconds, so an edit of the same
    length within the second of the last sync would run the old code."""
    out = []
    for d in dests:
        if d.endswith(".py"):
            head, _, stem = d[:-3].rpartition("/")
            out.append(quote(f"{head}/__pycache__/{stem}.") + "*.pyc")
    return out
