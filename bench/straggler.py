"""Straggler sampling's overhead: the same job under `fleet up` on 4 hosts, one rank each
(tests/e2e/straggler_job.py: matmuls on one CPU thread, then a Gloo all_reduce, step after step),
with every rank sampling its own stack (the default) and with `[watchdog] sampling = false`, the
two at the same time on 4 hosts each (so that both meet the machine's same load); the median step
time of each side by side (the target: sampling costs at most 1% of a step). Beside it, the
sampler's own work timed in this process: what it costs whatever the machine's load does to the
step times."""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    Config,
    Proc,
    Scratch,
    Table,
    fmt,
    median,
    next_port,
    run_dir,
    run_id_of,
    testbed,
    wait_idle,
)
from tests.testbed import TbHost

HOSTS = 4
TARGET = 1.01  # sampling on / off, at most
JOB = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "straggler_job.py"
STEP = re.compile(r"\| rank (\d+) on \S+ step \d+ step_s ([\d.]+) cpu_s ([\d.]+)$")
WARMUP = 2  # each rank's first lines (its first 10 steps) are left out
START_S = 300  # a run's start (torch imported on a loaded machine) at most, beyond its seconds
OFF = "[watchdog]\nsampling = false\n"  # the baseline's job: no rank samples


@dataclass
class Run:
    sampling: bool
    steps: list[float]  # every rank's step times (each the mean of 5 steps)
    cpu: list[float]  # ... and its process's CPU seconds a step (every thread's)
    sampled: int  # ranks that wrote a sample summary on their node

    @property
    def median(self) -> float | None:
        return median(self.steps)


def start(sc: Scratch, sampling: bool, hosts: list[TbHost], seconds: int, k: int) -> Proc:
    name = f"{'on' if sampling else 'off'}{k}"
    job = sc.job(name, JOB.read_text(), next_port(), args=["--seconds", str(seconds)],
                 extra="" if sampling else OFF)
    inv = sc.tb.inventory(sc.dir / f"inv-{name}.toml", [h.name for h in hosts],
                          workdir=f"~/fleet-straggler-{name}")
    return sc.fleet("up", str(job), "-i", str(inv))


def finish(sc: Scratch, p: Proc, sampling: bool, hosts: list[TbHost], seconds: int) -> Run:
    code = p.wait(seconds + START_S)
    if code != 0:
        raise RuntimeError(f"fleet up (sampling {sampling}) exit {code}:\n{p.err_text()[-3000:]}")
    steps: dict[int, list[tuple[float, float]]] = {}
    for line in p.out_text().splitlines():
        if m := STEP.search(line):
            steps.setdefault(int(m.group(1)), []).append((float(m.group(2)), float(m.group(3))))
    if len(steps) != len(hosts):
        raise RuntimeError(f"step lines of {sorted(steps)} only:\n{p.out_text()[-2000:]}")
    run_id = run_id_of(p) or ""
    sampled = sum(len(list((run_dir(h, run_id) / "samples").glob("[0-9]*"))) for h in hosts)
    kept = [s for xs in steps.values() for s in xs[WARMUP:]]
    return Run(sampling, [s for s, _ in kept], [c for _, c in kept], sampled)


def pair(sc: Scratch, k: int, seconds: int) -> tuple[Run, Run]:
    """(sampling on, off): the job on two sets of HOSTS hosts at the same time, so that both
    meet the same load from the machine's other work; which set samples alternates with k."""
    first, second = sc.tb.hosts[:HOSTS], sc.tb.hosts[HOSTS:]
    on_hosts, off_hosts = (first, second) if k % 2 == 0 else (second, first)
    procs = [(True, on_hosts, start(sc, True, on_hosts, seconds, k)),
             (False, off_hosts, start(sc, False, off_hosts, seconds, k))]
    try:
        on, off = (finish(sc, p, sampling, hosts, seconds) for sampling, hosts, p in procs)
    finally:
        for _, _, p in procs:
            p.kill()
    return on, off


