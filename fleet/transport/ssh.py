"""A node over SSH: scripts on the exec channel, files over SFTP (the exec channel where the
server has none, or where rc-file output garbles it), output streamed as it comes."""

from __future__ import annotations

import base64
import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Callable

import paramiko

from fleet.config.inventory import Host
from fleet.errors import CommandTimedOut, TransportError
from fleet.shell import quote
from fleet.transport.base import CHUNK, TICK_S, Pipe, Stream, Transport, kill_on, named
from fleet.transport.budget import MAX_SESSIONS, Budget, Slot
from fleet.transport.channels import PUT_CHUNK, Progress, SSHPipe, blocking, drain
from fleet.transport.connection import open_client
from fleet.transport.forward import direct_tcpip
from fleet.transport.framing import BOOT, Result, frame, unframe
from fleet.transport.lines import Lines, Received
from fleet.transport.trace import label, span

EXEC_CHUNK = 3 << 20  # bytes per command when a file goes over the exec channel
# Pauses before asking again for a session that sshd refused (see _open): about 6 s in all.
OPEN_S = 15.0  # a session's opening (one round trip): only a busy host is slower; < STALL_S
REFUSED_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0)


class SSHTransport(Transport):
    """A node over SSH (paramiko via Fabric's config), host keys verified, never auto-added."""

    STALL_S = 20.0  # a file write that moves no byte for this long: the node is lost

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_slot: Slot | None = None
        self._lock = threading.Lock()
        # Every session channel (a command, a stream, a pipe, SFTP) holds one of these while it
        # is open: sshd refuses a connection's 11th ("Connect failed"); here it waits its turn.
        self.sessions = Budget(MAX_SESSIONS)

    def connect(self, hello: bool = True) -> None:
        with span(self.host.name, "connect", self.host.address):
            self._client = open_client(self.host)
        if hello:
            self._hello()

    def _transport(self) -> paramiko.Transport:
        t = self._client.get_transport() if self._client else None
        if t is None or not t.is_active():
            raise TransportError(f"connection to {self.host.address} was lost")
        return t

    def _lost(self) -> str | None:
        t = self._client.get_transport() if self._client else None
        return None if t is not None and t.is_active() else \
            f"connection to {self.host.address} was lost"

    def _open(self) -> tuple[paramiko.Channel, Slot]:
        """A session channel, once the connection's budget has room for it (see MAX_SESSIONS);
        the slot goes back when the channel is closed."""
        for pause in (*REFUSED_PAUSES_S, None):
            slot = self.sessions.take(self._lost)
            try:
                return self._transport().open_session(timeout=OPEN_S), slot
            except paramiko.ChannelException as e:
                slot.release()
                # sshd frees a closed session only once it has read the close: a close and the
                # next open sent together meet a count one too high. Later it is free.
                if e.code != paramiko.common.OPEN_FAILED_CONNECT_FAILED:
                    raise
                if pause is None:
                    raise TransportError(
                        f"{self.host.name}'s sshd refused a new session ({e.text}) for "
                        f"{sum(REFUSED_PAUSES_S):.0f}s while fleet held at most {MAX_SESSIONS} "
                        "on its connection: is its MaxSessions set below that?") from e
                time.sleep(pause)
            except paramiko.SSHException as e:
                slot.release()
                if self._lost() is not None:
                    raise
                # The connection is up and sshd has not answered: too busy, not lost.
                raise TransportError(f"{self.host.name}'s sshd did not open a session within "
                                     f"{OPEN_S:.0f}s, its connection up: is it overloaded?"
                                     ) from e
            except BaseException:
                slot.release()
                raise
        raise AssertionError("unreachable")  # the last pass returns or raises

    def _session(self) -> tuple[paramiko.Channel, Slot]:
        chan, slot = self._open()
        try:
            chan.exec_command(BOOT)
        except BaseException:
            chan.close()
            slot.release()
            raise
        return chan, slot

    def run(self, script: str, timeout: float | None = 60.0, what: str = "") -> Result:
        what = named(script, what)
        with span(self.host.name, "run", what):
            return self._run(script, timeout, what)

    def _run(self, script: str, timeout: float | None, what: str) -> Result:
        token = secrets.token_hex(8)
        out: list[bytes] = []
        err: list[bytes] = []
        deadline: float | None = None

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        chan = slot = None
        try:
            chan, slot = self._session()
            # One deadline for the whole command once it has its channel (a wait for a free
            # one is this machine's queue, not the node's slowness): sending, both streams to
            # their end, the status.
            deadline = None if timeout is None else time.monotonic() + timeout
            chan.settimeout(timeout)  # for sending; the readers block until the stream ends
            # Both streams drain while the script is still being sent: a node that prints much
            # before it reads its input would otherwise stall both sides.
            readers = [threading.Thread(target=drain, args=(blocking(chan.recv_stderr), err),
                                        daemon=True),
                       threading.Thread(target=drain, args=(blocking(chan.recv), out),
                                        daemon=True)]
            for th in readers:
                th.start()
            chan.sendall(frame(script, token).encode())
            chan.shutdown_write()
            for th in readers:
                th.join(left())
            if any(th.is_alive() for th in readers) or not chan.status_event.wait(left()):
                raise CommandTimedOut(self.host.name, what, timeout)
            code = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as e:
            if isinstance(e, TimeoutError | socket.timeout):
                raise CommandTimedOut(self.host.name, what, timeout) from e
            raise TransportError(f"lost connection to {self.host.address}: {e}") from e
        finally:
            if chan is not None:
                chan.close()
            if slot is not None:
                slot.release()
        if code == -1:
            raise TransportError(f"lost connection to {self.host.address} during {what}")
        o, noise, started = unframe(b"".join(out).decode("utf-8", "replace"), token)
        er, enoise, _ = unframe(b"".join(err).decode("utf-8", "replace"), token)
        if not started:
            # The login shell could not run /bin/sh: say what it printed instead.
            return Result(what, code or 127, "", (noise + enoise).strip() or
                          f"{BOOT} did not start under the login shell", noise + enoise)
        return Result(what, code, o, er, noise + enoise)

    def _put(self, path: str, data: bytes, mode: int) -> str:
        progress = Progress(self.STALL_S, self._abort)
        sftp = None
        try:
            with progress, span(self.host.name, "put", path):
                sftp = self._sftp_client()
                if sftp is not None:
                    with sftp.open(path, "wb") as f:
                        f.chmod(mode)
                        f.set_pipelined(True)
                        for off in range(0, len(data), PUT_CHUNK):
                            f.write(data[off:off + PUT_CHUNK])
                            progress.moved()
        except (paramiko.SFTPError, paramiko.SSHException, OSError, EOFError) as e:
            if progress.stalled:
                done = progress.sent(len(data))
                raise TransportError(
                    f"no progress writing {path} for {self.STALL_S:.0f}s ({done}); "
                    f"{self.host.name} stopped answering (a cut link, a frozen host?)") from e
            if not isinstance(e, paramiko.SFTPError):
                return f"SFTP: {e}"
            # The subsystem spoke garbage mid-way (an rc file that prints only sometimes):
            # not a problem of the file; the exec channel carries this and every later one.
            self._drop_sftp(e)
            return self._exec_put(path, data, mode)
        if sftp is None:  # outside the watch: the exec channel has a deadline per chunk
            return self._exec_put(path, data, mode)
        return ""

    def _exec_put(self, path: str, data: bytes, mode: int) -> str:
        """A file through the exec channel, base64 in a here-document, in chunks."""
        problem = ""
        for i, off in enumerate(range(0, max(len(data), 1), EXEC_CHUNK)):
            b64 = base64.encodebytes(data[off:off + EXEC_CHUNK]).decode()
            first = f"umask 077; : > {quote(path)} && chmod {mode:o} {quote(path)} && " \
                if i == 0 else ""
            r = self.run(f"{first}base64 -d >> {quote(path)} <<'FLEET_DATA'\n{b64}FLEET_DATA",
                         timeout=120, what=f"write {path}")
            if not r.ok:
                problem = r.err.strip() or f"exit {r.code}"
                break
        return problem

    def _sftp_client(self) -> paramiko.SFTPClient | None:
        """The SFTP session, opened once; None where the server has none, or where it does not
        speak SFTP: Debian's stock `Subsystem sftp /usr/lib/openssh/sftp-server` is started
        through the login shell, so an rc file that prints puts its text before the protocol
        (paramiko: SFTPError "Garbage packet received"). The exec channel then carries files."""
        with self._lock:
            if self._sftp is None and self.sftp_problem is None:
                try:
                    self._sftp = self._open_sftp()
                except TimeoutError as e:  # not a missing subsystem: a node not answering
                    raise TransportError(f"no answer opening SFTP in {self.STALL_S:.0f}s: "
                                         f"{self.host.name} stopped answering (a cut link, a "
                                         "frozen host?)") from e
                except paramiko.SFTPError as e:
                    self.sftp_garbled = True
                    self.sftp_problem = f"the sftp-server's output is garbled ({e}): the login " \
                        "shell's rc files print before it starts"
                except (paramiko.SSHException, OSError, EOFError) as e:
                    self.sftp_problem = str(e) or type(e).__name__
            return self._sftp

    def _open_sftp(self) -> paramiko.SFTPClient:
        """paramiko's open_sftp with deadlines: a node that stopped answering fails the opening
        in seconds instead of paramiko's hour."""
        try:
            chan, slot = self._open()
        except paramiko.SSHException as e:
            if "Timeout" in str(e):
                raise TimeoutError(str(e)) from e
            raise
        try:
            chan.settimeout(self.STALL_S)  # the subsystem's start and its version answer
            chan.invoke_subsystem("sftp")
            sftp = paramiko.SFTPClient(chan)
        except BaseException:
            chan.close()
            slot.release()
            raise
        chan.settimeout(None)  # from here each write's progress is watched (Progress)
        self._sftp_slot = slot  # held while the SFTP session is open
        return sftp

    def _abort(self) -> None:
        """Drop the connection at once, from any thread: whatever waits on it (a write stuck on
        a dead link holds the transport's write lock) fails now. A polite close() would queue
        a message behind that stuck write and wait with it."""
        t = self._client.get_transport() if self._client is not None else None
        if t is not None:
            t.close()

    def _drop_sftp(self, e: Exception) -> None:
        with self._lock:
            sftp, self._sftp = self._sftp, None
            slot, self._sftp_slot = self._sftp_slot, None
            self.sftp_garbled = True
            self.sftp_problem = f"the sftp-server's output is garbled ({e})"
        with contextlib.suppress(Exception):
            if sftp is not None:
                sftp.close()
        if slot is not None:
            slot.release()

    def pipe(self, script: str) -> Pipe:
        """The login shell runs only `/bin/sh -s`, which reads the script from the channel; the
        program it execs reads the rest. Nothing else is sent before the program speaks first,
        so the shell cannot have read any of it."""
        try:
            with span(self.host.name, "pipe", label(script)):
                chan, slot = self._session()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransportError(f"lost connection to {self.host.address}: {e}") from e
        pipe = SSHPipe(chan, slot)
        try:
            chan.sendall(script.encode() + b"\n")
        except (paramiko.SSHException, OSError, EOFError) as e:
            pipe.close()
            raise TransportError(f"lost connection to {self.host.address}: {e}") from e
        return pipe

    def open_port(self, address: str, port: int) -> Stream:
        # Not a session: sshd's MaxSessions counts shells, commands and subsystems only, and a
        # forward bounds its own connections (forward.MAX_CONNECTIONS).
        with span(self.host.name, "port", f"{address}:{port}"):
            return direct_tcpip(self._transport(), self.host, address, port)

    def sftp_available(self) -> bool:
        return self._sftp_client() is not None

    def stream(self, script: str, on_lines: Callable[[list[str]], None],
               stop: threading.Event | None = None, received: Received | None = None) -> int:
        with span(self.host.name, "stream", label(script)):
            return self._stream(script, on_lines, stop, received)

    def _stream(self, script: str, on_lines: Callable[[list[str]], None],
                stop: threading.Event | None, received: Received | None) -> int:
        token = secrets.token_hex(8)
        lines = Lines(token, on_lines, received)
        slot = None
        try:
            chan, slot = self._session()
            chan.sendall(frame(script, token, merge_stderr=True).encode())
            chan.shutdown_write()
            watcher = kill_on(stop, chan.close)
            noise: list[bytes] = []
            threading.Thread(target=drain, args=(chan.recv_stderr, noise), daemon=True).start()
            chan.settimeout(TICK_S)  # a quiet stream still shows a progress state held back
            while True:
                try:
                    chunk = chan.recv(CHUNK)
                except TimeoutError:
                    lines.tick()
                    continue
                if not chunk:
                    break
                lines.feed(chunk)
            lines.close()
            if watcher:
                watcher.set()
            if stop is not None and stop.is_set():
                return -1
            code = int(chan.recv_exit_status())
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransportError(f"lost connection to {self.host.address}: {e}") from e
        finally:
            if slot is not None:
                with contextlib.suppress(Exception):
                    chan.close()
                slot.release()
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
        if self._sftp_slot is not None:
            self._sftp_slot.release()
            self._sftp_slot = None
