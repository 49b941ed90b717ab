"""Log lines: torchrun's `[defaultN]:` prefix turned into a host+rank tag, the stop's noise kept
out of the attached stream; re-attaching to a run."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from fleet.errors import FleetError
from fleet.facts.failure import RANK_PREFIX

# The line stop.sh writes into the node's log where fleet's stop of the node begins.
STOP_MARK = re.compile(r"\[fleet\] stopping run \S+ on this node \(.*\)\Z")


@dataclass(frozen=True)
class Tagged:
    tag: str  # "node1 r3" (global rank), "node1 l0" (local rank only), or "node1" (torchrun)
    rank: int | None  # global rank, when known
    text: str


def tag_line(host: str, rank_base: int | None, line: str,
             known: dict[int, int] | None = None) -> Tagged:
    """A line of a node's log, tagged with its global rank: from the plan's base where it knew
    one, else from what the node's workers recorded (`known`); failing both, the local rank."""
    m = RANK_PREFIX.match(line)
    if not m:
        return Tagged(host, None, line)
    local = int(m.group(1))
    rank = rank_base + local if rank_base is not None else (known or {}).get(local)
    if rank is not None:
        return Tagged(f"{host} r{rank}", rank, m.group(2))
    return Tagged(f"{host} l{local}", None, m.group(2))


class Tagger:
    """Tags one node's lines. Where the plan could not know the node's ranks (c10d numbers nodes
    as they join), it asks the node when a local rank first prints: each worker's sitecustomize
    recorded its global rank before the worker could print anything. One question per local
    rank at most."""

    def __init__(self, host: str, rank_base: int | None,
                 ask: Callable[[], dict[int, int]] | None = None) -> None:
        self.host, self.rank_base, self.ask = host, rank_base, ask
        self.known: dict[int, int] = {}
        self.asked: set[int] = set()

    def __call__(self, line: str) -> Tagged:
        m = RANK_PREFIX.match(line)
        if m and self.rank_base is None and self.ask is not None:
            local = int(m.group(1))
            if local not in self.known and local not in self.asked:
                self.asked.add(local)
                # On failure: tagged by local rank, as without fleet's sitecustomize.
                with contextlib.suppress(FleetError):
                    self.known.update(self.ask())
        return tag_line(self.host, self.rank_base, line, self.known)


class AfterStop:
    """What a node prints once fleet stops it (fail-fast, `fleet stop`, Ctrl-C) is the stop's
    doing, not the job's news: torchrun's SignalException tracebacks, its "Sending process ...
    closing signal SIGTERM", workers failing as their peers go. From stop.sh's line in the log
    on, once `confirm` finds fleet's stop record on the node (it returns who stopped it, "" if
    no genuine record: a job cannot silence itself by printing the line), lines are dropped
    from the attached stream and `announce` says so once. The node's log keeps them all."""

    def __init__(self, confirm: Callable[[], str], announce: Callable[[str], None]) -> None:
        self.confirm, self.announce = confirm, announce
        self.by = ""  # who stopped the node, once confirmed
        self.hidden = 0
        self.told = False

    def __call__(self, lines: list[str]) -> list[str]:
        """The lines to show."""
        shown: list[str] = []
        for line in lines:
            if self.by:
                self.hidden += 1
            elif STOP_MARK.match(line) and (by := self.confirm()):
                self.by = by  # the mark itself is fleet's bookkeeping, not the job's output
            else:
                shown.append(line)
        return shown

    def tell(self) -> None:
        """Once a line was hidden, say so, once (after the lines shown before it)."""
        if self.hidden and not self.told:
            self.told = True
            self.announce(self.by)


_REPORT = re.compile(r"(Traceback \(most recent call last\)|During handling of the above "
                     r"exception|The above exception was the direct cause|[\w.]+(Error|Exception|"
                     r"Exit|Interrupt)\b)")
_HOOK = re.compile(r"\[rank\d+\]: ?")


def progress(text: str) -> bool:
    """Whether a rank's line says the job got going: any line of its own, not a part of a
    traceback or an error report (a job that fails before its first such line is broken in a
    way a restart cannot mend: a typo, an import, a config)."""
    text = _HOOK.sub("", text, count=1)
    return bool(text.strip()) and not text[:1].isspace() and not _REPORT.match(text)
