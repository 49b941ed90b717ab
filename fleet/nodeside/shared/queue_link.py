"""One signed TCP link between the queue's runner and a host's agent (fleet/nodeside/queue.py):
each side sends its nonce first, then lines signed over the other's nonce, numbered (no replay
within a link), parsed as untrusted input by fleet.nodeside.shared.queue_rules."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from fleet.nodeside.shared.queue_rules import QUEUE_LINE, BadWord, decode_word, encode_word
from fleet.nodeside.shared.watch_rules import NONCE_BYTES, parse_nonce


class QueueLink:
    """A link's socket (non-blocking), this side's nonce and the other's, what came in and was
    not read yet, the last number each way; `host` once an agent said hello."""

    def __init__(self, sock: socket.socket, token: bytes, kinds: dict[str, set[str]]) -> None:
        self.sock, self.token, self.kinds = sock, token, kinds
        self.mine = os.urandom(NONCE_BYTES).hex()
        self.theirs = ""
        self.buf = b""
        self.seq_in = self.seq_out = 0
        self.host = ""
        self.pending: list[tuple[str, dict[str, object]]] = []  # said before the nonce came
        self.sending = threading.Lock()  # an agent's threads say things too
        self.opened = 0.0  # when the runner accepted it
        sock.setblocking(False)
        self.sock.sendall(f"nonce {self.mine}\n".encode())

    def send(self, kind: str, **fields: object) -> bool:
        """Say it (once the other side's nonce came; kept until then); False where the link
        is gone."""
        with self.sending:
            return self._send(kind, fields)

    def _send(self, kind: str, fields: dict[str, object]) -> bool:
        if not self.theirs:
            self.pending.append((kind, fields))
            return True
        self.seq_out += 1
        try:
            self.sock.setblocking(True)
            self.sock.settimeout(10)
            self.sock.sendall(encode_word(self.token, self.theirs, kind, self.seq_out, fields))
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                self.sock.setblocking(False)
        return True

    def receive(self) -> list[tuple[str, dict[str, object]]]:
        """What has come, checked; BadWord or OSError end the link (EOF: OSError)."""
        data = self.sock.recv(65536)
        if not data:
            raise OSError("closed")
        *whole, self.buf = (self.buf + data).split(b"\n")
        if len(self.buf) > QUEUE_LINE:
            raise BadWord("a line too long")
        out = []
        for raw in whole:
            if self.theirs:
                kind, self.seq_in, fields = decode_word(raw + b"\n", self.token, self.mine,
                                                        self.seq_in, self.kinds)
                out.append((kind, fields))
                continue
            self.theirs = parse_nonce(raw + b"\n")
            waiting, self.pending = self.pending, []
            for kind, fields in waiting:
                self.send(kind, **fields)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
