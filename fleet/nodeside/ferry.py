"""ferry: fleet's file mover. The same file runs on this machine (the sender's half, imported as
fleet.nodeside.ferry) and on every node (`python3 -c <this file> hash|recv ...`, standard library
only, Python 3.8+), so that sending to nodes and, later, pulling from them are one engine.

The stream is a sequence of frames, each a kind byte and a 4-byte length, then the payload:

  F  a file begins: JSON {"root", "path", "size", "mode", "mtime", "blocks", "for"}.
     `blocks` lists the indices of the BLOCK-sized pieces that follow (null: all of them);
     the receiver takes every other piece from what it already has (its partial file, else
     the file itself), verified: the pieces were chosen by comparing their hashes.
     `for` lists the receivers that write the file; the others only pass it on.
  D  one block's bytes, in block order.
  E  the file ends: JSON {"sha256"}: the whole file's hash as the sender read it. The receiver
     hashes what it assembled while it writes; only an equal hash makes the file replace the
     old one (renamed into place), else the partial file is removed and an error reported.
  X  the sender gave the file up (it changed while it was read): the partial file is kept,
     its verified pieces the start of the next attempt.
  T  a file whose content the receiver already has (same hash): JSON {"root", "path", "mtime",
     "mode", "for"}: only its time and mode are set.
  Z  the end.

A file is written to `.NAME.fleet-part` beside its target and renamed only once verified, so a
reader never sees half a file, and an interrupted transfer leaves what arrived for the next one
to verify and keep (`hash` lists a partial file's pieces in place of the file's).

A receiver (`recv`) reads the stream from its stdin or from the node before it (a TCP
connection, authenticated both ways with an HMAC of a per-transfer key that only reaches it on
stdin), passes every frame on to the node after it before writing it, and reports on stdout, one
JSON object a line: {"port"}, {"linked"}, {"at": bytes in place},
{"ok": [root, path, sha256 ("" for a touch)]}, {"error": {...}}, {"done": {...}}. It ends
when the stream ends, and at once when its stdin closes (fleet gone, or stopping it).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import queue
import secrets
import select
import socket
import struct
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, Iterable, Iterator  # noqa: UP035 - Python 3.8

Json = Dict[str, Any]  # noqa: UP006 - evaluated at run time, on Python 3.8 too
Write = Callable[[bytes], None]
Read = Callable[[int], bytes]

BLOCK = 1 << 20
HEAD = struct.Struct(">cI")
MAX_META = 1 << 20  # a JSON frame longer than this: a broken stream
PART = ".fleet-part"
DIGEST_HEX = 32  # hex digits kept of a block's sha256
# A relay connection that moves nothing for this long is broken. Long: a node may copy the
# blocks it keeps for minutes while the one before it waits; a node that stops answering is
# found sooner by fleet, which hears from every receiver twice a second.
STALL_S = 300.0
CONNECT_S = 5.0
ACCEPT_S = 60.0
REPORT_S = 0.5


class Bad(Exception):
    """A stream or a request that breaks the protocol (a path outside the root, say)."""


# ---- names and blocks: pure ---------------------------------------------------------------------
def part_name(rel: str) -> str:
    head, _, tail = rel.rpartition("/")
    return f"{head}/.{tail}{PART}" if head else f".{tail}{PART}"


def part_of(rel: str) -> str | None:
    """The file a partial file belongs to, or None if `rel` is not one."""
    head, _, tail = rel.rpartition("/")
    if not (tail.startswith(".") and tail.endswith(PART)) or len(tail) <= len(PART) + 1:
        return None
    name = tail[1:-len(PART)]
    return f"{head}/{name}" if head else name


def blocks_of(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK


def block_len(size: int, i: int) -> int:
    return max(0, min(BLOCK, size - i * BLOCK))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


def safe_rel(rel: object) -> str:
    """A relative path that stays under its root: no empty, '.' or '..' part, not absolute, no
    NUL. Paths in a stream are data from the other end, never trusted."""
    if not isinstance(rel, str) or not rel or len(rel) > 4096 or "\0" in rel:
        raise Bad(f"bad path {rel!r}")
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise Bad(f"path {rel!r} leaves its directory")
    return rel


def target(root: str, rel: str, strict: bool = False) -> str:
    """root/rel; with `strict` (this machine receiving from a node), no part of it under root
    may be a symbolic link (a node must not make a file land elsewhere)."""
    rel = safe_rel(rel)
    path = os.path.join(root, rel)
    if strict:
        at = root
        for p in rel.split("/"):
            at = os.path.join(at, p)
            if os.path.islink(at):
                raise Bad(f"{at} is a symbolic link: not written through")
    return path


# ---- hashing what a node has ------------------------------------------------------------------
def hash_file(path: str, start: int = 0) -> tuple[int, str, list[str]]:
    """(size, sha256, block digests) of a file, read once; from block `start` on (the size is
    then the whole file's, the hash and digests of what was read)."""
    whole = hashlib.sha256()
    blocks = []
    size = start * BLOCK
    with open(path, "rb") as f:
        f.seek(size)
        while True:
            b = f.read(BLOCK)
            if not b:
                break
            whole.update(b)
            blocks.append(digest(b))
            size += len(b)
    return size, whole.hexdigest(), blocks


def cmd_hash(root: str, rels: list[str], out: IO[str]) -> None:
    """Per file, what a transfer can keep of it; one line each: JSON path, TAB, "part" or
    "file", TAB, size, TAB, sha256, TAB, the block digests run together. With a partial file:
    its whole blocks, then the file's blocks after them (see kept_from); else the file's. A
    file that is not there (or cannot be read) gets no line."""
    for rel in rels:
        final, part = target(root, rel), target(root, part_name(rel))
        try:
            if os.path.isfile(part):
                kind = "part"
                size, sha, blocks = hash_file(part)
                keep = kept_from(size, final)
                if keep is not None:
                    size, _, rest = hash_file(final, keep)
                    blocks = blocks[:keep] + rest
            elif os.path.isfile(final):
                kind = "file"
                size, sha, blocks = hash_file(final)
            else:
                continue
        except OSError:
            continue
        out.write(f"{json.dumps(rel)}\t{kind}\t{size}\t{sha}\t{''.join(blocks)}\n")


def kept_from(part_size: int, final: str) -> int | None:
    """Where a partial file left by an interrupted update ends and the old file takes over:
    its whole blocks are kept, and the old file's blocks after them (an update copies the
    old file's blocks in order, so an interrupted one holds only a prefix). None where the
    old file is not there or no longer than that prefix."""
    keep = part_size // BLOCK
    try:
        return keep if os.path.getsize(final) > keep * BLOCK else None
    except OSError:
        return None


# ---- frames -------------------------------------------------------------------------------------
def frame(kind: bytes, payload: bytes) -> bytes:
    return HEAD.pack(kind, len(payload)) + payload


def meta(kind: bytes, obj: Json) -> bytes:
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def read_frame(read: Read) -> tuple[bytes, bytes]:
    """(kind, payload) from a reader's read(n); ('', b'') at a clean end of input."""
    head = _exactly(read, HEAD.size, start=True)
    if not head:
        return b"", b""
    kind, n = HEAD.unpack(head)
    if kind not in b"FDEXTZ" or (kind != b"D" and n > MAX_META) or n > BLOCK:
        raise Bad(f"broken stream (a frame {kind!r} of {n} bytes)")
    return kind, _exactly(read, n)


def _exactly(read: Read, n: int, start: bool = False) -> bytes:
    if n == 0:
        return b""
    got = read(n)
    if not got and start:
        return b""
    while len(got) < n:
        more = read(n - len(got))
        if not more:
            raise EOFError("the stream ended mid-frame")
        got += more
    return got


# ---- sending (this machine, or a node when pulling) ---------------------------------------------
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


# ---- receiving ----------------------------------------------------------------------------------
class Receiver:
    """Applies a stream to files under its roots (see the module's docstring). `report(obj)`
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
        mine = self.me in _readers(h, rel) and not self.broken
        # From a node (strict): no set-id or sticky bit, no write for others, readable by you
        mode = (mode & 0o755) | 0o600 if self.strict else mode & 0o7777
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
                raise Bad(f"{st['rel']}: what arrived has sha256 {got[:16]}..., not the "
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
            os.chmod(dest, mode & 0o7777)
            os.utime(dest, ns=(mtime, mtime))
            self.report({"ok": [h["root"], rel, ""]})
        self._guard({"dest": dest}, touch)

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


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
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


# ---- the relay link -----------------------------------------------------------------------------
def _mac(key: bytes, what: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, what + nonce, hashlib.sha256).digest()


def link_to(addr: str, port: int, key: bytes) -> socket.socket:
    """Connects to the next node's receiver; both ends prove they hold the key."""
    s = socket.create_connection((addr, port), timeout=CONNECT_S)
    try:
        nonce = _exactly(s.recv, 16)
        mine = secrets.token_bytes(16)
        s.sendall(_mac(key, b"ferry-up", nonce) + mine)
        if not hmac.compare_digest(_exactly(s.recv, 32), _mac(key, b"ferry-down", mine)):
            raise Bad(f"{addr}:{port} does not hold this transfer's key")
    except BaseException:
        s.close()
        raise
    s.settimeout(STALL_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def accept_from(server: socket.socket, key: bytes, deadline: float) -> socket.socket:
    """The first connection that proves it holds the key (others are closed)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Bad("the node before this one never connected")
        server.settimeout(left)
        try:
            c, _ = server.accept()
        except TimeoutError as e:
            raise Bad("the node before this one never connected") from e
        try:
            c.settimeout(CONNECT_S)
            nonce = secrets.token_bytes(16)
            c.sendall(nonce)
            got = _exactly(c.recv, 48)
            if hmac.compare_digest(got[:32], _mac(key, b"ferry-up", nonce)):
                c.sendall(_mac(key, b"ferry-down", got[32:]))
                c.settimeout(STALL_S)
                return c
        except (OSError, EOFError):
            pass
        c.close()


# ---- the node's receiver ----------------------------------------------------------------------
def cmd_recv(argv: list[str]) -> int:
    """recv MARK [LISTEN-ADDRESS]: see the module's docstring."""
    out_lock = threading.Lock()

    def report(obj: Json) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    sys.stdout.write("\n" + argv[0] + "\n")  # on a line of its own, whatever rc files printed
    sys.stdout.flush()
    threading.Thread(target=_exit_when_unread, daemon=True).start()
    server = None
    if len(argv) > 1:
        try:
            server = socket.socket(socket.AF_INET6 if ":" in argv[1] else socket.AF_INET)
            server.bind((argv[1], 0))
            server.listen(4)
            report({"port": server.getsockname()[1]})
        except OSError as e:  # fleet feeds this node itself, then
            server = None
            report({"port": 0, "why": f"cannot listen on {argv[1]}: {e.strerror or e}"})
    stdin = sys.stdin.buffer
    ctl = json.loads(stdin.readline() or b"null")
    if not isinstance(ctl, dict):
        return 3
    key = bytes.fromhex(ctl["key"])
    roots = [str(r) for r in ctl["roots"]]
    got: list[socket.socket | BaseException] = []

    def accept(server: socket.socket) -> None:
        try:
            got.append(accept_from(server, key, time.monotonic() + ACCEPT_S))
        except (OSError, Bad) as e:
            got.append(e)
    acceptor = None
    if server is not None:
        acceptor = threading.Thread(target=accept, args=(server,), daemon=True)
        acceptor.start()
    fwd = None
    if ctl.get("next"):
        addr, port = ctl["next"]
        try:
            fwd = link_to(addr, int(port), key)
            report({"linked": True})
        except (OSError, EOFError, Bad) as e:
            report({"linked": False, "why": str(e) or type(e).__name__})
    go = json.loads(stdin.readline() or b"null")
    if not isinstance(go, dict):
        return 3
    if not go.get("forward") and fwd is not None:
        fwd.close()
        fwd = None
    word: Word | None = None
    if go.get("source") == "socket":
        word = Word(stdin)
        threading.Thread(target=word.listen, daemon=True).start()
        if acceptor is not None:
            acceptor.join()
        if not got or not isinstance(got[0], socket.socket):
            report({"error": {"msg": f"no relay from the node before: {got[0] if got else ''}",
                              "relay": "in"}})
            return 2
        src: IO[bytes] = got[0].makefile("rb")
    else:
        src = stdin
    if server is not None:
        server.close()
    recv = Receiver(roots, int(ctl.get("me", 0)), report, word=word)

    def beat() -> None:  # alive, whatever it waits on: fleet takes silence for a lost node
        while True:
            time.sleep(REPORT_S)
            report({"at": recv.placed})
    threading.Thread(target=beat, daemon=True).start()
    while True:
        try:
            kind, payload = read_frame(src.read)
        except (OSError, EOFError) as e:
            frm = "the node before" if go.get("source") == "socket" else "fleet"
            report({"error": {"msg": f"the stream from {frm} ended: {e}", "relay": "in"}})
            return 2
        if not kind:
            report({"error": {"msg": "the stream ended before its end", "relay": "in"}})
            return 2
        if fwd is not None:
            try:
                fwd.sendall(HEAD.pack(kind, len(payload)))
                fwd.sendall(payload)
            except OSError as e:
                report({"error": {"msg": f"passing the data on failed: {e}", "relay": "out"}})
                fwd.close()
                fwd = None
        try:
            more = recv.apply(kind, payload)
        except (Bad, TypeError, ValueError, OverflowError, KeyError, RecursionError) as e:
            report({"error": {"msg": f"broken stream: {e}", "protocol": True}})
            return 2
        if not more:
            break
    if fwd is not None:
        fwd.close()
    if word is not None:
        try:
            recv.touch_all(word.touches())
        except Bad as e:
            report({"error": {"msg": str(e), "protocol": True}})
            return 2
    report({"at": recv.placed})
    report({"done": {"files": recv.files, "bytes": recv.placed,
                     "failed": recv.failed is not None}})
    return 1 if recv.failed else 0


def _exit_when_unread() -> None:
    """fleet reads this node's stdout for as long as the transfer should go on: once nobody
    does (fleet ended it, or its connection is gone), this ends at once, even while it waits
    on the node after it."""
    poll = select.poll()
    poll.register(sys.stdout.fileno(), select.POLLERR | select.POLLHUP)
    while True:
        if poll.poll(1000):
            os._exit(3)


WORD_S = 120.0  # how long a relayed file waits, at its end, for fleet's word on it


class Word:
    """What fleet says to a node that the stream reaches through another node: the sha256 of
    each file as fleet read it, and the files only to touch, over the node's own SSH
    connection (its stdin). A relayed stream is data from another node: what it carries
    replaces a file only if fleet's word agrees, and its T frames are not obeyed. Its stdin
    ending (fleet gone, or stopping it) ends the node's receiver at once."""

    def __init__(self, stdin: IO[bytes]) -> None:
        self.stdin = stdin
        self.cond = threading.Condition()
        self.shas: dict[tuple[int, str], str] = {}
        self.touch: list[Json] = []
        self.ended = False

    def listen(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for line in self.stdin:
                obj = json.loads(line)
                with self.cond:
                    if "sha" in obj:
                        root, rel, sha = obj["sha"]
                        self.shas[(int(root), str(rel))] = str(sha)
                    elif "touch" in obj:
                        self.touch.append(obj["touch"])
                    elif "end" in obj:
                        self.ended = True
                    self.cond.notify_all()
        os._exit(3)

    def sha(self, root: int, rel: str) -> str | None:
        with self.cond:
            self.cond.wait_for(lambda: (root, rel) in self.shas or self.ended, WORD_S)
            return self.shas.get((root, rel))

    def touches(self) -> list[Json]:
        with self.cond:
            self.cond.wait_for(lambda: self.ended, WORD_S)
            return list(self.touch)


def cmd_send(root: str, mark: str, rels: list[str]) -> int:
    """send ROOT MARK < [paths]: the files, as a stream on stdout after the MARK line (pulling
    from a node: the same frames the other way). A file that is not there, or changed while it
    was read, is left out (the receiver sees which came)."""
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
    write(b"\n" + mark.encode() + b"\n")
    for rel in rels:
        path = target(root, rel)
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat_regular(st.st_mode):
                continue
            send_file(write, 0, rel, path, st.st_size, st.st_mtime_ns,
                      st.st_mode & 0o7777, None, [0])
        except (OSError, Changed):
            continue
    out.write(frame(b"Z", b""))
    out.flush()
    return 0


def stat_regular(mode: int) -> bool:
    return mode & 0o170000 == 0o100000


def main(argv: list[str]) -> int:
    if argv[:1] == ["hash"] and len(argv) == 2:
        threading.Thread(target=_exit_when_unread, daemon=True).start()  # fleet gone: stop
        rels = json.loads(sys.stdin.readline() or "[]")
        cmd_hash(argv[1], [safe_rel(r) for r in rels], sys.stdout)
        return 0
    if argv[:1] == ["recv"] and len(argv) in (2, 3):
        return cmd_recv(argv[1:])
    if argv[:1] == ["send"] and len(argv) == 3:
        rels = json.loads(sys.stdin.readline() or "[]")
        return cmd_send(argv[1], argv[2], [safe_rel(r) for r in rels])
    sys.stderr.write("usage: ferry hash ROOT < [paths] | ferry recv MARK [LISTEN] | "
                     "ferry send ROOT MARK < [paths]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
