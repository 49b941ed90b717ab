"""This machine as a node: plain subprocesses and files, no SSH server needed."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import threading
from collections.abc import Callable

from fleet.errors import CommandTimedOut, PortClosed
from fleet.transport.base import CHUNK, TICK_S, Pipe, Stream, Transport, kill_on, named
from fleet.transport.framing import Result
from fleet.transport.lines import Lines, Received
from fleet.transport.process import ProcessPipe


class _LocalPipe(ProcessPipe):
    """`/bin/sh -c script`, ended with its whole process group."""

    def __init__(self, script: str) -> None:
        super().__init__(["/bin/sh", "-c", script])

    def close(self) -> None:
        self._close_stdin()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.p.pid, 9)


class LocalTransport(Transport):
    """This machine, as a node: plain subprocesses and files, no SSH server needed."""

    def connect(self, hello: bool = True) -> None:
        if hello:
            self._hello()

    def run(self, script: str, timeout: float | None = 60.0, what: str = "") -> Result:
        try:
            # Its own session: a Ctrl-C at the terminal reaches fleet, which decides; it must
            # not also kill a stop.sh half-way through its grace period.
            p = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL, errors="replace",
                               start_new_session=True)
        except subprocess.TimeoutExpired as e:
            raise CommandTimedOut(self.host.name, named(script, what), timeout) from e
        return Result(named(script, what), p.returncode, p.stdout, p.stderr)

    def _put(self, path: str, data: bytes, mode: int) -> str:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            try:
                os.fchmod(fd, mode)
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            return str(e)
        return ""

    def pipe(self, script: str) -> Pipe:
        return _LocalPipe(script)

    def open_port(self, address: str, port: int) -> Stream:
        """A plain TCP connection: this machine is the node."""
        try:
            sock = socket.create_connection((address, port), timeout=10)
        except ConnectionRefusedError as e:
            raise PortClosed(f"{self.host.name}: nothing accepts connections on "
                             f"{address}:{port} there (connection refused)") from e
        except OSError as e:
            raise PortClosed(f"{self.host.name}: cannot connect to {address}:{port}: {e}") from e
        sock.settimeout(None)
        return sock

    def stream(self, script: str, on_lines: Callable[[list[str]], None],
               stop: threading.Event | None = None, received: Received | None = None) -> int:
        p = subprocess.Popen(["/bin/sh", "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        assert p.stdout is not None
        watcher = kill_on(stop, p.kill)
        lines = Lines(None, on_lines, received)
        fd = p.stdout.fileno()
        while True:
            if not select.select([fd], [], [], TICK_S)[0]:
                lines.tick()
                continue
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            lines.feed(chunk)
        lines.close()
        p.stdout.close()
        code = p.wait()
        if watcher:
            watcher.set()
        return -1 if stop is not None and stop.is_set() else code