def sampler_cost(seconds: float = 2.0) -> tuple[float, float]:
    """(CPU microseconds of one sample, of one summary written to a file): the sampler's loop
    body (fleet/nodeside/sitecustomize.py) on this thread's own stack, 30 frames deep, timed by
    the thread's own CPU clock (what other work on the machine does not inflate)."""
    import threading

    from fleet.nodeside.shared.sampling import Window, classify, stack

    main = threading.get_ident()
    w = Window()

    def sample() -> None:  # as the sampler does
        w.add(time.time(), *classify(stack(sys._current_frames().get(main))))  # noqa: SLF001

    def deep(n: int) -> tuple[float, float]:
        if n:
            return deep(n - 1)
        t0, count = time.thread_time(), 0
        while time.thread_time() - t0 < seconds:
            sample()
            count += 1
        per_sample = (time.thread_time() - t0) / count
        t0, count = time.thread_time(), 0
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, str(os.getpid()))
            while time.thread_time() - t0 < seconds / 4:
                w.mark(time.time(), time.process_time(), None, None)
                with open("/proc/self/statm") as f:
                    rss = int(f.read().split()[1]) * 4096
                with open(f"{out}.tmp", "w") as f:
                    f.write(w.summary(0, 0, os.getpid(), True, time.time(), rss))
                os.replace(f"{out}.tmp", out)
                count += 1
        return per_sample * 1e6, (time.thread_time() - t0) / count * 1e6

    return deep(30)


def run(cfg: Config) -> list[Table]:
    from fleet.nodeside.shared.sampling import SAMPLE_HZ, WRITE_S

    reps, seconds = cfg.reps(4, 2), 60 if not cfg.quick else 40
    load0, t0 = os.getloadavg()[0], time.monotonic()
    pairs: list[tuple[Run, Run]] = []
    with testbed(2 * HOSTS, cfg) as tb:
        sc = Scratch(tb, "straggler")
        for k in range(reps):
            wait_idle()
            pairs.append(pair(sc, k, seconds))
    runs = [x for two in pairs for x in two]
    per_sample, per_write = sampler_cost()
    share = (per_sample * SAMPLE_HZ + per_write / WRITE_S) / 1e6
    t = Table(f"straggler: step time of a job on {HOSTS} hosts (1 rank each: matmuls, then a "
              "Gloo all_reduce), every rank sampling its stack (the default) against "
              f"`[watchdog] sampling = false` on {HOSTS} other hosts at the same time",
              ["sampling", "runs", "step times", "median step", "each run's median",
               "on/off (median pair)", "each pair's on/off", "target (<= 1.01x)", "CPU a step",
               "on/off (CPU)"])
    on = [a for a, _ in pairs]
    off = [b for _, b in pairs]
    m_on, m_off = (median([s for x in xs for s in x.steps]) for xs in (on, off))
    c_on, c_off = (median([c for x in xs for c in x.cpu]) for xs in (on, off))
    each = [a.median / b.median for a, b in pairs if a.median and b.median]
    ratio = median(each)  # a pair's runs met the same load: its ratio is the measure
    ok = ratio is not None and ratio <= TARGET
    t.add("on", len(on), sum(len(x.steps) for x in on), fmt(m_on, digits=4),
          ", ".join(fmt(x.median, digits=3) for x in on), f"{ratio:.3f}x" if ratio else "-",
          ", ".join(f"{r:.3f}x" for r in each), "met" if ok else "MISSED",
          fmt(c_on, digits=4), f"{c_on / c_off:.3f}x" if c_on and c_off else "-")
    t.add("off", len(off), sum(len(x.steps) for x in off), fmt(m_off, digits=4),
          ", ".join(fmt(x.median, digits=3) for x in off), "", "", "", fmt(c_off, digits=4), "")
    if any(x.sampled < HOSTS for x in on) or any(x.sampled for x in off):
        t.problems.append("sampling was not on in every rank of the `on` runs, or not off in "
                          "the `off` runs: summaries per run (on, off) "
                          f"{[(a.sampled, b.sampled) for a, b in pairs]}")
    t.notes.append(
        f"{reps} pairs, {seconds} s each: in each pair the job runs twice at once, sampling on "
        f"{HOSTS} hosts and off on the {HOSTS} others (which set samples alternates), so that "
        "both meet the same load from the machine's other work; each rank's first "
        f"{WARMUP * 5} steps are left out; a step time is a rank's mean over 5 steps, the "
        "medians are over every rank's. CPU a step: the rank's process's CPU time (every "
        "thread's, the sampler's too) over those steps")
    spread = [x.median for x in runs if x.median]
    if len(spread) > 1:
        cv = statistics.pstdev(spread) / statistics.mean(spread)
        t.notes.append(f"run-to-run spread of the medians: {cv:.1%} (the machine's other work "
                       "moves them)")
    t.notes.append(f"the sampler's own work, its thread's CPU time here on a 30-frame stack: "
                   f"{per_sample:.1f} us a sample x {SAMPLE_HZ:g} a second + {per_write:.0f} us "
                   f"a summary written every {WRITE_S:g} s = {share:.3%} of one CPU")
    t.notes.append(f"load average (1 min) at the start and the end: {load0:.2f} and "
                   f"{os.getloadavg()[0]:.2f} (2 cores, every host on them); it took "
                   f"{time.monotonic() - t0:.0f} s")
    return [t]
