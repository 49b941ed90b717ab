"""Logs: lines per second from 4 hosts with every line checked, and one line's delay."""

from __future__ import annotations

import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    Config,
    Line,
    Proc,
    Scratch,
    Table,
    fmt,
    kill_run,
    median,
    next_port,
    ratio,
    run_dir,
    run_id_of,
    ssh_argv,
    testbed,
    wait_idle,
)
from tests.testbed import TbHost

# One write per line (PYTHONUNBUFFERED is set on the nodes), as fast as it can.
FLOOD_SCRIPT = '''import sys
w = sys.stdout.write
for i in range(int(sys.argv[1])):
    w(f"line {i}\\n")
'''
STAMP_SCRIPT = '''import sys, time
for i in range(int(sys.argv[1])):
    sys.stdout.write(f"stamp {i} {time.time():.6f}\\n")
    time.sleep(0.5)
'''
FLEET_LINE = re.compile(r" r(\d+) \| line (\d+)$")
NODE_LINE = re.compile(r"^\[default0\]:line (\d+)$")
HOSTS = 4
TIMEOUT = 300


@dataclass
class Delivery:
    lines: int  # job lines received
    first: float  # time.monotonic() of the first and last of them
    last: float
    start: float  # when the command(s) began
    intact: bool  # every rank's lines exactly once, in order

    @property
    def rate(self) -> float:
        return self.lines / (self.last - self.first) if self.last > self.first else 0.0


def node_log(h: TbHost, run_id: str) -> Path:
    return run_dir(h, run_id) / "node.log"


def fleet_delivery(proc: Proc, n: int, count: int) -> Delivery:
    """Lines `<host> r<rank> | line <i>` on fleet's stdout, checked rank by rank."""
    seen: dict[int, list[int]] = {r: [] for r in range(n)}
    times: list[float] = []
    for x in proc.out:
        m = FLEET_LINE.search(x.text)
        if m:
            seen.setdefault(int(m.group(1)), []).append(int(m.group(2)))
            times.append(x.t)
    intact = all(v == list(range(count)) for v in seen.values()) and len(seen) == n
    return Delivery(len(times), min(times, default=0), max(times, default=0), proc.t0, intact)


def ssh_delivery(procs: list[Proc], count: int, start: float) -> Delivery:
    """Lines `[default0]:line <i>` from each host's `tail -f`, checked host by host."""
    times: list[float] = []
    intact = True
    for p in procs:
        got = [(int(m.group(1)), x.t) for x in list(p.out) if (m := NODE_LINE.match(x.text))]
        intact &= [i for i, _ in got] == list(range(count))
        times += [t for _, t in got]
    return Delivery(len(times), min(times, default=0), max(times, default=0), start, intact)


def count_lines(procs: list[Proc], count: int) -> bool:
    return all(sum(1 for x in p.out if NODE_LINE.match(x.text)) >= count for p in procs)


def tails(sc: Scratch, run_id: str, n: int) -> list[Proc]:
    return [Proc(ssh_argv(sc.tb, h, f"tail -n +1 -f {node_log(h, run_id)}"))
            for h in sc.tb.hosts[:n]]


