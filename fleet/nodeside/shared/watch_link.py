"""What the nodes' watchers (fleet/nodeside/watcher.py) do with the world: a signed link to
another watcher, the master's listening socket, whether the node's part has ended, a line in
node.log."""

from __future__ import annotations

import contextlib
import os
import socket
import time

from fleet.nodeside.shared.nodemap import EXIT_CODE, NODE_LOG
from fleet.nodeside.shared.watch_rules import (
    MAX_LINE,
    NONCE_BYTES,
    BadMessage,
    Message,
    encode,
    parse,
    parse_nonce,
)


class Link:
    """One TCP link to another watcher: its nonce (what this side signs over), this side's
    own (what the other signs over), what has come in and not been read, the last number
    each way."""

    def __init__(self, sock: socket.socket, opened: float = 0.0) -> None:
        self.sock, self.opened = sock, opened
        self.mine = os.urandom(NONCE_BYTES).hex()
        self.theirs = ""
        self.buf = b""
        self.seq_in = 0
        self.seq_out = 0
        self.node = ""
        sock.setblocking(False)
        self.sock.sendall(f"nonce {self.mine}\n".encode())

    def send(self, token: bytes, kind: str, node: str, **kw: object) -> bool:
        if not self.theirs:
            return False
        self.seq_out += 1
        try:
            self.sock.sendall(encode(token, self.theirs, Message(kind, node, self.seq_out,
                                                                 **kw)))  # type: ignore[arg-type]
        except OSError:
            return False
        return True

    def receive(self, token: bytes, nodes: frozenset) -> list:  # type: ignore[type-arg]
        """The messages that have come; BadMessage or OSError end the link (EOF: OSError)."""
        chunk = self.sock.recv(4096)
        if not chunk:
            raise OSError("closed")
        self.buf += chunk
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if not self.theirs:
                self.theirs = parse_nonce(line + b"\n")
                continue
            m = parse(line + b"\n", token, self.mine, nodes, self.seq_in)
            if self.node and m.node != self.node:
                raise BadMessage("a link changed its node")
            self.node, self.seq_in = m.node, m.seq
            out.append(m)
        if len(self.buf) > MAX_LINE:
            raise BadMessage("a line too long")
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def part_ended(run_dir: str, pid: int, start: int) -> tuple[bool, int | None]:
    """(ended, exit code: None where the wrapper died without one) of the node's part: the
    wrapper of that pid and start time is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rpartition(") ")[2].split()
        alive = len(fields) > 19 and fields[0] not in "ZX" and fields[19] == str(start)
    except OSError:
        alive = False
    if alive:
        return False, None
    try:
        with open(os.path.join(run_dir, EXIT_CODE), encoding="ascii") as f:
            said = f.read(8).strip()
    except (OSError, UnicodeDecodeError):
        return True, None
    return True, int(said) if said.isdigit() and int(said) < 256 else None


def say(run_dir: str, line: str) -> None:
    try:
        with open(os.path.join(run_dir, NODE_LOG), "a", encoding="utf-8") as f:
            f.write(f"[fleet] watcher: {line}\n")
    except OSError:
        pass


def listen(addr: str, port: int) -> socket.socket:
    """The master's watcher's socket: on `port` (a healed attempt's, where the attempt before
    it listened: its watcher may not have let go yet), any free one for 0."""
    server = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for i in range(50 if port else 1):
        try:
            try:
                server.bind((addr, port))
            except OSError:  # an address the others reach the master by, not its own (NAT)
                server.bind(("", port))
            return server
        except OSError:
            if i == 49 or not port:
                raise
            time.sleep(0.2)
    return server
