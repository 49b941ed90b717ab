"""Where each rank spends its time, with no change to the job: the rules both sides share.

In every rank (fleet's sitecustomize), a daemon thread looks at the main thread's Python stack
SAMPLE_HZ times a second (sys._current_frames: no signal, no ptrace, nothing the job sees) and
says what it is doing: waiting in a torch.distributed collective, waiting for a DataLoader, or
computing (in its innermost function). It keeps the last WINDOW_S seconds and, every WRITE_S,
writes a summary to <run dir>/samples/<pid> (write_summary), which fleet reads back through
one command per node (fleet/facts/ranktop.py parses it as the untrusted text it is).

In a synchronous job every rank waits at each collective for the slowest one: the share of its
samples spent in collectives is how long it waits for the others, and the straggler is the rank
that hardly waits (fleet/run/straggler.py)."""

from __future__ import annotations

import os
from types import FrameType

SAMPLE_HZ = 10.0  # stack samples a second
WINDOW_S = 20  # seconds of samples a summary covers
WRITE_S = 1.0  # how often a rank's summary is written
DEPTH = 12  # innermost frames looked at for a collective or a data wait
MAGIC = "fleet-samples 1"  # a summary's first line
PLACES = 5  # places a summary names, the most frequent first
PLACE_CHARS = 120  # of a place's words

COLLECTIVE, DATA_WAIT, COMPUTE = "collective", "data", "compute"
KINDS = (COLLECTIVE, DATA_WAIT, COMPUTE)
# torch.distributed's Python functions that block until every rank has come (or wait for one)
COLLECTIVES = frozenset((
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "broadcast_object_list", "barrier", "monitored_barrier", "reduce", "gather",
    "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single",
    "send", "recv", "batch_isend_irecv", "wait", "wait_tensor", "_wait_tensor"))


def stack(frame: FrameType | None, most: int = 64) -> list[tuple[str, str, int]]:
    """A thread's Python stack (its innermost frame, as sys._current_frames gives it), innermost
    first: (file, function, line) each, at most `most`."""
    frames: list[tuple[str, str, int]] = []
    while frame is not None and len(frames) < most:
        code = frame.f_code
        frames.append((code.co_filename, code.co_name, frame.f_lineno))
        frame = frame.f_back
    return frames


def classify(frames: list[tuple[str, str, int]]) -> tuple[str, str]:
    """(kind, place) of a stack given innermost frame first, each (file, function, line):
    the collective it waits in (`all_reduce()`), `DataLoader.__next__()`, or else computing in
    its innermost function (`forward() (linear.py)`)."""
    for file, func, _ in frames[:DEPTH]:
        where = file.replace("\\", "/")
        # a collective's own function, or torch.distributed's code waiting for one (FSDP's
        # `wait_for_unshard`, a functional collective's `wait_tensor`)
        if "/torch/distributed/" in where and (func in COLLECTIVES or "wait" in func):
            return COLLECTIVE, f"{func}()"
        if "/torch/utils/data/" in where and func == "__next__":
            return DATA_WAIT, "DataLoader.__next__()"
    if not frames:
        return COMPUTE, "?"
    file, func, _ = frames[0]
    return COMPUTE, f"{func}() ({os.path.basename(file)})"


class Window:
    """The samples of the last WINDOW_S seconds, in one-second buckets, and what the process's
    CPU time and its cgroup's throttling did over them."""

    def __init__(self, seconds: int = WINDOW_S) -> None:
        self.seconds = seconds
        # [second, samples, in collectives, {(kind, place): count}]
        self.buckets: list[list] = []  # type: ignore[type-arg]
        # (time, cpu seconds, cgroup periods, throttled periods): one a second
        self.marks: list[tuple[float, float, int | None, int | None]] = []
        self.last: tuple[str, str] = (COMPUTE, "?")

    def add(self, now: float, kind: str, place: str) -> None:
        second = int(now)
        if not self.buckets or self.buckets[-1][0] != second:
            self.buckets.append([second, 0, 0, {}])
            while self.buckets and self.buckets[0][0] <= second - self.seconds:
                self.buckets.pop(0)
        b = self.buckets[-1]
        b[1] += 1
        b[2] += kind == COLLECTIVE
        b[3][(kind, place)] = b[3].get((kind, place), 0) + 1
        self.last = (kind, place)

    def mark(self, now: float, cpu: float, periods: int | None, throttled: int | None) -> None:
        self.marks.append((now, cpu, periods, throttled))
        while len(self.marks) > 2 and self.marks[1][0] <= now - self.seconds:
            self.marks.pop(0)

    def summary(self, rank: int, local: int, pid: int, dist: bool, now: float,
                rss: int | None) -> str:
        """What write_summary writes (fleet/facts/ranktop.py parses it)."""
        n = sum(b[1] for b in self.buckets)
        coll = sum(b[2] for b in self.buckets)
        places: dict[tuple[str, str], int] = {}
        for b in self.buckets:
            for key, count in b[3].items():
                places[key] = places.get(key, 0) + count
        span = now - self.buckets[0][0] if self.buckets else 0.0
        cpu = throttled = "-"
        if len(self.marks) >= 2:
            (t0, c0, p0, h0), (t1, c1, p1, h1) = self.marks[0], self.marks[-1]
            if t1 > t0:
                cpu = f"{100.0 * (c1 - c0) / (t1 - t0):.1f}"
            if None not in (p0, p1, h0, h1) and p1 > p0:  # type: ignore[operator]
                throttled = f"{(h1 - h0) / (p1 - p0):.3f}"  # type: ignore[operator]
        lines = [MAGIC,
                 f"rank {rank} local {local} pid {pid} dist {int(dist)}",
                 f"time {now:.3f} window {min(span, float(self.seconds)):.1f} samples {n} "
                 f"collective {coll}",
                 f"cpu {cpu} rss {rss if rss is not None else '-'} throttled {throttled}",
                 f"now {self.last[0]} {self.last[1][:PLACE_CHARS]}"]
        top = sorted(places.items(), key=lambda kv: (-kv[1], kv[0]))[:PLACES]
        lines += [f"place {count} {kind} {place[:PLACE_CHARS]}" for (kind, place), count in top]
        return "\n".join(lines) + "\n"


def cgroup_cpu_stat(cgroup_text: str) -> list[str]:
    """Where the cpu.stat of the process's CPU cgroup may be, from /proc/self/cgroup's text
    (cgroup v1's cpu controller first, then v2's unified tree)."""
    v1, v2 = [], []
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or ".." in parts[2]:
            continue
        path = parts[2].strip("/")
        if "cpu" in parts[1].split(","):
            for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                v1.append("/".join(p for p in ("/sys/fs/cgroup", mount, path) if p))
        elif parts[0] == "0" and parts[1] == "":
            v2.append("/".join(p for p in ("/sys/fs/cgroup", path) if p))
    return [f"{d}/cpu.stat" for d in v1 + v2]


def throttling(stat_text: str) -> tuple[int, int] | None:
    """(periods, throttled periods) from a cpu.stat's text; None where it has no quota's
    counters."""
    got: dict[str, int] = {}
    for line in stat_text.splitlines():
        key, _, value = line.partition(" ")
        if key in ("nr_periods", "nr_throttled") and value.strip().isdigit():
            got[key] = int(value)
    if len(got) != 2:
        return None
    return got["nr_periods"], got["nr_throttled"]