def wait_tails(procs: list[Proc], count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not count_lines(procs, count) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in procs:
        p.kill()


def live_once(sc: Scratch, count: int) -> tuple[Delivery, Delivery, str]:
    """fleet up streaming the flood, with an ssh `tail -f` of every node.log beside it."""
    job = sc.job("flood", FLOOD_SCRIPT, next_port(), args=[str(count)])
    proc = sc.fleet("up", str(job), "-i", str(sc.inventory(HOSTS)))
    run_id = ""
    procs: list[Proc] = []
    try:
        if not proc.until(lambda p: run_id_of(p) is not None, 60):
            raise RuntimeError(f"no run id:\n{proc.err_text()}")
        run_id = run_id_of(proc) or ""
        hosts = sc.tb.hosts[:HOSTS]
        proc.until(lambda p: all(node_log(h, run_id).exists() for h in hosts)
                   or p.poll() is not None, 120)
        start = time.monotonic()
        procs = tails(sc, run_id, HOSTS)
        code = proc.wait(TIMEOUT)
        wait_tails(procs, count, 60)
        if code != 0:
            raise RuntimeError(f"fleet up failed ({code}):\n{proc.err_text()}")
        return fleet_delivery(proc, HOSTS, count), ssh_delivery(procs, count, start), run_id
    finally:
        proc.kill()
        for p in procs:
            p.kill()
        if run_id:
            kill_run(sc.tb, run_id)


def replay_once(sc: Scratch, run_id: str, count: int) -> tuple[Delivery, Delivery]:
    """The finished run's logs again: `fleet logs RUN`, then an ssh `tail -f` loop."""
    wait_idle()
    proc = sc.fleet("logs", run_id)
    code = proc.wait(TIMEOUT)
    if code != 0:
        raise RuntimeError(f"fleet logs failed ({code}):\n{proc.err_text()}")
    fl = fleet_delivery(proc, HOSTS, count)
    wait_idle()
    start = time.monotonic()
    procs = tails(sc, run_id, HOSTS)
    wait_tails(procs, count, TIMEOUT)
    return fl, ssh_delivery(procs, count, start)


def throughput_table(sc: Scratch, cfg: Config) -> Table:
    count, reps = cfg.reps(20000, 10000), cfg.reps(3, 1)
    table = Table(f"logs: {HOSTS} hosts x {count} lines as fast as each rank can print; "
                  "lines per second from the first line to the last (every line checked)",
                  ["mode", "fleet lines/s", "ssh tail -f lines/s", "fleet/ssh (rate)",
                   "fleet: first line to last", "ssh: first to last", "fleet intact",
                   "ssh intact"])
    live: list[tuple[Delivery, Delivery]] = []
    replay: list[tuple[Delivery, Delivery]] = []
    for _ in range(reps):
        wait_idle()
        f, b, run_id = live_once(sc, count)
        live.append((f, b))
        replay.append(replay_once(sc, run_id, count))
    for mode, runs in (("live: fleet up beside ssh tail -f", live),
                       ("replay: fleet logs RUN, then ssh tail -f", replay)):
        fr, br = median([f.rate for f, _ in runs]), median([b.rate for _, b in runs])
        table.add(mode, fmt(fr, "", 0), fmt(br, "", 0), ratio(fr, br),
                  fmt(median([f.last - f.first for f, _ in runs])),
                  fmt(median([b.last - b.first for _, b in runs])),
                  all(f.intact for f, _ in runs), all(b.intact for _, b in runs))
    for f, _ in live + replay:
        if not f.intact:
            table.problems.append(f"fleet lost, repeated or reordered lines ({f.lines} of "
                                  f"{HOSTS * count})")
    table.notes.append(f"median of {reps} run(s); live: both read the same node.log files while "
                       "torchrun writes them (torchrun's --tee copy is the producer); replay: "
                       "each alone, from the finished files, end to end")
    return table


# ---- one line's delay -----------------------------------------------------------------------
def delays(lines: list[Line], rx: re.Pattern[str]) -> list[float]:
    return [x.wall - float(m.group(1)) for x in lines if (m := rx.search(x.text))]


def delay_table(sc: Scratch, cfg: Config) -> Table:
    stamps = cfg.reps(20, 12)
    job = sc.job("stamp", STAMP_SCRIPT, next_port(), args=[str(stamps)])
    wait_idle()
    proc = sc.fleet("up", str(job), "-i", str(sc.inventory(HOSTS)))
    procs: list[Proc] = []
    run_id = ""
    try:
        proc.until(lambda p: run_id_of(p) is not None, 60)
        run_id = run_id_of(proc) or ""
        proc.until(lambda p: all(node_log(h, run_id).exists() for h in sc.tb.hosts[:HOSTS])
                   or p.poll() is not None, 120)
        procs = tails(sc, run_id, HOSTS)
        code = proc.wait(TIMEOUT)
        time.sleep(1)
        if code != 0:
            raise RuntimeError(f"fleet up failed ({code}):\n{proc.err_text()}")
    finally:
        proc.kill()
        for p in procs:
            p.kill()
        if run_id:
            kill_run(sc.tb, run_id)
    fl = delays(proc.out, re.compile(r"\| stamp \d+ ([\d.]+)$"))
    base = [d for p in procs for d in delays(p.out, re.compile(r"^\[default0\]:stamp \d+ "
                                                                 r"([\d.]+)$"))]
    table = Table(f"log delay: one line every 0.5 s on each of {HOSTS} hosts, arrival minus the "
                  "time written in the line (same clock)",
                  ["path", "lines", "median", "p90", "max"])
    for name, ds in (("fleet up", fl), ("ssh tail -f (beside it)", base)):
        p90 = statistics.quantiles(ds, n=10)[8] if len(ds) >= 2 else None
        table.add(name, len(ds), fmt(median(ds), " s", 3), fmt(p90, " s", 3),
                  fmt(max(ds, default=None), " s", 3))
    fm, bm = median(fl), median(base)
    table.notes.append(f"fleet/ssh (median delay): {ratio(fm, bm)}; both include torchrun's "
                       "--tee copy into node.log, which polls its worker's file every 0.1 s")
    if len(fl) != HOSTS * stamps:
        table.problems.append(f"fleet delivered {len(fl)} of {HOSTS * stamps} stamp lines")
    return table


def run(cfg: Config) -> list[Table]:
    with testbed(HOSTS, cfg) as tb:
        sc = Scratch(tb, "logs")
        return [throughput_table(sc, cfg), delay_table(sc, cfg)]
