"""Which nodes give way to a spare after an attempt ended badly (`[restart] replace`), as a pure
decision: a lost node at once; a failed one at once with `replace = "fail"`, else only once it
has failed before (retried in place first: one failed rank is no reason to bench a healthy
host, and a transient error does not burn a spare per attempt)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from fleet.config.restart import Ending, Replace


@dataclass(frozen=True)
class Decision:
    """The nodes that give way to a spare (in this order), and the node retried in place."""

    give_way: tuple[str, ...]
    in_place: str | None = None  # a failed node kept for the next attempt (its first failure)


def decide(kind: Ending | None, lost: Sequence[str], failed: str | None,
           failed_before: Collection[str], replace: Replace) -> Decision:
    """After an attempt's `kind` of ending: `lost` are the nodes it lost, `failed` the node of
    its first failure (for a FAIL ending), `failed_before` the nodes that failed in an earlier
    attempt of the run."""
    gone = list(dict.fromkeys(lost))
    if kind is not Ending.FAIL or failed is None or failed in gone:
        return Decision(tuple(gone))
    if replace is Replace.FAIL or failed in failed_before:
        return Decision((*gone, failed))
    return Decision(tuple(gone), in_place=failed)


class Places:
    """A run's spares: which one stands in which inventory host's place, which are taken (or
    found unfit), and the swaps not said yet: a swap is said and recorded only once the attempt
    it is for has passed its checks (`confirmed`)."""

    def __init__(self, spares: Callable[[], list[str]]) -> None:
        self.spares = spares  # the inventory's spares, in its order
        self.replace: dict[str, str] = {}  # inventory host -> the spare in its place now
        self.used: set[str] = set()  # spares taken (or found unfit)
        self.pending: dict[str, str] = {}  # node giving way -> its spare, not said yet
        self.failed: set[str] = set()  # nodes that failed in an attempt (not lost)

    def free(self) -> list[str]:
        """The spares not taken yet (nor found unfit), in the inventory's order."""
        return [s for s in self.spares() if s not in self.used and s not in
                self.replace.values()]

    def take(self, name: str) -> str | None:
        """The first free spare, from the next attempt on in `name`'s place (where `name` is a
        spare itself, in the place of the host it stood for); None where none is free."""
        free = self.free()
        if not free:
            return None
        home = next((h for h, s in self.replace.items() if s == name), name)
        self.replace[home] = free[0]
        self.used.add(free[0])
        self.pending[name] = free[0]
        return free[0]

    def refit(self, spare: str) -> tuple[str, str | None]:
        """`spare` failed its checks: the next free spare goes in its place (None where none is
        left: the host it stood for is tried again). Returns (that host, the next spare)."""
        home = next(h for h, s in self.replace.items() if s == spare)
        # The node it was to replace; else (a spare standing since an earlier attempt) itself.
        name = next((n for n, s in self.pending.items() if s == spare), spare)
        free = self.free()
        if free:
            self.replace[home] = self.pending[name] = free[0]
            self.used.add(free[0])
            return home, free[0]
        del self.replace[home]
        self.pending.pop(name, None)
        return home, None

    def confirmed(self) -> dict[str, str]:
        """The swaps of the attempt that passed its checks: node -> its spare, said now."""
        said, self.pending = self.pending, {}
        return said
