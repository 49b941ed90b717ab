"""Transports: run scripts, write files and stream output on one node, over SSH or locally.

A node's login shell may be bash, zsh, dash, fish or tcsh, and its rc files may print banners.
So the login shell only ever sees one trivial command, `/bin/sh -s`, and the real script reaches
that POSIX shell on stdin, framed by markers that no banner can forge: what fleet parses is only
what the script printed between them. Files go over SFTP where the server offers it and over the
exec channel where it does not, and every write is checked (size and SHA-256) before it replaces
the target, so a full disk is an error that says so instead of an empty script.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import secrets
import select
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paramiko

from fleet.config import hostkeys
from fleet.config.inventory import Host
from fleet.errors import CommandTimedOut, RemoteCommandError, TransportError, WriteError
from fleet.nodedata import number
from fleet.shell import quote

# What the login shell runs: no quotes, no operators, the same in every shell.
BOOT = "/bin/sh -s"
EXEC_CHUNK = 3 << 20  # bytes per command when a file goes over the exec channel
PUT_CHUNK = 1 << 20  # bytes per SFTP write call: the unit of progress a stalled write is seen by
CHUNK = 65536  # bytes read from a stream at a time
TICK_S = 1.0  # a stream with nothing to read looks up from its read this often


@dataclass(frozen=True)
class Result:
    """A script's outcome on a node: only what the script itself printed, noise set apart."""

    command: str  # what it was for, as the user would name it
    code: int
    out: str
    err: str
    noise: str = ""  # what the login shell's rc files printed before the script ran

    @property
    def ok(self) -> bool:
        return self.code == 0

    def check(self, host: str) -> Result:
        """This result, or a RemoteCommandError naming the host, the command and its output."""
        if not self.ok:
            raise RemoteCommandError(host, self.command, self.code, self.err or self.out)
        return self


# ---- framing: pure, unit-tested -------------------------------------------------------------
def frame(script: str, token: str, merge_stderr: bool = False) -> str:
    """The text fed to `/bin/sh -s`: markers on both streams around the script, which runs in a
    subshell (parsed whole before it starts) with stdin from /dev/null."""
    begin, end = f"FLEET-{token}-BEGIN", f"FLEET-{token}-END"
    merge = "exec 2>&1\n" if merge_stderr else ""
    return (f"printf '\\n%s\\n' {begin}; printf '\\n%s\\n' {begin} >&2\n"
            f"(\n{merge}{script}\n) </dev/null\n"
            "fleet_status=$?\n"
            f"printf '\\n%s\\n' {end}; printf '\\n%s\\n' {end} >&2\n"
            "exit $fleet_status\n")


def unframe(raw: str, token: str) -> tuple[str, str, bool]:
    """(what the script printed, what came before it, whether the script started at all)."""
    begin, end = f"\nFLEET-{token}-BEGIN\n", f"\nFLEET-{token}-END\n"
    at = raw.find(begin)
    if at < 0:
        return "", raw, False
    body = raw[at + len(begin):]
    stop = body.rfind(end)
    return (body[:stop] if stop >= 0 else body), raw[:at], True


def verify_script(tmp: str, target: str, data: bytes, mode: int, then: str = "") -> str:
    """Replaces target with tmp only if tmp holds exactly `data`, then runs `then` (its status
    is the script's); else says what arrived and how much room is left (see parse_verify)."""
    size, digest = len(data), hashlib.sha256(data).hexdigest()
    t, dest = quote(tmp), quote(target)
    return "\n".join([
        f"got=$(wc -c < {t} 2>/dev/null | tr -d ' ')",
        f"sum={digest}",
        f"command -v sha256sum >/dev/null 2>&1 && sum=$(sha256sum < {t} | cut -c1-64)",
        f'if [ "$got" = {size} ] && [ "$sum" = {digest} ]; then',
        f"  if chmod {mode:o} {t} && mv -f {t} {dest}; then",
        "    echo written",
        f"    {then or 'true'}",
        "    exit $?",
        "  fi",
        "fi",
        f"rm -f {t}",
        'echo "got=${got:-0}"',
        f'df -Pk "$(dirname {dest})" 2>/dev/null | tail -n 1 | sed "s/^/df=/"',
        "exit 1",
    ])


@dataclass(frozen=True)
class Written:
    ok: bool
    got: int = 0  # bytes that arrived, when not ok
    free_kib: int | None = None
    mount: str = ""


