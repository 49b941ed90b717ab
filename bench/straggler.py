"""Straggler sampling's overhead: the same job under `fleet up` on 4 hosts, one rank each
(tests/e2e/straggler_job.py: matmuls on one CPU thread, then a Gloo all_reduce, step after step),
with every rank sampling its own stack (the default) and with `[watchdog] sampling = false`, runs
interleaved; the median step time of each side by side (the target: sampling costs at most 1% of
a step). Beside it, the sampler's own work timed in this process: what it costs whatever the
machine's load does to the step times."""

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


def one(sc: Scratch, sampling: bool, seconds: int, k: int) -> Run:
    job = sc.job(f"{'on' if sampling else 'off'}{k}", JOB.read_text(), next_port(),
                 args=["--seconds", str(seconds)],
                 extra="" if sampling else OFF)
    p: Proc = sc.fleet("up", str(job), "-i", str(sc.inventory(HOSTS)))
    code = p.wait(seconds + START_S)
    if code != 0:
        raise RuntimeError(f"fleet up (sampling {sampling}) exit {code}:\n{p.err_text()[-3000:]}")
    steps: dict[int, list[tuple[float, float]]] = {}
    for line in p.out_text().splitlines():
        if m := STEP.search(line):
            steps.setdefault(int(m.group(1)), []).append((float(m.group(2)), float(m.group(3))))
    if len(steps) != HOSTS:
        raise RuntimeError(f"step lines of {sorted(steps)} only:\n{p.out_text()[-2000:]}")
    run_id = run_id_of(p) or ""
    sampled = sum(len(list((run_dir(h, run_id) / "samples").glob("[0-9]*")))
                  for h in sc.tb.hosts[:HOSTS])
    kept = [s for xs in steps.values() for s in xs[WARMUP:]]
    return Run(sampling, [s for s, _ in kept], [c for _, c in kept], sampled)


def sampler_cost(seconds: float = 2.0) -> tuple[float, float]:
    """(CPU microseconds of one sample, of one summary written to a file): the sampler's loop
    body (fleet/nodeside/sitecustomize.py) on this thread's own stack, 30 frames deep, timed by
    the thread's own CPU clock (what other work on the machine does not inflate)."""
    import threading

    from fleet.nodeside.shared.sampling import Window, classify

    main = threading.get_ident()
    w = Window()

    def sample() -> None:
        frame = sys._current_frames().get(main)  # noqa: SLF001 (as the sampler does)
        frames: list[tuple[str, str, int]] = []
        while frame is not None and len(frames) < 64:
            code = frame.f_code
            frames.append((code.co_filename, code.co_name, frame.f_lineno))
            frame = frame.f_back
        del frame
        w.add(time.time(), *classify(frames))

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

    reps, seconds = cfg.reps(4, 2), 60 if not cfg.quick else 30
    load0, t0 = os.getloadavg()[0], time.monotonic()
    runs: list[Run] = []
    with testbed(HOSTS, cfg) as tb:
        sc = Scratch(tb, "straggler")
        for k in range(reps):
            for sampling in ((True, False) if k % 2 == 0 else (False, True)):
                wait_idle()
                runs.append(one(sc, sampling, seconds, k))
    per_sample, per_write = sampler_cost()
    share = (per_sample * SAMPLE_HZ + per_write / WRITE_S) / 1e6
    t = Table(f"straggler: step time of a job on {HOSTS} hosts (1 rank each: matmuls, then a "
              "Gloo all_reduce), every rank sampling its stack (the default) against "
              "`[watchdog] sampling = false`",
              ["sampling", "runs", "step times", "median step", "per run (median)",
               "on/off", "target (<= 1.01x)", "CPU a step", "on/off (CPU)"])
    on = [x for x in runs if x.sampling]
    off = [x for x in runs if not x.sampling]
    m_on = median([s for x in on for s in x.steps])
    m_off = median([s for x in off for s in x.steps])
    ratio = m_on / m_off if m_on and m_off else None
    c_on = median([c for x in on for c in x.cpu])
    c_off = median([c for x in off for c in x.cpu])
    cpu_ratio = c_on / c_off if c_on and c_off else None
    for name, xs, m, c in (("on", on, m_on, c_on), ("off", off, m_off, c_off)):
        first = name == "on"
        t.add(name, len(xs), sum(len(x.steps) for x in xs), fmt(m, digits=4),
              ", ".join(fmt(x.median, digits=3) for x in xs),
              f"{ratio:.3f}x" if ratio and first else "",
              ("met" if ratio <= TARGET else "MISSED") if ratio and first else "",
              fmt(c, digits=4), f"{cpu_ratio:.3f}x" if cpu_ratio and first else "")
    if any(x.sampled < HOSTS for x in on) or any(x.sampled for x in off):
        t.problems.append("sampling was not on in every rank of the `on` runs, or not off in "
                          f"the `off` runs: summaries per run {[x.sampled for x in runs]}")
    spread = [x.median for x in runs if x.median]
    t.notes.append(f"{reps} runs of each, interleaved (on/off, then off/on), {seconds} s each, "
                   f"each rank's first {WARMUP * 5} steps left out; each step time is a rank's "
                   "mean over 5 steps; medians over every rank's. CPU a step: the rank's "
                   "process's CPU time (every thread's, the sampler's too) over those steps, "
                   "which the machine's other work moves less than the wall time")
    if len(spread) > 1:
        cv = statistics.pstdev(spread) / statistics.mean(spread)
        t.notes.append(f"run-to-run spread of the medians: {cv:.1%} (the machine's other work "
                       "moves them)")
    t.notes.append(f"the sampler's own work, its thread's CPU time here on a 30-frame stack: "
                   f"{per_sample:.1f} us a sample x {SAMPLE_HZ:g} a second + {per_write:.0f} us "
                   "a summary written every "
                   f"{WRITE_S:g} s = {share:.3%} of one CPU")
    t.notes.append(f"load average (1 min) at the start and the end: {load0:.2f} and "
                   f"{os.getloadavg()[0]:.2f} (2 cores, every host on them); it took "
                   f"{time.monotonic() - t0:.0f} s")
    return [t]
