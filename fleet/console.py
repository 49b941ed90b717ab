"""Terminal output: phase lines on stderr, the tagged log stream on stdout; on a terminal colour by
meaning, a spinner or bar for every wait and tables that fit its width (drawn with rich), and
plain, stable lines otherwise; whatever a node said is made harmless first (`printable`).
rich is imported where something is drawn with it: fleet starts without it (fleet.cli)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from enum import Enum
from typing import TYPE_CHECKING, TextIO

from fleet import events as ev
from fleet.banners import Banner
from fleet.nodeside.shared.scrub import printable as printable  # the node's rule too
from fleet.phrases import terminal_words, wait_words
from fleet.waits import Pending, Words

if TYPE_CHECKING:
    from rich.spinner import Spinner
    from rich.text import Text

_COLORS = ("36", "33", "35", "32", "34", "91", "96", "93")


class Meaning(Enum):
    """What a word means, and so its colour on a terminal (rich style names)."""
    OK = "green"
    WARN = "yellow"
    FAIL = "bold red"
    NOTE = "dim"
    NAME = "cyan"
    PLAIN = ""


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


def interactive(stream: object) -> bool:
    """Whether a person watches this stream: a terminal that is not TERM=dumb, and fleet not
    asked for plain lines (FLEET_PLAIN=1)."""
    return (_isatty(stream) and os.environ.get("TERM", "") != "dumb"
            and not os.environ.get("FLEET_PLAIN"))


def colored(stream: object) -> bool:
    """Whether colour goes to this stream: a terminal, and no NO_COLOR (no-color.org)."""
    return "NO_COLOR" not in os.environ and _isatty(stream)


def _render(text: Text, width: int, color: bool) -> str:
    """rich's text (already printable) as the characters a terminal is sent."""
    from rich.console import Console as RichConsole

    buf = io.StringIO()
    RichConsole(file=buf, width=width, force_terminal=color, no_color=not color,
                color_system="standard" if color else None, highlight=False, emoji=False,
                markup=False, soft_wrap=True).print(text, end="")
    return buf.getvalue()


MEANINGS = {m: ev.Tone[m.name] for m in Meaning}  # an event's tone: a word's meaning
TONES = {t: m for m, t in MEANINGS.items()}


