"""Log lines: torchrun's `[defaultN]:` prefix turned into a host+rank tag, the stop's noise kept
out of the attached stream; re-attaching to a run; what `fleet logs` is asked to show (--merge,
--tail, --since) and the line that ends `fleet logs -f`."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from fleet.console import printable
from fleet.errors import FleetError, UsageError
from fleet.facts.failure import RANK_PREFIX
from fleet.states import RunStatus
from fleet.timespan import parse_duration

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


# ---- what `fleet logs` shows --------------------------------------------------------------
@dataclass(frozen=True)
class View:
    """Which of a run's log lines to show, and how: `merge` every node's lines in one stream
    by time; only the `tail` last lines (of each node, or of the merged stream); only lines
    written at or after `since` (this machine's clock, seconds since the epoch)."""

    merge: bool = False
    tail: int | None = None
    since: float | None = None

    @property
    def plain(self) -> bool:
        """Every line from the first, node by node: what `fleet logs` always did."""
        return not self.merge and self.tail is None and self.since is None


T = TypeVar("T")


def parse_since(text: str, now: float) -> float:
    """`--since`: a duration back from `now` (10m, 30s, 2h, 1d, 1.5h) or an ISO time
    (2026-11-24T10:00, this machine's time zone unless it names one), as seconds since the
    epoch."""
    said = text.strip()
    back = parse_duration(said)
    if back is not None:
        return now - back
    try:
        return datetime.fromisoformat(said).timestamp()
    except ValueError:
        raise UsageError(f"--since {text!r}: neither a duration (30s, 10m, 2h, 1d) nor an ISO "
                         "time (2026-11-24T10:00 or 2026-11-24 10:00:00+00:00)") from None


@dataclass(frozen=True)
class Viewed:
    """What fleet/nodeside/log_view.sh said of a node's log: its lines with when each was
    written (the node's clock; None where its time index has not reached the line, or was set
    aside), the node's time when asked, the byte after the last whole line (a follower resumes
    there), and why the time index was set aside ("" where it was not)."""

    lines: list[tuple[float | None, str]]
    now: float
    end: int
    distrusted: str = ""


def parse_view(out: str) -> Viewed:
    """log_view.sh's output (a login shell's noise before it is passed over); ValueError if it
    did not say all of it. The times come from node.times, which the job can write too: where
    they are not a clean index (index_times), the node's lines are taken as untimed."""
    text = out.split("\n")
    first = next((i for i, line in enumerate(text) if line.startswith("size=")), None)
    last = next((i for i in range(len(text) - 1, -1, -1) if text[i].startswith("end=")), None)
    if first is None or last is None or last < first:
        raise ValueError("the log's view was cut short")
    head = dict(word.partition("=")[::2] for word in text[first].split())
    now = _finite(head.get("now", "0"))
    stamps, said = [], []
    for line in text[first + 1:last]:
        stamp, _, words = line.partition(" ")
        stamps.append(stamp)
        # Of a line redrawn with "\r" (a progress bar), its last state is the line.
        said.append(words.removesuffix("\r").rsplit("\r", 1)[-1])
    times, why = index_times(stamps, now)
    return Viewed(list(zip(times, said, strict=True)), now, int(text[last][4:]), why)


FUTURE_S = 5.0  # a line's time may run this far past the node's own `now` (its clock's jitter)
# A line's time may fall this far before an earlier line's: fleet's own node.times steps back
# so when NTP corrects the node's clock. It is taken as the earlier line's (the node's order).
BACKSTEP_S = 2.0
# Where the index is set aside under --since, the node's lines are read again without it: only
# this many of its last, unless --tail says how many (a long log is not fetched whole).
DISTRUSTED_TAIL = 1000


def reread_tail(tail: int | None) -> int:
    """How many of a node's last lines `--since` reads where its time index is set aside."""
    return DISTRUSTED_TAIL if tail is None else tail


def index_times(stamps: list[str], now: float) -> tuple[list[float | None], str]:
    """Each line's time from log_view.sh's stamps (`-`: the index has not reached the line),
    with ""; or, where the stamps are not what fleet's own node.times gives (a time that is not
    a finite number, one before the epoch or after the node's `now`, times that go back more
    than BACKSTEP_S), no times at all, with why in words."""
    times: list[float | None] = []
    last = 0.0
    for stamp in stamps:
        if stamp == "-":
            times.append(None)
            continue
        try:
            t = float(stamp)
        except ValueError:
            t = math.nan
        shown = printable(stamp[:20])
        why = ("a time that is not one" if not math.isfinite(t) or t < 0 else
               "a time after the node's own clock" if t > now + FUTURE_S else
               "a time before an earlier line's" if t < last - BACKSTEP_S else "")
        if why:
            return [None] * len(stamps), f"{why}: {shown!r}"
        last = max(t, last)
        times.append(last)
    return times, ""


def _finite(word: str) -> float:
    """A time the node gave: a finite number (a NaN would leave the merge unordered)."""
    t = float(word)
    if not math.isfinite(t):
        raise ValueError(f"the log's view gave a time that is not one: {word[:20]!r}")
    return t


def placed(viewed: Viewed, clock_offset: float) -> list[tuple[float, str]]:
    """A node's lines with their times on this machine's clock (the node's clock offset taken
    off); a line its index has not reached yet was written by the time the node was asked."""
    return [((viewed.now if t is None else t) - clock_offset, line) for t, line in viewed.lines]


def merged(nodes: Iterable[list[tuple[float, T]]], tail: int | None) -> list[T]:
    """Every node's lines in one stream by time, a tie in the order the nodes come (and a
    node's own lines in theirs); with `tail`, only the stream's last lines."""
    keyed = [(t, n, i, line) for n, lines in enumerate(nodes) for i, (t, line) in enumerate(lines)]
    every = [line for _, _, _, line in sorted(keyed, key=lambda x: (x[0], x[1], x[2]))]
    return every if tail is None else every[max(len(every) - tail, 0):] if tail else []


def final_line(run_id: str, status: RunStatus, described: list[str]) -> str:
    """How `fleet logs -f` ends: the run's state as `fleet status` says it (`described`: its
    lines, the run's then each node's), on one line, each node's spaces folded."""
    nodes = "\n".join(described).split("\n")[1:]
    detail = "; ".join(" ".join(line.split()) for line in nodes if line.strip())
    return f"run {run_id} {status.value}" + (f": {detail}" if detail else "")
