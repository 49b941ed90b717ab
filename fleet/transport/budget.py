"""Bounds on what fleet opens at once toward one host, kept under stock sshd limits: sessions per
connection (`MaxSessions 10`) and connections being set up per host (`MaxStartups 10:30:100`).
Past the bound a caller waits its turn; it never fails for being one too many."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

# Sessions (exec, subsystem) one connection keeps open at once. sshd counts a session until it
# has handled the channel's close, which may come a moment after this side let go: two of the
# ten stay spare for that.
MAX_SESSIONS = 8
# Connections to one host:port being set up at once (TCP to authenticated). sshd starts refusing
# unauthenticated connections at random from 10 (MaxStartups 10:30:100), counting every client's:
# fleet keeps well under, leaving room for the user's own ssh and for colleagues.
MAX_STARTUPS = 4
LOOK_S = 1.0  # a waiter looks this often whether it should give up (its connection is gone)


class Slot:
    """One unit of a Budget, held until released; releasing twice is harmless (a channel may be
    closed by its user and seen closed by its reader)."""

    def __init__(self, budget: Budget) -> None:
        self._budget: Budget | None = budget
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            budget, self._budget = self._budget, None
        if budget is not None:
            budget._give_back()

    @property
    def held(self) -> bool:
        return self._budget is not None


class Budget:
    """At most `limit` slots held at once; take() waits for one (first come, first served), and
    gives up only when `gone()` says there is nothing left to wait for."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a budget of {limit}: at least 1")
        self.limit = limit
        self._held = 0
        self._queue: list[object] = []
        self._cond = threading.Condition()

    @property
    def held(self) -> int:
        return self._held

    def take(self, gone: Callable[[], str | None] = lambda: None) -> Slot:
        """A slot, once one is free and every earlier waiter has had theirs. `gone()` returns
        why waiting is pointless (the connection was lost), raised as ConnectionError."""
        me = object()
        with self._cond:
            self._queue.append(me)
            try:
                while self._queue[0] is not me or self._held >= self.limit:
                    if (why := gone()) is not None:
                        raise ConnectionError(why)
                    self._cond.wait(LOOK_S)
                self._held += 1
            finally:
                self._queue.remove(me)
                self._cond.notify_all()
        return Slot(self)

    def _give_back(self) -> None:
        with self._cond:
            self._held -= 1
            self._cond.notify_all()


class PerKey:
    """A Budget per key (a host and port), made on first use and kept for the process."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._budgets: dict[object, Budget] = {}
        self._lock = threading.Lock()

    def budget(self, key: object) -> Budget:
        with self._lock:
            if key not in self._budgets:
                self._budgets[key] = Budget(self.limit)
            return self._budgets[key]

    @contextlib.contextmanager
    def holding(self, keys: list[object]) -> Iterator[None]:
        """A slot of every key's budget, taken in a fixed order (two callers wanting the same
        two keys cannot each hold one and wait for the other), all released at the end."""
        slots: list[Slot] = []
        try:
            for key in sorted(set(keys), key=repr):
                slots.append(self.budget(key).take())
            yield
        finally:
            for s in slots:
                s.release()


# Connections being set up, per host and port, for the whole process (every transport of it).
STARTUPS = PerKey(MAX_STARTUPS)