def parse_verify(out: str) -> Written:
    if "written" in out.split():
        return Written(True)
    got, free, mount = 0, None, ""
    for line in out.splitlines():
        if line.startswith("got=") and (n := number(line[4:])) is not None:
            got = n
        elif line.startswith("df="):
            fields = line[3:].split()
            if len(fields) >= 6 and (kib := number(fields[3])) is not None:
                free, mount = kib, fields[5]
    return Written(False, got, free, mount)


def write_problem(host: str, target: str, size: int, w: Written, cause: str = "") -> str:
    """The message for a write that did not arrive whole, with the likely cause and the fix."""
    msg = f"cannot write {target} on {host}: {w.got} of {size} bytes arrived"
    if w.free_kib is not None and w.free_kib * 1024 < max(size, 1 << 20):
        return (f"{msg}; the disk or your quota is full ({w.free_kib} KiB free on {w.mount}). "
                "Free space there, or set `workdir` for this host to a larger disk")
    return msg + (f" ({cause})" if cause else "") + \
        "; check the permissions of the directory and that its filesystem is writable"


def clock_offset(node_time: str, sent: float, received: float) -> float:
    """The node's clock minus this machine's, from the node's time stamp taken between `sent`
    and `received`. The stamp is the script's last act, after the login shell's rc files (which
    may take seconds): it is compared with `received`, off by the way back alone, not with the
    midpoint of a round trip that rc files may have made lopsided."""
    try:
        return float(node_time) - received if sent <= received else 0.0
    except ValueError:
        return 0.0


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


class _SSHPipe(Pipe):
    def __init__(self, chan: paramiko.Channel) -> None:
        super().__init__()
        self.chan = chan
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

    def status(self, timeout: float) -> int | None:
        if not self.chan.status_event.wait(timeout):
            return None
        return int(self.chan.recv_exit_status())


class _LocalPipe(Pipe):
    def __init__(self, script: str) -> None:
        super().__init__()
        self.p = subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                  start_new_session=True)
        threading.Thread(target=self._drain_err, daemon=True).start()

    def _drain_err(self) -> None:
        assert self.p.stderr is not None
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(self.p.stderr.fileno(), CHUNK):
                self._keep_err(chunk)

    def send(self, data: bytes) -> None:
        assert self.p.stdin is not None
        try:
            self.p.stdin.write(data)
        except ValueError as e:  # closed here
            raise OSError("closed") from e

    def recv(self, n: int) -> bytes:
        assert self.p.stdout is not None
        try:
            return os.read(self.p.stdout.fileno(), n)
        except (OSError, ValueError):
            return b""

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.p.stdin is not None
            self.p.stdin.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.p.pid, 9)

    def status(self, timeout: float) -> int | None:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


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
        _Lines for lines too long or redrawn with "\\r"); returns its exit code, or -1 if
        `stop` ended it. `received` counts what came (see Received)."""

    @abstractmethod
    def pipe(self, script: str) -> Pipe:
        """Start a POSIX sh script that talks with this machine over its stdin and stdout (see
        Pipe); the script should `exec` its program."""

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


def _what(script: str, what: str) -> str:
    """How a script is named in errors: as the caller put it, else by its first line."""
    if what or not script.strip():
        return what
    return script.strip().splitlines()[0][:80]


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
            raise CommandTimedOut(self.host.name, _what(script, what), timeout) from e
        return Result(_what(script, what), p.returncode, p.stdout, p.stderr)

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

    def stream(self, script: str, on_lines: Callable[[list[str]], None],
               stop: threading.Event | None = None, received: Received | None = None) -> int:
        p = subprocess.Popen(["/bin/sh", "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        assert p.stdout is not None
        watcher = _kill_on(stop, p.kill)
        lines = _Lines(None, on_lines, received)
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


# How a stream's bytes become lines: a line ends at "\n" (or "\r\n"); a "\r" alone ends one state
# of a line redrawn in place (a progress bar); no line may hold more than LINE_CAP bytes.
LINE_CAP = 1 << 20
PROGRESS_S = 5.0  # at most one interim state of a redrawn line a stream, this often
_EOL = re.compile(rb"\r\n|\r|\n")


class Partial(str):
    """An entry of a stream that ends no line of the output: a piece of a line longer than
    LINE_CAP, an interim state of a line redrawn with carriage returns, or fleet's note on a
    line it cut. Whoever counts the output's lines skips these."""


