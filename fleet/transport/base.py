"""The Transport interface: what fleet needs of a node (run a script, write a file, stream a
script's output, talk with a program), whatever carries it (fleet.transport.local, .ssh)."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

from fleet.config.inventory import Host
from fleet.errors import RemoteCommandError, WriteError
from fleet.transport.framing import (
    Result,
    clock_offset,
    parse_verify,
    verify_script,
    write_problem,
)
from fleet.transport.lines import Received

CHUNK = 65536  # bytes read from a stream at a time
TICK_S = 1.0  # a stream with nothing to read looks up from its read this often


class Pipe(ABC):
    """A process on a node whose stdin is fed from here and whose stdout comes back as it is
    written (fleet.transport.transfer's receivers). Noise that rc files print comes first on stdout:
    the process marks where its own output begins."""

    ERR_KEPT = 4096  # the tail of its stderr kept, for an error message

    def __init__(self) -> None:
        self._err = bytearray()

    @abstractmethod
    def send(self, data: bytes) -> None:
        """All of data to its stdin (blocks while the process does not read); OSError or
        TransportError once it or the connection is gone."""

    @abstractmethod
    def recv(self, n: int) -> bytes:
        """Up to n bytes of its stdout, b'' at the end (blocks until some came)."""

    @abstractmethod
    def close(self) -> None:
        """Ends it: its stdin closes (it exits at once, see fleet.nodeside.ferry) and whatever
        waits on send or recv returns."""

    @abstractmethod
    def status(self, timeout: float) -> int | None:
        """Its exit status once it exited within `timeout`, else None."""

    def _keep_err(self, chunk: bytes) -> None:
        self._err += chunk
        del self._err[:-self.ERR_KEPT]

    def err(self) -> str:
        return self._err.decode("utf-8", "replace")


class Stream(Protocol):
    """One byte stream to a port on a node (a socket, or an SSH channel): what a forward
    relays."""

    def recv(self, n: int, /) -> bytes: ...
    def sendall(self, data: bytes, /) -> None: ...
    def shutdown(self, how: int, /) -> None: ...
    def close(self) -> None: ...


class Transport(ABC):
    """What fleet needs of a node: run a script, write a file, stream a script's output."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.home = ""
        self.shell = ""  # the login shell, as the node reports $SHELL
        self.noise = ""  # what the node's rc files print for every command
        self.sftp_problem: str | None = None  # why SFTP is not used, once tried
        self.sftp_garbled = False  # the server has SFTP, but rc-file output garbles it
        self.clock_offset = 0.0  # the node's clock minus this machine's, in seconds

    @abstractmethod
    def connect(self, hello: bool = True) -> None:
        """Connect; with `hello`, learn the node's home, shell, rc noise and clock (one round
        trip), which `path()` and the clock offset need."""

    @abstractmethod
    def run(self, script: str, timeout: float | None = 60.0, what: str = "") -> Result:
        """Run a POSIX sh script; `what` names it in errors (default: its first line)."""

    @abstractmethod
    def stream(self, script: str, on_lines: Callable[[list[str]], None],
               stop: threading.Event | None = None, received: Received | None = None) -> int:
        """Run a script, calling on_lines with the lines of its output (stderr merged) as they
        arrive, every line once and in order, several at a time where they came together (see
        Lines for lines too long or redrawn with "\\r"); returns its exit code, or -1 if
        `stop` ended it. `received` counts what came (see Received)."""

    @abstractmethod
    def pipe(self, script: str) -> Pipe:
        """Start a POSIX sh script that talks with this machine over its stdin and stdout (see
        Pipe); the script should `exec` its program."""

    @abstractmethod
    def open_port(self, address: str, port: int) -> Stream:
        """A TCP connection made from the node to address:port (as the node resolves it);
        PortClosed where nothing there accepts it, TransportError where the node is lost."""

    @abstractmethod
    def _put(self, path: str, data: bytes, mode: int) -> str:
        """Write data to a new file at path, mode set first; returns a problem seen, or ''."""

    def write(self, path: str, data: bytes, mode: int = 0o600, then: str = "",
              what: str = "") -> None:
        """Create or replace a file, atomically and verified; WriteError says why not. `then`
        runs on the node once the file is in place, in the same round trip (`what` names it);
        RemoteCommandError if it fails."""
        target = self.path(path)
        tmp = f"{target}.fleet-{secrets.token_hex(4)}"
        cause = self._put(tmp, data, mode)
        r = self.run(verify_script(tmp, target, data, mode, then), timeout=120,
                     what=f"write {target}")
        w = parse_verify(r.out)
        if not w.ok:
            raise WriteError(write_problem(self.host.name, target, len(data), w,
                                           cause or r.err.strip()))
        if not r.ok:
            raise RemoteCommandError(self.host.name, what or then, r.code, r.err or r.out)

    def _hello(self) -> None:
        """Home, login shell, rc noise, and the node's clock against this machine's."""
        t0 = time.time()
        r = self.run('printf "%s\\n%s\\n%s\\n" "$HOME" "${SHELL:-}" "$(date +%s.%N)"',
                     timeout=30, what="hello")
        lines = r.check(self.host.name).out.splitlines() + ["", "", ""]
        self.learnt(lines[0], lines[1], r.noise, lines[2], t0, time.time())

    def learnt(self, home: str, shell: str, noise: str, node_time: str, sent: float,
               received: float) -> None:
        """What a hello (or a probe, which says the same) told of the node."""
        self.home, self.shell, self.noise = home, shell, noise
        self.clock_offset = clock_offset(node_time, sent, received)

    def close(self) -> None:
        return None

    def path(self, p: str) -> str:
        """A node path with a leading ~ replaced by the node's home (learnt on connect)."""
        if p == "~" or p.startswith("~/"):
            return self.home.rstrip("/") + p[1:]
        return p

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def named(script: str, what: str) -> str:
    """How a script is named in errors: as the caller put it, else by its first line."""
    if what or not script.strip():
        return what
    return script.strip().splitlines()[0][:80]


def kill_on(stop: threading.Event | None, kill: Callable[[], None]) -> threading.Event | None:
    """Call kill() when `stop` is set; returns an event that retires the watcher."""
    if stop is None:
        return None
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if stop.wait(0.2):
                # A connection already closed (its run over, a restart's attempt ended) has no
                # stream left to end: its channel's close raises instead (EOFError and kin).
                with contextlib.suppress(Exception):
                    kill()
                return

    threading.Thread(target=watch, daemon=True).start()
    return done

