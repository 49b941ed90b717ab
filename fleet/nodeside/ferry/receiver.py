"""The receiver: a stream applied to files under its roots, each verified before it is placed."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import time
from typing import Callable  # noqa: UP035 - Python 3.8

from fleet.nodeside.ferry.frames import (
    _NOFOLLOW,
    BLOCK,
    PART,
    Bad,
    Json,
    block_len,
    blocks_of,
    kept_from,
    safe_rel,
    target,
)
from fleet.nodeside.ferry.word import Tampered, Word

REPORT_S = 0.5
# No set-uid, set-gid or sticky bit and no write for others on any file placed, whatever the
# stream (or the laptop's file) says: a node's code and data must not become a way in.
MODE_MASK = 0o775


class Receiver:
    """Applies a stream to files under its roots (see the package's docstring). `report(obj)`
    says what happened; a write error is reported once and the rest is only passed on (the
    caller's forward), so that the nodes after this one still get everything."""

    def __init__(self, roots: list[str], me: int, report: Callable[[Json], None],
                 strict: bool = False, word: Word | None = None,
                 only: set[tuple[int, str]] | None = None) -> None:
        self.roots, self.me, self.report, self.strict = roots, me, report, strict
        self.only = only  # the files asked for (this machine fetching): no other is written
        self.word = word  # relayed: files verified against fleet's word, not the stream's
        self.broken = False
        self.placed = 0  # bytes of files in place, verified or to be
        self.reported = 0.0
        self.files = 0
        self.f: Json | None = None  # the file being written, its state
        self.failed: Json | None = None

    # one frame
    def apply(self, kind: bytes, payload: bytes) -> bool:
        """Applies one frame; False once the stream has ended."""
        if kind == b"Z":
            if self.f is not None:
                raise Bad("the stream ended inside a file")
            return False
        if kind == b"D":
            self._data(payload)
        elif kind == b"X":
            self._abort()
        elif kind == b"T" and (self.word is not None or self.strict):
            return True  # from another node: only fleet's own word touches files
        else:
            try:
                obj = json.loads(payload)
            except ValueError as e:
                raise Bad(f"broken stream (a {kind!r} frame that is not JSON)") from e
            if not isinstance(obj, dict):
                raise Bad(f"broken stream (a {kind!r} frame that is not an object)")
            {b"F": self._begin, b"E": self._end, b"T": self._touch}[kind](obj)
        return True

    def _path(self, h: Json) -> tuple[str, str]:
        root = h.get("root")
        if not isinstance(root, int) or not 0 <= root < len(self.roots):
            raise Bad(f"bad root {root!r}")
        rel = safe_rel(h.get("path"))
        return rel, target(self.roots[root], rel, self.strict)

    def _begin(self, h: Json) -> None:
        if self.f is not None:
            raise Bad("a file began inside another")
        rel, dest = self._path(h)
        if self.only is not None and (h.get("root"), rel) not in self.only:
            raise Bad(f"{rel} was not asked for")
        size, mode, mtime = h.get("size"), h.get("mode"), h.get("mtime")
        blocks = h.get("blocks")
        if not (isinstance(size, int) and size >= 0 and isinstance(mode, int)
                and isinstance(mtime, int) and (blocks is None or isinstance(blocks, list))):
            raise Bad(f"bad header for {rel}")
        n = blocks_of(size)
        if blocks is not None and any(not isinstance(i, int) or not 0 <= i < n for i in blocks):
            raise Bad(f"bad blocks for {rel}")
        if not 0 <= mtime < MTIME_MAX:
            raise Bad(f"bad time for {rel}")
        readers = _readers(h, rel)
        if self.word is not None:  # relayed: what is applied is fleet's word, not the frame's
            said = self.word.check(h["root"], rel, h)
            mode, blocks, readers = said.mode, said.blocks, said.writers
        mine = self.me in readers and not self.broken
        # From a node (strict): readable by you, too
        mode = (mode & 0o755) | 0o600 if self.strict else mode & MODE_MASK
        st: Json = {
            "root": h["root"], "rel": rel, "dest": dest, "size": size, "mode": mode,
            "mtime": mtime, "sent": None if blocks is None else sorted(set(blocks)), "next": 0,
            "at": 0, "mine": mine, "sha": hashlib.sha256(), "fd": None, "basis": None,
            "copy": False}
        self.f = st
        if not mine:
            return
        part = os.path.join(os.path.dirname(dest), "." + os.path.basename(dest) + PART)
        st["part"] = part
        self._guard(st, lambda: self._open(st, dest, part))

    def _open(self, st: Json, dest: str, part: str) -> None:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if self.strict and os.path.islink(part):
            raise Bad(f"{part} is a symbolic link")
        if st["sent"] is None:
            st["fd"] = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
        elif os.path.isfile(part):  # resume: the pieces not sent are in the partial file
            st["fd"] = os.open(part, os.O_RDWR | _NOFOLLOW)
            st["basis"] = st["fd"]
            keep = kept_from(os.fstat(st["fd"]).st_size, dest)
            if keep is not None:  # ... and, after its whole blocks, in the file (cmd_hash)
                st["basis2"], st["keep"] = os.open(dest, os.O_RDONLY | _NOFOLLOW), keep
        else:  # a delta: the pieces not sent are in the file
            st["fd"] = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
            st["basis"] = os.open(dest, os.O_RDONLY | _NOFOLLOW)
            st["copy"] = True

    def _fill(self, st: Json, upto: int) -> None:
        """Blocks before `upto` that were not sent: taken from the basis (and hashed)."""
        while st["next"] < upto:
            i = st["next"]
            n = block_len(st["size"], i)
            later = st.get("basis2") is not None and i >= st["keep"]
            basis = st["basis2"] if later else st["basis"]
            data = os.pread(basis, n, i * BLOCK) if basis is not None else b""
            if len(data) != n:
                raise Bad(f"{st['rel']}: block {i} is not here to keep (the file changed?)")
            if st["copy"] or later:
                _pwrite(st["fd"], data, i * BLOCK)
            st["sha"].update(data)
            self._placed(n)
            st["next"] = i + 1

    def _data(self, payload: bytes) -> None:
        st = self.f
        if st is None:
            raise Bad("data outside a file")
        sent = st["sent"]
        if sent is None:
            i = st["next"]
        else:
            if st["at"] >= len(sent):
                raise Bad(f"{st['rel']}: more blocks than announced")
            i = sent[st["at"]]
        st["at"] += 1
        if len(payload) != block_len(st["size"], i):
            raise Bad(f"{st['rel']}: block {i} has {len(payload)} bytes")
        if not st["mine"] or st.get("failed"):
            st["next"] = i + 1
            return

        def write() -> None:
            self._fill(st, i)
            _pwrite(st["fd"], payload, i * BLOCK)
            st["sha"].update(payload)
            self._placed(len(payload))
            st["next"] = i + 1
        self._guard(st, write)

    def _end(self, e: Json) -> None:
        st, self.f = self.f, None
        if st is None:
            raise Bad("a file ended that never began")
        expected = blocks_of(st["size"]) if st["sent"] is None else len(st["sent"])
        if st["at"] != expected:
            raise Bad(f"{st['rel']}: {st['at']} blocks came, not {expected}")
        if not st["mine"] or st.get("failed"):
            self._close(st)
            return

        def finish() -> None:
            self._fill(st, blocks_of(st["size"]))
            os.ftruncate(st["fd"], st["size"])
            got = st["sha"].hexdigest()
            want = e.get("sha256") if self.word is None else self.word.sha(st["root"], st["rel"])
            if got != want:
                self._close(st)
                os.unlink(st["part"])
                wrong = Bad if self.word is None else Tampered
                raise wrong(f"{st['rel']}: what arrived has sha256 {got[:16]}..., not the "
                            f"{str(want)[:16]}... that was sent (removed)")
            os.fchmod(st["fd"], st["mode"])
            os.utime(st["fd"], ns=(st["mtime"], st["mtime"]))
            self._close(st)
            os.replace(st["part"], st["dest"])
            if st["dest"].endswith(".py"):
                forget_bytecode(st["dest"])
            self.files += 1
            self.report({"ok": [st["root"], st["rel"], got]})
        try:
            self._guard(st, finish)
        finally:
            self._close(st)

    def _abort(self) -> None:
        st, self.f = self.f, None
        if st is not None:
            self._close(st)  # its verified start stays, for the next attempt
            self.report({"gave_up": [st["root"], st["rel"]]})

    def _touch(self, h: Json) -> None:
        rel, dest = self._path(h)
        mode, mtime = h.get("mode"), h.get("mtime")
        if not (isinstance(mode, int) and isinstance(mtime, int) and 0 <= mtime < MTIME_MAX):
            raise Bad(f"bad header for {rel}")
        if self.me not in _readers(h, rel) or self.broken:
            return

        def touch() -> None:
            if self.strict and os.path.islink(dest):
                raise Bad(f"{dest} is a symbolic link")
            os.chmod(dest, mode & MODE_MASK)
            os.utime(dest, ns=(mtime, mtime))
            self.report({"ok": [h["root"], rel, ""]})
        self._guard({"dest": dest}, touch)

    def drop(self) -> None:
        """The file being written given up with its partial file: its sender broke the
        protocol, so nothing it sent of that file is kept for a later attempt."""
        st, self.f = self.f, None
        if st is not None:
            self._close(st)
            if st.get("part"):
                with contextlib.suppress(OSError):
                    os.unlink(st["part"])

    def touch_all(self, touches: list[Json]) -> None:
        """fleet's word on files only to touch (a relayed node's)."""
        for h in touches:
            if not isinstance(h, dict):
                raise Bad("bad touch")
            self._touch(h)

    @staticmethod
    def _close(st: Json) -> None:
        fds = {fd for fd in (st.get("fd"), st.get("basis"), st.get("basis2"))
               if isinstance(fd, int)}
        st["fd"] = st["basis"] = st["basis2"] = None
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _placed(self, n: int) -> None:
        """Counts bytes in place, and says so every REPORT_S (a long copy from the file held
        too: a receiver that says nothing for long is taken for a lost one)."""
        self.placed += n
        now = time.monotonic()
        if now - self.reported >= REPORT_S:
            self.reported = now
            self.report({"at": self.placed})

    def _guard(self, st: Json | None, fn: Callable[[], None]) -> None:
        """Runs a local write; an OSError or a failed check is reported (once) and the rest of
        the stream is only passed on."""
        try:
            fn()
        except (OSError, Bad) as e:
            where = st["dest"] if st else ""
            if st is not None:
                st["failed"] = True
                self._close(st)
                if st.get("copy") and st.get("part"):  # nothing of it verified: not kept
                    with contextlib.suppress(OSError):
                        os.unlink(st["part"])
            if self.failed is None:
                self.failed = _problem(e, where)
                part = st.get("part") if st else None
                self.failed["kept"] = bool(part and os.path.exists(part))
                if isinstance(e, Tampered):
                    self.failed["tampered"] = True
                self.report({"error": self.failed})
            self.broken = True


def forget_bytecode(path: str) -> None:
    """A replaced .py file's cached bytecode goes: Python trusts a .pyc whose source has the
    same size and mtime in whole seconds, and an edit within the second would run old code."""
    head, stem = os.path.split(path[:-3])
    cache = os.path.join(head, "__pycache__")
    with contextlib.suppress(OSError):
        for name in os.listdir(cache):
            if name.startswith(stem + ".") and name.endswith(".pyc"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(cache, name))



MTIME_MAX = 1 << 62  # nanoseconds: far beyond any real file's time, inside what utime takes


def _readers(h: Json, rel: str) -> list[int]:
    readers = h.get("for")
    if not isinstance(readers, list) or not all(isinstance(i, int) for i in readers):
        raise Bad(f"bad readers for {rel}")
    return readers


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _problem(e: BaseException, path: str) -> Json:
    out: Json = {"path": path, "msg": str(e.strerror if isinstance(e, OSError) and e.strerror
                                          else e)}
    if isinstance(e, OSError) and e.errno is not None:
        out["errno"] = errno.errorcode.get(e.errno, str(e.errno))
    if path:
        d = os.path.dirname(path)
        while d and not os.path.isdir(d):
            d = os.path.dirname(d)
        try:
            sv = os.statvfs(d or "/")
            out["free"] = sv.f_bavail * sv.f_frsize
        except OSError:
            pass
    return out