class Console:
    """A command's events, drawn here on the terminal, or with `sink` (--json) sent there."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None,
                 color: bool | None = None, live: bool | None = None,
                 sink: ev.Sink | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = colored(self.out) if color is None else color  # the log stream's tags
        self.err_color = colored(self.err) if color is None else color
        # live: a person watches stderr; waits are drawn as a spinner or bar redrawn in place
        self.live = (interactive(self.err) if live is None else live) and sink is None
        self.sink = sink
        self._lock = threading.RLock()
        self._width = 0
        self.drawn = False  # a redrawn line (a progress bar) is on the terminal, unended
        # The waits under way (threads may each have one: the preflight's beside the upload's):
        # the newest is drawn, redrawn after every line; the one before it again once it ends.
        self._waits: list[Waiting] = []
        self._bar: str | None = None  # a progress bar's line: drawn in place of the spinner
        self._spinner: Spinner | None = None  # made when a wait is first drawn
        self._ticker: threading.Thread | None = None
        # torchrun's banners shown too (fleet --debug sets FLEET_DEBUG; the job's --debug)
        self.banners = bool(os.environ.get("FLEET_DEBUG"))
        self._banner: dict[str, Banner] = {}  # per node: its banner is over, or not yet

    @property
    def columns(self) -> int:
        """The terminal's width (80 where there is none: plain output is not wrapped)."""
        return shutil.get_terminal_size((80, 24)).columns

    def hosts(self, names: list[str]) -> None:
        """Align tags for these host names."""
        self._width = max((len(n) for n in names), default=0)

    def _paint(self, text: str, index: int) -> str:
        if not self.color:
            return text
        return f"\033[{_COLORS[index % len(_COLORS)]}m{text}\033[0m"

    def paint(self, text: str, meaning: Meaning, err: bool = True) -> str:
        """Text (made printable) coloured by its meaning where colour goes (stderr's, or with
        err=False stdout's)."""
        color = self.err_color if err else self.color
        safe = printable(text, lines=True)
        if not color or meaning is Meaning.PLAIN:
            return safe
        from rich.text import Text

        return _render(Text(safe, style=meaning.value), 10_000, True)

    def phase(self, host: str, message: str, meaning: Meaning = Meaning.PLAIN) -> None:
        self.event(ev.Note(message, MEANINGS[meaning], host))

    def phases(self, by_host: dict[str, str], meaning: Meaning = Meaning.PLAIN) -> None:
        """Each host's words, the same words said once naming the hosts (fleet.errors.said_once:
        `node1, node2  stopped`); to a sink, a note per host (events are data)."""
        from fleet.errors import said_once

        for hosts, words in said_once(by_host) if self.sink is None else \
                [([h], w) for h, w in by_host.items()]:
            self.phase(", ".join(hosts), words, meaning)

    def info(self, message: str, meaning: Meaning = Meaning.PLAIN) -> None:
        self.event(ev.Note(message, MEANINGS[meaning]))

    def event(self, event: ev.Event) -> None:
        """One event: to the sink, else drawn (fleet.phrases: a Phase draws nothing)."""
        if self.sink is not None:
            self.sink.emit(event)
            return
        if (words := wait_words(event)) is not None:  # the wait's line, never a line of its own
            with self._lock:
                if self._waits:
                    self._waits[-1].update(words)
            return
        for host, words, tone in terminal_words(event):
            self._say(f"{host:<{self._width}}  {words}" if host else words, TONES[tone])
        if isinstance(event, ev.Line):
            self._lines(event.index, [(event.tag or event.host, event.text)])

    def _say(self, message: str, meaning: Meaning) -> None:
        with self._lock:
            self._clear()
            self._print("fleet: " + self.paint(message, meaning), self.err)
            self._draw_status()

    def redraw(self, text: str) -> None:
        """One line drawn over the last one (a progress bar), on a terminal; the next line
        printed takes its place."""
        if self.sink is not None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._bar = self._fit(printable(text))
            self.err.write("\r\033[K" + self._bar)
            self.err.flush()
            self.drawn = True

    def settle(self) -> None:
        """The redrawn line, if any, erased (its work is over)."""
        with self._lock:
            self._bar = None
            self._clear()
            self._draw_status()
            with contextlib.suppress(OSError, ValueError):
                self.err.flush()

    def _fit(self, text: str, room: int = 0) -> str:
        """A redrawn line cut to the terminal's width less `room` (a spinner's mark), in
        cells (a wide character takes two), its last column left free: a line that wraps
        cannot be redrawn."""
        from rich.cells import cell_len, set_cell_size

        width = max(self.columns - 1 - room, 2)
        return text if cell_len(text) <= width else set_cell_size(text, width - 1) + "…"

    def _clear(self) -> None:
        if self.drawn:
            self.drawn = False
            with contextlib.suppress(OSError, ValueError):
                self.err.write("\r\033[K")

    @contextlib.contextmanager
    def waiting(self, text: Words) -> Iterator[Waiting]:
        """A wait a person sees: on a terminal a spinner with `text` (which `Waiting.update`
        changes; a function is asked again at each redraw), erased when the wait ends; without
        one, nothing (the lines said before and after are the record)."""
        wait = Waiting(self, text)
        if not self.live:
            yield wait
            return
        with self._lock:
            self._waits.append(wait)
            self._draw_status()
            if self._ticker is None or not self._ticker.is_alive():
                self._ticker = threading.Thread(target=self._tick, daemon=True,
                                                name="fleet-spinner")
                self._ticker.start()
        try:
            yield wait
        finally:
            with self._lock:
                self._waits.remove(wait)
                self._clear()
                self._draw_status()  # the wait this one was nested in, if any
                with contextlib.suppress(OSError, ValueError):
                    self.err.flush()

    @contextlib.contextmanager
    def hosts_waiting(self, what: str, hosts: Iterable[str]) -> Iterator[Pending]:
        """A wait on a step over hosts (fleet.waits): on a terminal its count, and once it is
        slow the hosts not done yet and what they are on, redrawn as the seconds go."""
        pending = Pending(what, hosts)
        if not pending.hosts:  # nothing to wait for: nothing to say
            yield pending
            return
        with self.waiting(pending.words) as wait:
            pending.changed = lambda: self._set_status(wait)
            yield pending

    def _set_status(self, wait: Waiting) -> None:
        with self._lock:
            if self._waits and self._waits[-1] is wait:
                self._draw_status()

    def _tick(self) -> None:
        """Redraws the spinner ten times a second while a wait is under way."""
        while True:
            time.sleep(0.1)
            with self._lock:
                if not self._waits:
                    self._ticker = None
                    return
                self._draw_status()

    def _draw_status(self) -> None:
        """The newest wait's spinner and words, or the progress bar while one is shown."""
        if not self._waits:
            return
        if self._bar is not None:
            line = self._bar
        else:
            from rich.cells import cell_len
            from rich.spinner import Spinner
            from rich.text import Text

            if self._spinner is None:
                self._spinner = Spinner("dots")
            frame = self._spinner.render(time.monotonic())
            mark = frame.plain if isinstance(frame, Text) else "*"
            words = self._fit(printable(self._waits[-1].said()), cell_len(mark) + 1)
            if self.err_color:
                mark = _render(Text(mark, style="cyan"), 10, True)
            line = mark + " " + words
        with contextlib.suppress(OSError, ValueError):
            self.err.write("\r\033[K" + line)
            self.err.flush()
        self.drawn = True

    def lines(self, index: int, tagged: list[tuple[str, str]], host: str = "",
              ranks: Sequence[int | None] = ()) -> None:
        """Log lines of one node, printed together (a sink gets one Line each, all of them);
        torchrun's own banners before the node's first rank line are not printed
        (fleet.banners), unless `banners`."""
        if self.sink is None:
            if not self.banners:
                seen = self._banner.setdefault(host or str(index), Banner())
                tagged = [(tag, text) for tag, text in tagged if seen.shown(tag, text)]
            self._lines(index, tagged)
            return
        for i, (tag, text) in enumerate(tagged):
            self.sink.emit(ev.Line(host or tag.split()[0], ranks[i] if i < len(ranks)
                                   else None, text.removesuffix("\r"), tag, index))

    def _lines(self, index: int, tagged: list[tuple[str, str]]) -> None:
        if tagged:
            # A CR that ends a line (CRLF) shows nothing: only one inside a line is marked.
            block = "\n".join(self._paint(printable(tag), index) + " | "
                               + printable(text.removesuffix("\r")) for tag, text in tagged)
            with self._lock:
                self._clear()
                self._print(block, self.out)
                self._draw_status()

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]],
              meanings: Sequence[Meaning | None] = (), err: bool = False) -> str:
        """Rows as a table, every cell made printable (fleet.tables: drawn by rich to a
        terminal's width, plain columns otherwise)."""
        from fleet.tables import draw

        stream = self.err if err else self.out
        return draw(headers, rows, [m.value if m else None for m in meanings],
                    self.columns if interactive(stream) else None,
                    self.err_color if err else self.color)

    def emit(self, text: str, err: bool = False) -> None:
        """Print what this console drew (`table`, `paint`: every node's word in it already made
        printable, its colours its own), on stdout or stderr, past any wait's line."""
        if self.sink is not None:
            self.sink.emit(ev.Note(text))
            return
        with self._lock:
            self._clear()
            self._print(text, self.err if err else self.out)
            self._draw_status()

    @staticmethod
    def _print(text: str, stream: TextIO) -> None:
        """Best effort: a reader gone (`fleet up | head`) or a full disk must not stop fleet
        from following and tearing down the run; the job's log stays on the nodes."""
        with contextlib.suppress(OSError, ValueError):
            print(text, file=stream, flush=True)


class Waiting:
    """A wait under way (`Console.waiting`): its text can change as it goes (3/6 joined), or
    be made anew at each redraw (a function: fleet.waits.Pending.words)."""

    def __init__(self, console: Console, text: Words = "") -> None:
        self.console, self.text = console, text

    def update(self, text: Words) -> None:
        self.text = text
        self.console._set_status(self)

    def said(self) -> str:
        return self.text() if callable(self.text) else self.text
