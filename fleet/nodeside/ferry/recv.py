"""`ferry recv` on a node: its relay link to the nodes before and after it, and its reports."""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import select
import socket
import struct
import sys
import termios
import threading
import time
from typing import IO

from fleet.nodeside.ferry.frames import HEAD, Bad, Json, _exactly, read_frame
from fleet.nodeside.ferry.receiver import REPORT_S, Receiver
from fleet.nodeside.ferry.word import Tampered, Word

# A relay connection that moves nothing for this long is broken. Long: a node may copy the
# blocks it keeps for minutes while the one before it waits; a node that stops answering is
# found sooner by fleet, which hears from every receiver twice a second.
STALL_S = 300.0
CONNECT_S = 5.0
ACCEPT_S = 60.0


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


class Forward:
    """The link to the next node, and how long what waits to go on it has made no progress:
    fleet, told so, names the next node if it placed nothing meanwhile (it takes nothing), well
    before this socket's own STALL_S."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.since: float | None = None  # when a send last moved a byte, while one waits

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        self.since = time.monotonic()
        try:
            while view:
                n = self.s.send(view)
                view = view[n:]
                self.since = time.monotonic()
        finally:
            self.since = None

    def waiting(self) -> float:
        since = self.since
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    def close(self) -> None:
        self.s.close()


def cmd_recv(argv: list[str]) -> int:
    """recv MARK [LISTEN-ADDRESS]: see the package's docstring."""
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
    fwd: Forward | None = None
    if ctl.get("next"):
        addr, port = ctl["next"]
        try:
            fwd = Forward(link_to(addr, int(port), key))
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
    link: socket.socket | None = None  # the link from the node before, where it feeds this one
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
        link = got[0]
    else:
        src = stdin
    if server is not None:
        server.close()
    recv = Receiver(roots, int(ctl.get("me", 0)), report, word=word)

    def beat() -> None:  # alive, whatever it waits on: fleet takes silence for a lost node
        while True:
            time.sleep(REPORT_S)
            report({"at": recv.placed})
            if link is not None:
                unread = _unread(link)
                if unread is not None:
                    report({"unread": unread})
            out = fwd
            if out is not None:
                report({"waiting": round(out.waiting(), 1)})
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
                fwd.send(HEAD.pack(kind, len(payload)))
                fwd.send(payload)
            except OSError as e:
                report({"error": {"msg": f"passing the data on failed: {e}", "relay": "out"}})
                fwd.close()
                fwd = None
        try:
            more = recv.apply(kind, payload)
        except Tampered as e:
            report({"error": {"msg": str(e), "tampered": True}})
            return 2
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


def _unread(s: socket.socket) -> int | None:
    """Bytes that reached this node from the one before it and wait unread in the socket: this
    node's own word that the stream reaches it and it does not take it (a relaying node's word
    that it waits on this one proves nothing of the kind). None: closed, or not to be told."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(s.fileno(), termios.FIONREAD, b"\0" * 4))[0])
    except (OSError, ValueError):
        return None


def _exit_when_unread() -> None:
    """fleet reads this node's stdout for as long as the transfer should go on: once nobody
    does (fleet ended it, or its connection is gone), this ends at once, even while it waits
    on the node after it."""
    poll = select.poll()
    poll.register(sys.stdout.fileno(), select.POLLERR | select.POLLHUP)
    while True:
        if poll.poll(1000):
            os._exit(3)
