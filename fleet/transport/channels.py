"""The pieces of SSHTransport that work on one channel: a pipe to a program, a drain of a
stream, a recv that waits through a send timeout, and the watch on a transfer's progress."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import paramiko

from fleet.sizes import short
from fleet.transport.base import CHUNK, Pipe
from fleet.transport.budget import Slot

PUT_CHUNK = 1 << 20  # bytes per SFTP write call: the unit of progress a stalled write is seen by


class SSHPipe(Pipe):
    """A program on the node over one session channel, holding one slot of the connection's
    session budget until it is closed (or both sides closed it)."""

    def __init__(self, chan: paramiko.Channel, slot: Slot) -> None:
        super().__init__()
        self.chan, self.slot = chan, slot
        threading.Thread(target=self._drain_err, daemon=True).start()

    def _drain_err(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            while chunk := self.chan.recv_stderr(CHUNK):
                self._keep_err(chunk)

    def send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (paramiko.SSHException, EOFError) as e:
            raise OSError(str(e) or "the connection closed") from e

    def recv(self, n: int) -> bytes:
        try:
            return bytes(self.chan.recv(n))
        except (paramiko.SSHException, EOFError):
            return b""

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.chan.close()
        self.slot.release()

    def status(self, timeout: float) -> int | None:
        if not self.chan.status_event.wait(timeout):
            return None
        if self.chan.closed:  # both sides closed it: sshd no longer counts it
            self.slot.release()
        return int(self.chan.recv_exit_status())


class Progress:
    """A deadline that moves with progress: if nothing moved for `limit` seconds, `give_up` is
    called (closing the connection, so that whatever waits on it fails at once) and `stalled`
    says so. A transfer as long as it likes, as long as it goes on."""

    def __init__(self, limit: float, give_up: Callable[[], None]) -> None:
        self.limit, self.give_up = limit, give_up
        self.last = time.monotonic()
        self.count = 0
        self.stalled = False
        self.done = threading.Event()

    def moved(self) -> None:
        self.last = time.monotonic()
        self.count += 1

    def sent(self, total: int) -> str:
        return f"{short(min(self.count * PUT_CHUNK, total))} of {short(total)} sent"

    def _watch(self) -> None:
        while not self.done.wait(min(1.0, self.limit / 4)):
            if time.monotonic() - self.last > self.limit:
                self.stalled = True
                self.give_up()
                return

    def __enter__(self) -> Progress:
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()


def blocking(recv: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """recv that waits through the channel's send timeout: a quiet command is not an ended one
    (the caller's deadline decides when to give up)."""
    def read(n: int) -> bytes:
        while True:
            try:
                return recv(n)
            except TimeoutError:
                continue
    return read


def drain(recv: Callable[[int], bytes], into: list[bytes]) -> None:
    try:
        while True:
            chunk = recv(65536)
            if not chunk:
                return
            into.append(chunk)
    except (OSError, EOFError, paramiko.SSHException):
        return