class Received:
    """What one stream has taken so far. `offset`: bytes of the script's output up to the end of
    the last line (or piece) handed on, where a stream resumed on another connection begins
    again. `arrived`: when any byte last came, the hang watchdog's clock (a progress bar that
    redraws its line with "\\r" prints, though it ends no line)."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset
        self.arrived = time.monotonic()


class _Lines:
    """Splits a byte stream into lines and hands on those after the start marker (all of them
    without a token), a chunk's worth at a time. Linear in the bytes fed, and never holding
    more than LINE_CAP plus a chunk: a longer line is handed on in pieces, then a note says
    so. Of a line redrawn with "\\r", its last state is the line, and interim states are
    handed on as they come, at most one every PROGRESS_S (else the newest is held, and given
    at the next chunk or tick() past that time). A state is whole once the next "\\r" came,
    or once the stream has been quiet for a tick: the bar of a slow loop is seen then."""

    def __init__(self, token: str | None, on_lines: Callable[[list[str]], None],
                 received: Received | None = None, clock: Callable[[], float] = time.monotonic,
                 cap: int = LINE_CAP, progress_s: float = PROGRESS_S) -> None:
        self.begin = f"FLEET-{token}-BEGIN".encode() if token else b""
        self.end = f"FLEET-{token}-END".encode() if token else b""
        self.on_lines = on_lines
        self.received = received or Received()
        self.clock, self.cap, self.progress_s = clock, cap, progress_s
        self.started = token is None
        self.buf = bytearray()
        self.pending_blank = False  # the blank line printed before the end marker
        self.pieces = 0  # pieces of the current line handed on already
        self.piece_bytes = 0
        self.held: str | None = None  # the newest interim state not yet shown
        self.redrawn = False  # the current line had a "\r"
        self.tail_shown = False  # its state after the last "\r" was shown by tick()
        self.shown_at = -progress_s
        self.copied = 0  # bytes copied here (appended, decoded, moved): linear in the input

    def feed(self, chunk: bytes) -> None:
        self.received.arrived = self.clock()
        out: list[str] = []
        buf = self.buf
        # Every end of line before this chunk was taken, but for a "\r" at its very end.
        scan = max(len(buf) - 1, 0)
        buf += chunk
        self.copied += len(chunk)
        pos = 0
        for m in _EOL.finditer(buf, scan):
            if m.end() == len(buf) and m.group() == b"\r":
                break  # maybe the first half of "\r\n": the next chunk says
            self._segment(buf, pos, m.start(), m.end(), m.group() != b"\r", out)
            pos = m.end()
        if pos:
            del buf[:pos]
            self.copied += len(buf)
        while len(buf) > self.cap:
            self._piece(out)
        self._show_held(out)
        if out:
            self.on_lines(out)

    def tick(self) -> None:
        """Time passed with no bytes: an interim state held back is due now, maybe, or else
        the state the line was last redrawn with."""
        out: list[str] = []
        if (self.held is None and self.redrawn and self.started and not self.tail_shown
                and not self.pieces and self.buf and not self.buf.endswith(b"\r")):
            self.held = self._text(self.buf, 0, len(self.buf))
            self.tail_shown = True
        self._show_held(out)
        if self.held is not None and self.tail_shown:
            self.held, self.tail_shown = None, False  # not due yet: the next tick tries again
        if out:
            self.on_lines(out)

    def close(self) -> None:
        out: list[str] = []
        if self.buf:
            eol = 1 if self.buf.endswith(b"\r") else 0
            self._segment(self.buf, 0, len(self.buf) - eol, len(self.buf), not eol, out)
            self.buf.clear()
        self._show_held(out, force=True)
        if out:
            self.on_lines(out)

    def _text(self, buf: bytearray, start: int, stop: int) -> str:
        self.copied += stop - start
        with memoryview(buf) as view:
            return str(view[start:stop], "utf-8", "replace")

    def _segment(self, buf: bytearray, start: int, stop: int, end: int, whole: bool,
                 out: list[str]) -> None:
        """buf[start:stop], ended at `end` by a newline (`whole`) or by a lone "\\r"."""
        if not self.started:
            # The marker is a whole line of its own, never the end of a cut one.
            self.started = whole and not self.pieces and self._is(buf, start, stop, self.begin)
            self.pieces = 0
            return
        self.received.offset += end - start
        if self.end and whole and not self.pieces and self._is(buf, start, stop, self.end):
            self.pending_blank = False
            self.started = False  # anything after the end marker is noise too
            return
        shown, self.tail_shown = self.tail_shown, False
        self.redrawn = not whole
        if self.pieces:
            self._last_piece(self._text(buf, start, stop), stop - start, whole, out)
        elif whole:
            self.held = None  # its last state is the line itself
            self._whole(self._text(buf, start, stop), out)
        elif stop > start and not shown:
            self.held = self._text(buf, start, stop)

    @staticmethod
    def _is(buf: bytearray, start: int, stop: int, marker: bytes) -> bool:
        return stop - start == len(marker) and buf[start:stop] == marker

    def _whole(self, line: str, out: list[str]) -> None:
        if self.pending_blank:
            out.append("")
        self.pending_blank = line == ""
        if not self.pending_blank:
            out.append(line)

    def _piece(self, out: list[str]) -> None:
        """The first LINE_CAP bytes of a line too long to hold, cut where no UTF-8 character
        is split."""
        buf = self.buf
        cut = self.cap
        while cut > self.cap - 3 and buf[cut] & 0xC0 == 0x80:
            cut -= 1
        if buf[cut] & 0xC0 == 0x80:
            cut = self.cap  # not UTF-8 anyway
        if self.started:
            self.held = None  # this piece is the newer state
            self._flush_blank(out)
            out.append(Partial(self._text(buf, 0, cut)))
            self.received.offset += cut
        self.pieces += 1
        self.piece_bytes += cut
        del buf[:cut]
        self.copied += len(buf)

    def _last_piece(self, text: str, size: int, whole: bool, out: list[str]) -> None:
        size += self.piece_bytes
        out.append(text if whole else Partial(text))
        out.append(Partial(f"[fleet: the {'line' if whole else 'redrawn line'} above was "
                           f"{size} bytes long, more than the {self.cap} a line may have: it "
                           f"is shown in {self.pieces + 1} pieces]"))
        self.pieces = self.piece_bytes = 0
        self.held = None

    def _show_held(self, out: list[str], force: bool = False) -> None:
        now = self.clock()
        if self.held is not None and (force or now - self.shown_at >= self.progress_s):
            self._flush_blank(out)
            out.append(Partial(self.held))
            self.held = None
            self.shown_at = now

    def _flush_blank(self, out: list[str]) -> None:
        """A blank line held back (it might have been the end marker's) is output after all."""
        if self.pending_blank:
            out.append("")
            self.pending_blank = False


class _Progress:
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
        return f"{min(self.count * PUT_CHUNK, total)} of {total} bytes sent"

    def _watch(self) -> None:
        while not self.done.wait(min(1.0, self.limit / 4)):
            if time.monotonic() - self.last > self.limit:
                self.stalled = True
                self.give_up()
                return

    def __enter__(self) -> _Progress:
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()


class SSHTransport(Transport):
    """A node over SSH (paramiko via Fabric's config), host keys verified, never auto-added."""

    KEEPALIVE_S = 5
    STALL_S = 20.0  # a file write that moves no byte for this long: the node is lost

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def connect(self, hello: bool = True) -> None:
        h = self.host
        conn = ssh_connection(h)
        try:
            if conn.gateway is None:  # a direct connection: made here, tuned before any packet
                conn.connect_kwargs["sock"] = _tcp(conn.host, conn.port, conn.connect_timeout)
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
        for t in (transport, _gateway_transport(conn)):
            _no_delay(t)
        self._client = client
        if hello:
            self._hello()

    def _transport(self) -> paramiko.Transport:
        t = self._client.get_transport() if self._client else None
        if t is None or not t.is_active():
            raise TransportError(f"connection to {self.host.address} was lost")
        return t

    def _session(self) -> paramiko.Channel:
        chan = self._transport().open_session(timeout=10)
        chan.exec_command(BOOT)
        return chan

    def run(self, script: str, timeout: float | None = 60.0, what: str = "") -> Result:
        what = _what(script, what)
        token = secrets.token_hex(8)
        out: list[bytes] = []
        err: list[bytes] = []
        # One deadline for the whole command: sending, both streams to their end, the status.
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        chan = None
        try:
            chan = self._session()
            chan.settimeout(timeout)  # for sending; the readers block until the stream ends
            # Both streams drain while the script is still being sent: a node that prints much
            # before it reads its input would otherwise stall both sides.
            readers = [threading.Thread(target=_drain, args=(_blocking(chan.recv_stderr), err),
                                        daemon=True),
                       threading.Thread(target=_drain, args=(_blocking(chan.recv), out),
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
        progress = _Progress(self.STALL_S, self._abort)
        sftp = None
        try:
            with progress:
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
            chan = self._transport().open_session(timeout=10)
        except paramiko.SSHException as e:
            if "Timeout" in str(e):
                raise TimeoutError(str(e)) from e
            raise
        chan.settimeout(self.STALL_S)  # the subsystem's start and its version answer
        chan.invoke_subsystem("sftp")
        sftp = paramiko.SFTPClient(chan)
        chan.settimeout(None)  # from here each write's progress is watched (_Progress)
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
            self.sftp_garbled = True
            self.sftp_problem = f"the sftp-server's output is garbled ({e})"
        with contextlib.suppress(Exception):
            if sftp is not None:
                sftp.close()

    def pipe(self, script: str) -> Pipe:
        """The login shell runs only `/bin/sh -s`, which reads the script from the channel; the
        program it execs reads the rest. Nothing else is sent before the program speaks first,
        so the shell cannot have read any of it."""
        try:
            chan = self._session()
            chan.sendall(script.encode() + b"\n")
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise TransportError(f"lost connection to {self.host.address}: {e}") from e
        return _SSHPipe(chan)

    def sftp_available(self) -> bool:
        return self._sftp_client() is not None

    def stream(self, script: str, on_lines: Callable[[list[str]], None],
               stop: threading.Event | None = None, received: Received | None = None) -> int:
        token = secrets.token_hex(8)
        lines = _Lines(token, on_lines, received)
        try:
            chan = self._session()
            chan.sendall(frame(script, token, merge_stderr=True).encode())
            chan.shutdown_write()
            watcher = _kill_on(stop, chan.close)
            noise: list[bytes] = []
            threading.Thread(target=_drain, args=(chan.recv_stderr, noise), daemon=True).start()
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


def _tcp(host: str, port: int, timeout: float | None) -> socket.socket:
    """The TCP connection an SSH session runs over (IPv4 or IPv6), with TCP_NODELAY."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _no_delay(t: paramiko.Transport | None) -> None:
    """TCP_NODELAY on the connection's socket. Each command is a few small SSH packets (open a
    channel, exec, data, EOF); with Nagle's algorithm the later ones wait for the server's
    delayed ACK, about 40 ms a round trip (measured: 48 ms a `true`, 3-5 ms without)."""
    sock = getattr(t, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):  # not TCP: nothing to tune
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _gateway_transport(conn: Any) -> paramiko.Transport | None:
    """The jump host's own connection, where ProxyJump opened one."""
    client = getattr(getattr(conn, "gateway", None), "client", None)
    return client.get_transport() if isinstance(client, paramiko.SSHClient) else None


def _blocking(recv: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """recv that waits through the channel's send timeout: a quiet command is not an ended one
    (the caller's deadline decides when to give up)."""
    def read(n: int) -> bytes:
        while True:
            try:
                return recv(n)
            except TimeoutError:
                continue
    return read


def _drain(recv: Callable[[int], bytes], into: list[bytes]) -> None:
    try:
        while True:
            chunk = recv(65536)
            if not chunk:
                return
            into.append(chunk)
    except (OSError, EOFError, paramiko.SSHException):
        return


def _aead_first(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport, asking for AES-GCM before its default AES-CTR with HMAC-SHA2: one
    pass over the data instead of two (measured on the testbed, a raw channel: 370 MB/s against
    210-260). A server without GCM (OpenSSH has it since 6.2) still agrees on CTR."""
    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    aead = tuple(c for c in opts.ciphers if c.endswith("-gcm@openssh.com"))
    opts.ciphers = aead + tuple(c for c in opts.ciphers if c not in aead)
    return t


def ssh_connection(host: Host) -> Any:
    """A Fabric connection (not yet open): ssh_config applied (aliases, User, Port, IdentityFile,
    ProxyJump), the inventory's settings on top, host keys verified as fleet does."""
    from fabric import Config, Connection  # fabric is slow to import; only SSH needs it

    kwargs: dict[str, object] = {"transport_factory": _aead_first}
    if host.identity:
        kwargs["key_filename"] = [os.path.expanduser(host.identity)]
    conn = Connection(host.address, user=host.user, port=host.port, config=Config(),
                      connect_timeout=host.connect_timeout, connect_kwargs=kwargs)
    hostkeys.apply(conn, host)
    return conn


def open_transport(host: Host, hello: bool = True) -> Transport:
    """A connected transport for the host (see Transport.connect); raises TransportError with
    the reason."""
    t: Transport = LocalTransport(host) if host.transport == "local" else SSHTransport(host)
    t.connect(hello)
    return t
