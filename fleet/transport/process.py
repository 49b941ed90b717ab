"""A Pipe that is a process on this machine: a shell for a local node (fleet.transport.local),
or OpenSSH's `ssh` carrying a node's program (fleet.transport.openssh). Its stdin and stdout
are the program's; its stderr is drained as it comes, its tail kept for an error message."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading

from fleet.transport.base import CHUNK, Pipe


class ProcessPipe(Pipe):
    """`argv` started in a session of its own (a Ctrl-C at the terminal reaches fleet only);
    each subclass says how it ends (close)."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__()
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, bufsize=0, start_new_session=True)
        self._errs = threading.Thread(target=self._drain_err, daemon=True)
        self._errs.start()

    def _drain_err(self) -> None:
        assert self.p.stderr is not None
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(self.p.stderr.fileno(), CHUNK):
                self._keep_err(chunk)

    def send(self, data: bytes) -> None:
        assert self.p.stdin is not None
        view = memoryview(data)
        try:
            fd = self.p.stdin.fileno()
            while view:  # a signal can cut a write to a pipe short
                view = view[os.write(fd, view):]
        except ValueError as e:  # closed here
            raise OSError("closed") from e

    def recv(self, n: int) -> bytes:
        assert self.p.stdout is not None
        try:
            return os.read(self.p.stdout.fileno(), n)
        except (OSError, ValueError):
            return b""

    def _close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.p.stdin is not None
            self.p.stdin.close()

    def status(self, timeout: float) -> int | None:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
