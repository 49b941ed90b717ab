"""A stream's bytes as lines, pure and I/O-free: bounded memory, linear time, lines redrawn with
"\\r" (progress bars) shown now and then, and the byte offset a broken stream resumes from."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

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


class Lines:
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
