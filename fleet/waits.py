"""What fleet waits for, as data: one step over many hosts, which are done, what each one not
done is doing and since when; and the words a terminal shows for it once the wait is slow
(`waiting: probe 3/4 hosts done; node2 still answering (2 s)`). The clock is passed in: the
words are pure; the tracker is safe to share between the threads of a fan-out."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

SLOW_S = 1.0  # a wait longer than this names what it waits for
NAMED = 2  # slow hosts named at most; the rest are counted

Words = str | Callable[[], str]  # a wait's words, or how to make them each time it is drawn


def slow_words(what: str, total: int, done: int, slow: list[tuple[str, str, float]],
               elapsed: float) -> str:
    """The words of a wait on `total` hosts of which `done` are: before SLOW_S, the count
    alone; after it, the slowest hosts (host, what it does or "", seconds), at most NAMED of
    them, the longest first."""
    count = f"{done}/{total} hosts done" if total > 1 else ""
    head = f"waiting: {what}" + (f" {count}" if count else "")
    if elapsed < SLOW_S or not slow:
        return head
    slow = sorted(slow, key=lambda s: -s[2])
    named = [f"{host} still {f'on {doing}' if doing else 'answering'} ({int(secs)} s)"
             for host, doing, secs in slow[:NAMED]]
    more = f" and {len(slow) - NAMED} more" if len(slow) > NAMED else ""
    return f"{head}; {', '.join(named)}{more}"


def _nothing() -> None:
    """No one is told."""


class Pending:
    """A step over hosts under way: `start(host, doing)` as a host begins a part of it,
    `finish(host)` as it is done; `words()` says it now."""

    def __init__(self, what: str, hosts: Iterable[str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.clock = what, clock
        self.hosts = list(dict.fromkeys(hosts))
        self.t0 = clock()
        self._lock = threading.Lock()
        self._done: set[str] = set()
        self._doing: dict[str, tuple[str, float]] = {h: ("", self.t0) for h in self.hosts}
        self.changed: Callable[[], None] = _nothing  # told after each start and finish

    def start(self, host: str, doing: str) -> None:
        """`host` is now on `doing` (a check's name, a step): said as what it waits for."""
        with self._lock:
            if host not in self._done:
                self._doing[host] = (doing, self.clock())
        self.changed()

    def again(self, host: str, doing: str) -> None:
        """`host`, done with an earlier part of the step, is on another one (`doing`)."""
        with self._lock:
            self._done.discard(host)
            self._doing[host] = (doing, self.clock())
        self.changed()

    def finish(self, host: str) -> None:
        with self._lock:
            self._done.add(host)
            self._doing.pop(host, None)
        self.changed()

    @property
    def done(self) -> int:
        with self._lock:
            return len(self._done)

    def words(self) -> str:
        now = self.clock()
        with self._lock:
            slow = [(h, doing, now - since) for h, (doing, since) in self._doing.items()]
            done = len(self._done)
        return slow_words(self.what, len(self.hosts), done, slow, now - self.t0)

    def tracked(self, fn: Callable[[T], R]) -> Callable[[tuple[str, T]], R]:
        """fn for a fan-out (fleet.transport.group.each) over `named(...)` pairs: each host is
        finished as its call ends, however it ends."""
        def run(pair: tuple[str, T]) -> R:
            try:
                return fn(pair[1])
            finally:
                self.finish(pair[0])
        return run


def named(items: Iterable[tuple[str, T]]) -> list[tuple[str, tuple[str, T]]]:
    """(host, item) pairs as a fan-out's items that carry their host to `Pending.tracked`."""
    return [(name, (name, item)) for name, item in items]


# ---- who draws a wait that code deep below a command announces ---------------------------------
Drawer = Callable[[str, Iterable[str]], AbstractContextManager[Pending]]
_drawers: list[Drawer] = []


@contextlib.contextmanager
def shown_by(draw: Drawer) -> Iterator[None]:
    """While this holds, the waits announced with `over` are drawn by `draw` (a command's
    Console.hosts_waiting): the code that asks the hosts need not carry the console."""
    _drawers.append(draw)
    try:
        yield
    finally:
        _drawers.remove(draw)


@contextlib.contextmanager
def over(what: str, hosts: Iterable[str]) -> Iterator[Pending]:
    """A wait on a step over hosts, drawn by the command's drawer (shown_by), if any; else
    tracked for nobody."""
    if _drawers:
        with _drawers[-1](what, hosts) as pending:
            yield pending
    else:
        yield Pending(what, hosts)
