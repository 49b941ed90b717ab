"""Terminal output: phase lines on stderr, the tagged log stream on stdout, NO_COLOR honoured."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TextIO

_COLORS = ("36", "33", "35", "32", "34", "91", "96", "93")


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

    def hosts(self, names: list[str]) -> None:
        """Align tags for these host names."""
        self._width = max((len(n) for n in names), default=0)

    def _paint(self, text: str, index: int) -> str:
        if not self.color:
            return text
        return f"\033[{_COLORS[index % len(_COLORS)]}m{text}\033[0m"

    def phase(self, host: str, message: str) -> None:
        with self._lock:
            self._print(f"fleet: {host:<{self._width}}  {message}", self.err)

    def info(self, message: str) -> None:
        with self._lock:
            self._print(f"fleet: {message}", self.err)

    def line(self, tag: str, index: int, text: str) -> None:
        self.lines(index, [(tag, text)])

    def lines(self, index: int, tagged: list[tuple[str, str]]) -> None:
        """Log lines of one node, printed together: one write for all of them."""
        if tagged:
            with self._lock:
                self._print("\n".join(f"{self._paint(tag, index)} | {text}"
                                      for tag, text in tagged), self.out)

    @staticmethod
    def _print(text: str, stream: TextIO) -> None:
        """Best effort: a reader gone (`fleet up | head`) or a full disk must not stop fleet
        from following and tearing down the run; the job's log stays on the nodes."""
        with contextlib.suppress(OSError, ValueError):
            print(text, file=stream, flush=True)


def ranges(values: list[int]) -> str:
    """Sorted integers as runs: [0, 1, 2, 5] -> "0-2, 5"."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
