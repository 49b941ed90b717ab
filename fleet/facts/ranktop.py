"""What each rank of a run did lately, on one node: one command (fleet/nodeside/ranktop.sh: the
node's clock, the pace of its log, every rank's sampling summary) and a pure parser of what it
prints. Everything there is the job's to write, so every field is checked and bounded here:
a summary that is not one of fleet's is left out, never guessed at."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet.console import printable
from fleet.nodedata import number
from fleet.nodeside import shell_program
from fleet.nodeside.shared.sampling import KINDS, MAGIC, PLACE_CHARS, PLACES

MOST = 64  # summaries read from one node (one per rank process)
SUMMARY_BYTES = 4096  # of one summary
LOG_SPAN_S = 10  # the log's pace is counted over about this many seconds
LOG_BYTES = 8 << 20  # of the log read to count them, at most
STALE_S = 5.0  # a summary older than this (by the node's clock): its process has ended
RANK_MAX = 1 << 20
PID_MAX = 1 << 22


def top_script(run_dir: str) -> str:
    return shell_program("ranktop.sh", run_dir, MOST, SUMMARY_BYTES, LOG_SPAN_S, LOG_BYTES)


@dataclass(frozen=True)
class Place:
    count: int
    kind: str  # fleet.nodeside.shared.sampling.KINDS
    where: str  # `all_reduce()`, `forward() (model.py)`, made printable


@dataclass(frozen=True)
class RankSample:
    """One rank process's summary of its last window, as its sampler wrote it."""

    pid: int
    rank: int
    local_rank: int | None
    joined: bool  # torch.distributed was initialised in it (a DataLoader worker's is not)
    age_s: float  # how old the summary is, by the node's clock
    window_s: float
    samples: int
    collective: int  # of them, in a collective
    cpu_pct: float | None
    rss: int | None
    throttled: float | None  # share of its cgroup's CPU periods that were throttled
    now: Place
    places: tuple[Place, ...]

    @property
    def alive(self) -> bool:
        return self.age_s <= STALE_S

    @property
    def wait_share(self) -> float | None:
        return self.collective / self.samples if self.samples else None


@dataclass(frozen=True)
class NodeTop:
    missing: bool = False  # no run directory there
    now: float | None = None  # the node's clock
    lines: int | None = None  # lines the log grew by over `span_s`
    span_s: float | None = None
    last_line_age_s: float | None = None
    samples: tuple[RankSample, ...] = ()
    cut: bool = False  # more summaries than MOST

    @property
    def lines_per_s(self) -> float | None:
        if self.lines is None or not self.span_s:
            return None
        return self.lines / self.span_s

    def ranks(self) -> dict[int, RankSample]:
        """Per global rank, its process: a live one in the process group (a DataLoader
        worker's summary carries the same rank, an ended process's stays), the freshest."""
        out: dict[int, RankSample] = {}
        for s in sorted(self.samples, key=lambda s: (s.alive, s.joined, -s.age_s)):
            out[s.rank] = s  # the last wins: alive, in the group, the freshest
        return dict(sorted(out.items()))


def _float(text: str, low: float = 0.0, high: float = 1e12) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and low <= v <= high else None


def parse_top(out: str) -> NodeTop:
    """A node's answer to top_script."""
    now: float | None = None
    lines: int | None = None
    span = last_age = None
    samples: list[RankSample] = []
    cut = False
    block: tuple[int, list[str]] | None = None
    stamps: list[str] = []

    def close() -> None:
        if block is not None and now is not None:
            s = parse_summary(block[0], block[1], now)
            if s is not None:
                samples.append(s)

    for line in out.split("\n"):  # a carriage return in a file never starts a line
        if line.startswith("|"):
            if block is not None:
                block[1].append(line[1:])
            continue
        close()
        block = None
        words = line.split()
        if words[:2] == ["===", "missing"]:
            return NodeTop(missing=True)
        if words[:2] == ["===", "now"] and len(words) == 3:
            now = _float(words[2], 0, 1e11)
        elif words[:2] == ["===", "stamps"] and len(words) == 6:
            stamps = words[2:]
        elif words[:2] == ["===", "lines"] and len(words) == 3:
            lines = number(words[2], 1 << 40)
        elif words[:2] == ["===", "sample"] and len(words) == 3:
            pid = number(words[2], PID_MAX)
            block = (pid, []) if pid else None
        elif words[:2] == ["===", "cut"]:
            cut = True
    close()
    if stamps and now is not None:
        at, last = _float(stamps[1], 0, 1e11), _float(stamps[3], 0, 1e11)
        if last is not None and last <= now + 1:
            last_age = max(now - last, 0.0)
        if at is not None and at < now:
            span = min(now - at, 6.0 * LOG_SPAN_S)
        elif lines is not None:
            span = float(LOG_SPAN_S)  # the log began within the span: at most that long
    return NodeTop(False, now, lines, span, last_age, tuple(samples), cut)


def _place(words: list[str]) -> Place | None:
    """`<count> <kind> <where...>`."""
    if len(words) < 3 or words[1] not in KINDS:
        return None
    count = number(words[0], 1 << 31)
    if count is None:
        return None
    return Place(count, words[1], printable(" ".join(words[2:])[:PLACE_CHARS]))


def parse_summary(pid: int, text: list[str], now: float) -> RankSample | None:
    """One summary (fleet/nodeside/shared/sampling.py's Window.summary), read from the file
    samples/<pid>: None where it is not one, or its pid is not its file's."""
    if not text or text[0] != MAGIC or len(text) < 5:
        return None
    head = text[1].split()
    stats = text[2].split()
    use = text[3].split()
    if (len(head) != 8 or head[0::2] != ["rank", "local", "pid", "dist"] or len(stats) != 8
            or stats[0::2] != ["time", "window", "samples", "collective"] or len(use) != 6
            or use[0::2] != ["cpu", "rss", "throttled"]):
        return None
    rank = number(head[1], RANK_MAX)
    local = number(head[3], RANK_MAX) if head[3] != "-1" else None
    at, window = _float(stats[1], 0, 1e11), _float(stats[3], 0, 3600)
    n, coll = number(stats[5], 1 << 31), number(stats[7], 1 << 31)
    if (rank is None or number(head[5], PID_MAX) != pid or head[7] not in ("0", "1")
            or at is None or window is None or n is None or coll is None or coll > n):
        return None
    current = _place(["0", *text[4].split()[1:]]) if text[4].startswith("now ") else None
    places = [p for line in text[5:5 + PLACES] if line.startswith("place ")
              if (p := _place(line.split()[1:])) is not None]
    return RankSample(
        pid, rank, local, head[7] == "1", max(now - at, 0.0), window, n, coll,
        _float(use[1], 0, 1e5) if use[1] != "-" else None,
        number(use[3], 1 << 50) if use[3] != "-" else None,
        _float(use[5], 0, 1) if use[5] != "-" else None,
        current or Place(0, "compute", "?"), tuple(places))
