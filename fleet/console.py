"""Terminal output: phase lines on stderr, the tagged log stream on stdout, NO_COLOR honoured;
whatever a node said is made harmless to the terminal first (`printable`)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TextIO

_COLORS = ("36", "33", "35", "32", "34", "91", "96", "93")


def _visible(code: int) -> str:
    """How a control character is shown: caret notation for C0 and DEL (as `cat -v` and less
    do: ESC is ^[), <U+XXXX> for the rest."""
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    return f"<U+{code:04X}>"


# What a terminal obeys rather than shows: C0 but tab (ESC starts every escape sequence, CR and
# BS overwrite what is on the line), DEL, C1 (CSI, OSC... in one byte), the line and paragraph
# separators, and the bidi controls that show text in another order than it is.
_CONTROLS = [*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F, *range(0x80, 0xA0), 0x061C,
             0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_LINE = str.maketrans({c: _visible(c) for c in _CONTROLS})
_LINES = str.maketrans({c: _visible(c) for c in _CONTROLS if c != 0x0A})


def printable(text: str, lines: bool = False) -> str:
    """Text from a node (a log line, a traceback, a file name) as it may reach a terminal: every
    control character shown instead of obeyed (ESC as ^[, CR as ^M, U+202E as <U+202E>), the
    rest (UTF-8 text, tabs) unchanged. With `lines`, newlines stay line breaks."""
    return text.translate(_LINES if lines else _LINE)


class Console:
    def __init__(self, out: TextIO | None = None, err: TextIO | None = None,
                 color: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        if color is None:
            color = "NO_COLOR" not in os.environ and self.out.isatty()
        self.color = color
        self._lock = threading.Lock()
        self._width = 0
        self.drawn = False  # a redrawn line (a progress bar) is on the terminal, unended

    def hosts(self, names: list[str]) -> None:
        """Align tags for these host names."""
        self._width = max((len(n) for n in names), default=0)

    def _paint(self, text: str, index: int) -> str:
        if not self.color:
            return text
        return f"\033[{_COLORS[index % len(_COLORS)]}m{text}\033[0m"

    def phase(self, host: str, message: str) -> None:
        with self._lock:
            self._clear()
            self._print(printable(f"fleet: {host:<{self._width}}  {message}", lines=True),
                        self.err)

    def info(self, message: str) -> None:
        with self._lock:
            self._clear()
            self._print(printable(f"fleet: {message}", lines=True), self.err)

    def redraw(self, text: str) -> None:
        """One line drawn over the last one (a progress bar), on a terminal; the next line
        printed takes its place."""
        with self._lock, contextlib.suppress(OSError, ValueError):
            self.err.write("\r\033[K" + printable(text))
            self.err.flush()
            self.drawn = True

    def settle(self) -> None:
        """The redrawn line, if any, erased (its work is over)."""
        with self._lock:
            self._clear()
            with contextlib.suppress(OSError, ValueError):
                self.err.flush()

    def _clear(self) -> None:
        if self.drawn:
            self.drawn = False
            with contextlib.suppress(OSError, ValueError):
                self.err.write("\r\033[K")

    def line(self, tag: str, index: int, text: str) -> None:
        self.lines(index, [(tag, text)])

    def lines(self, index: int, tagged: list[tuple[str, str]]) -> None:
        """Log lines of one node, printed together: one write for all of them."""
        if tagged:
            # A CR that ends a line (CRLF) shows nothing: only one inside a line is marked.
            block = "\n".join(self._paint(printable(tag), index) + " | "
                               + printable(text.removesuffix("\r")) for tag, text in tagged)
            with self._lock:
                self._print(block, self.out)

    @staticmethod
    def _print(text: str, stream: TextIO) -> None:
        """Best effort: a reader gone (`fleet up | head`) or a full disk must not stop fleet
        from following and tearing down the run; the job's log stays on the nodes."""
        with contextlib.suppress(OSError, ValueError):
            print(text, file=stream, flush=True)
