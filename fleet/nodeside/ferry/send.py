"""Sending: one file into the stream, its blocks read and hashed ahead, and `ferry send`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import stat
import sys
import threading
from typing import IO, Any, Callable, Iterable, Iterator  # noqa: UP035 - Python 3.8

from fleet.nodeside.ferry.frames import (
    _NOFOLLOW,
    BLOCK,
    Json,
    Write,
    block_len,
    blocks_of,
    digest,
    frame,
    meta,
    part_of,
    safe_rel,
    target,
)


class Changed(Exception):
    """A file that changed while it was sent."""


class Unreadable(Exception):
    """A file to send that could not be opened or read (here: not the stream's fault)."""


def send_file(write: Write, root: int, rel: str, path: str, size: int, mtime_ns: int, mode: int,
              blocks: list[int] | None, readers: list[int], known: list[str] | None = None,
              sha: str | None = None, sent: Callable[[int], None] | None = None) -> str:
    """One file into the stream through write(frame): the listed blocks (None: all), each
    checked against `known` (the digests it was chosen by) where given. Returns the sha256 of
    the whole file: computed here while it is read when every block goes, else `sha` (the
    hash the blocks were chosen by). Changed (after an X frame) if it changed meanwhile;
    sent(n) counts the bytes put in the stream."""
    header = {"root": root, "path": rel, "size": size, "mode": mode,
              "mtime": mtime_ns, "blocks": blocks, "for": readers}
    whole = hashlib.sha256() if blocks is None else None
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, its errors told apart
    except OSError as e:
        raise Unreadable(f"{path} ({e.strerror or e})") from e
    with f:
        st = os.fstat(f.fileno())
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            raise Changed(f"{path} changed after it was listed")
        write(meta(b"F", header))
        indices = range(blocks_of(size)) if blocks is None else blocks
        for _, data, same in _read_ahead(f.fileno(), indices, size, known, whole):
            if not same:
                write(meta(b"X", {"why": "changed"}))
                raise Changed(f"{path} changed while it was sent")
            write(frame(b"D", data))
            if sent is not None:
                sent(len(data))
        st = os.fstat(f.fileno())
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            write(meta(b"X", {"why": "changed"}))
            raise Changed(f"{path} changed while it was sent")
    done = whole.hexdigest() if whole is not None else (sha or "")
    write(meta(b"E", {"sha256": done}))
    return done


AHEAD = 2  # blocks read and hashed ahead of the one being sent


def _read_ahead(fd: int, indices: Iterable[int], size: int, known: list[str] | None,
                whole: Any) -> Iterator[tuple[int, bytes, bool]]:
    """(index, bytes, as expected) of each block, read and hashed (into `whole`, and against
    `known`) in a thread of its own while the caller sends the one before: hashing and the
    connection's encryption overlap. Memory: AHEAD blocks. The thread has ended when this
    generator has (closed early too)."""
    q: queue.Queue[Any] = queue.Queue(AHEAD)
    stop = threading.Event()

    def work() -> None:
        try:
            for i in indices:
                if stop.is_set():
                    return
                data = os.pread(fd, BLOCK, i * BLOCK)
                same = len(data) == block_len(size, i) and (
                    known is None or i >= len(known) or digest(data) == known[i])
                if same and whole is not None:
                    whole.update(data)
                q.put((i, data, same))
                if not same:
                    return
        except OSError as e:
            q.put(Unreadable(f"reading: {e.strerror or e}"))
            return
        q.put(None)

    th = threading.Thread(target=work, daemon=True)
    th.start()
    try:
        while True:
            item = q.get()
            if item is None:
                return
            if isinstance(item, Unreadable):
                raise item
            yield item
            if not item[2]:
                return
    finally:
        stop.set()
        while th.is_alive():
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.05)



def cmd_send(root: str, mark: str, items: list[Any]) -> int:
    """send ROOT MARK < [paths]: the files, as a stream on stdout after the MARK line (pulling
    from a node: the same frames the other way). An item is a path (the whole file), or
    {"path", "size", "blocks", "known", "sha"}: only those blocks, each checked against the
    digest it was chosen by (a resumed pull). A file that is not there, or changed since it was
    hashed or while it was read, is left out (the receiver sees which came)."""
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
    write(b"\n" + mark.encode() + b"\n")
    for item in items:
        want = item if isinstance(item, dict) else {"path": item}
        rel = safe_rel(want.get("path"))
        path = target(root, rel)
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat_regular(st.st_mode) or want.get("size", st.st_size) != st.st_size:
                continue
            send_file(write, 0, rel, path, st.st_size, st.st_mtime_ns, st.st_mode & 0o7777,
                      want.get("blocks"), [0], want.get("known"), want.get("sha"))
        except (OSError, Changed):
            continue
    out.write(frame(b"Z", b""))
    out.flush()
    return 0


def stat_regular(mode: int) -> bool:
    return mode & 0o170000 == 0o100000


LIST_MAX = 100000  # files listed for one pull: more is not a job's outputs


def cmd_list(root: str, rels: list[str], out: IO[str]) -> None:
    """list ROOT < [paths]: what a pull would take under ROOT, one JSON object a line: first
    {"root": whether ROOT is a directory}; then per regular file under each path (a file, or a
    directory walked without following links) {"file": [path, size, mtime_ns]}; a path not
    there: {"missing": path}; a link or anything but a file or directory: {"skipped": [path,
    why]}, never followed; beyond LIST_MAX files: {"truncated": LIST_MAX}."""
    def say(obj: Json) -> None:
        out.write(json.dumps(obj) + "\n")
    say({"root": os.path.isdir(root)})
    count = 0
    for rel in rels:
        kind = _kind(root, rel)
        if kind in ("missing", "link", "other"):
            say({"missing": rel} if kind == "missing" else
                {"skipped": [rel, "a symbolic link (not followed)" if kind == "link" else
                             "not a regular file"]})
            continue
        found: list[tuple[str, str]] = []
        if kind == "file":
            found.append((rel, os.path.join(root, rel)))
        else:
            for top, dirs, files in os.walk(os.path.join(root, rel)):
                dirs.sort()
                under = os.path.relpath(top, root).replace(os.sep, "/")
                for d in [d for d in dirs if os.path.islink(os.path.join(top, d))]:
                    dirs.remove(d)
                    say({"skipped": [f"{under}/{d}", "a symbolic link (not followed)"]})
                found += [(f"{under}/{f}", os.path.join(top, f)) for f in sorted(files)
                          if part_of(f) is None]
        for name, path in found:
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat_regular(st.st_mode):
                say({"skipped": [name, "a symbolic link (not followed)" if
                                 stat.S_ISLNK(st.st_mode) else "not a regular file"]})
                continue
            count += 1
            if count > LIST_MAX:
                say({"truncated": LIST_MAX})
                return
            say({"file": [name, st.st_size, st.st_mtime_ns]})


def _kind(root: str, rel: str) -> str:
    """"file", "dir", "missing", "link" (the path, or a directory on the way to it, is a
    symbolic link) or "other"."""
    at = root
    for part in rel.split("/"):
        at = os.path.join(at, part)
        try:
            st = os.lstat(at)
        except OSError:
            return "missing"
        if stat.S_ISLNK(st.st_mode):
            return "link"
    return "file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) \
        else "other"
