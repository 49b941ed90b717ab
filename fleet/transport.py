"""Transports: run commands, write files and stream output on one node, over SSH or locally."""

from __future__ import annotations

import os
import subprocess
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from fleet import hostkeys
from fleet.inventory import Host


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.code == 0


class TransportError(Exception):
    """A node cannot be reached, authenticated, or stopped answering (not a command's failure)."""


class Transport(ABC):
    """What fleet needs of a node: run, write a file, stream a command's output."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.home = ""

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def run(self, command: str, timeout: float | None = 60.0) -> Result: ...

    @abstractmethod
    def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Create or replace a file whose mode is set before any byte is written."""

    @abstractmethod
    def stream(self, command: str, on_line: Callable[[str], None],
               stop: threading.Event | None = None) -> int:
        """Run a command, calling on_line for each line of its output; returns its exit code."""

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


class LocalTransport(Transport):
    """This machine, as a node: plain subprocesses and files, no SSH server needed."""

    def connect(self) -> None:
        self.home = str(Path.home())

    def run(self, command: str, timeout: float | None = 60.0) -> Result:
        try:
            p = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                               timeout=timeout, stdin=subprocess.DEVNULL, errors="replace")
        except subprocess.TimeoutExpired as e:
            raise TransportError(f"command timed out after {timeout}s") from e
        return Result(p.returncode, p.stdout, p.stderr)

    def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        target = self.path(path)
        tmp = f"{target}.fleet-tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, target)

    def stream(self, command: str, on_line: Callable[[str], None],
               stop: threading.Event | None = None) -> int:
        p = subprocess.Popen(["/bin/sh", "-c", command], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        assert p.stdout is not None
        watcher = _kill_on(stop, p.kill)
        for raw in p.stdout:
            on_line(raw.decode("utf-8", "replace").rstrip("\n"))
        code = p.wait()
        if watcher:
            watcher.set()
        return code


def _kill_on(stop: threading.Event | None, kill: Callable[[], None]) -> threading.Event | None:
    """Call kill() when `stop` is set; returns an event that retires the watcher."""
    if stop is None:
        return None
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if stop.wait(0.2):
                kill()
                return

    threading.Thread(target=watch, daemon=True).start()
    return done


class SSHTransport(Transport):
    """A node over SSH (paramiko via Fabric's config), host keys verified, never auto-added."""

    KEEPALIVE_S = 5

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self._conn: object | None = None
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def connect(self) -> None:
        h = self.host
        conn = ssh_connection(h)
        try:
            conn.open()
        except hostkeys.UnknownHostKey as e:
            raise TransportError(
                f"unknown host key for {e.hostname} ({hostkeys.fingerprint(e.key)}); if that is "
                "the right key, record it with `fleet trust INVENTORY --accept` (or connect once "
                "with ssh and accept it)") from e
        except paramiko.BadHostKeyException as e:
            raise TransportError(
                f"HOST KEY CHANGED for {e.hostname}: got {hostkeys.fingerprint(e.key)}, expected "
                f"{hostkeys.fingerprint(e.expected_key)}. Someone may be intercepting the "
                "connection, or the host was reinstalled; check before you trust it") from e
        except paramiko.AuthenticationException as e:
            raise TransportError(
                f"authentication refused for {conn.user}@{conn.host}:{conn.port} ({e}); check "
                "`identity` in the inventory, ~/.ssh/config or ssh-agent") from e
        except (paramiko.SSHException, OSError) as e:
            raise TransportError(f"cannot connect to {conn.host}:{conn.port}: {e}") from e
        client: paramiko.SSHClient = conn.client
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(self.KEEPALIVE_S)
        self._conn, self._client = conn, client
        home = self.run('printf %s "$HOME"')
        self.home = home.out

    def _transport(self) -> paramiko.Transport:
        t = self._client.get_transport() if self._client else None
        if t is None or not t.is_active():
            raise TransportError(f"connection to {self.host.address} was lost")
        return t

    def run(self, command: str, timeout: float | None = 60.0) -> Result:
        try:
            chan = self._transport().open_session(timeout=10)
            chan.settimeout(timeout)
            chan.exec_command(command)
            err_parts: list[bytes] = []
            reader = threading.Thread(target=lambda: err_parts.append(_read_all(chan.recv_stderr)),
                                      daemon=True)
            reader.start()  # stdout and stderr drain together, or a chatty stderr can stall both
            out = _read_all(chan.recv)
            reader.join(timeout)
            err = b"".join(err_parts)
            code = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransportError(f"lost connection to {self.host.address}: {e}") from e
        if code == -1:
            raise TransportError(f"lost connection to {self.host.address} during a command")
        return Result(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        target = self.path(path)
        tmp = f"{target}.fleet-tmp"
        try:
            with self._lock:
                if self._sftp is None:
                    self._sftp = self._client.open_sftp()  # type: ignore[union-attr]
                sftp = self._sftp
            with sftp.open(tmp, "wb") as f:
                f.chmod(mode)
                f.set_pipelined(True)
                f.write(data)
            sftp.posix_rename(tmp, target)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransportError(f"cannot write {target} on {self.host.address}: {e}") from e

    def stream(self, command: str, on_line: Callable[[str], None],
               stop: threading.Event | None = None) -> int:
        try:
            chan = self._transport().open_session(timeout=10)
            chan.set_combine_stderr(True)
            chan.exec_command(command)
            watcher = _kill_on(stop, chan.close)
            buf = b""
            while True:
                chunk = chan.recv(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    on_line(line.decode("utf-8", "replace"))
            if buf:
                on_line(buf.decode("utf-8", "replace"))
            if watcher:
                watcher.set()
            if stop is not None and stop.is_set():
                return -1
            code = int(chan.recv_exit_status())
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransportError(f"lost connection to {self.host.address}: {e}") from e
        if code == -1:
            raise TransportError(f"lost connection to {self.host.address} while streaming")
        return code

    def close(self) -> None:
        for closable in (self._sftp, self._client):
            try:
                if closable is not None:
                    closable.close()
            except Exception:  # noqa: S110 - closing a dead connection may fail; nothing to do
                pass
        self._sftp = self._client = None


def _read_all(recv: Callable[[int], bytes]) -> bytes:
    parts: list[bytes] = []
    while True:
        chunk = recv(65536)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def ssh_connection(host: Host) -> Any:
    """A Fabric connection (not yet open): ssh_config applied (aliases, User, Port, IdentityFile,
    ProxyJump), the inventory's settings on top, host keys verified as fleet does."""
    from fabric import Config, Connection  # fabric is slow to import; only SSH needs it

    kwargs: dict[str, object] = {}
    if host.identity:
        kwargs["key_filename"] = [os.path.expanduser(host.identity)]
    conn = Connection(host.address, user=host.user, port=host.port, config=Config(),
                      connect_timeout=host.connect_timeout, connect_kwargs=kwargs)
    hostkeys.apply(conn, host)
    return conn


def open_transport(host: Host) -> Transport:
    """A connected transport for the host; raises TransportError with the reason."""
    t: Transport = LocalTransport(host) if host.transport == "local" else SSHTransport(host)
    t.connect()
    return t
