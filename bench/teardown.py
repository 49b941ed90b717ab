"""Teardown: from one rank's crash to the job's last process gone on every host."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    Config,
    Proc,
    Scratch,
    Table,
    fmt,
    kill_run,
    median,
    new_tag,
    next_port,
    ratio,
    run_id_of,
    run_pids,
    ssh_argv,
    testbed,
    torchrun_line,
    wait_idle,
)

# Rank 1 (a non-master node with nproc 1) writes the wall-clock time of its crash to the file
# named by argv[1], then raises; every other rank sleeps.
CRASH_SCRIPT = '''import os, sys, time
if os.environ["RANK"] == "1":
    time.sleep(3)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    raise RuntimeError("injected crash")
time.sleep(600)
'''
START_TIMEOUT = 180  # seconds for the job to reach the crash


@dataclass
class Teardown:
    gone: float | None  # seconds from the crash to the last process gone (None: not by the cap)
    left: int  # processes of the job still alive when the measurement ended
    crashed_gone: float | None  # seconds from the crash to the crashed node's processes gone
    noticed: float | None = None  # fleet: seconds from the crash to its "stopping" line


def wait_marker(marker: Path, timeout: float, alive: list[Proc]) -> float:
    """The crash time the script wrote, waiting for it (and failing if the launchers die)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists():
            return float(marker.read_text())
        if all(p.poll() is not None for p in alive):
            break
        time.sleep(0.05)
    raise RuntimeError("the injected crash never happened:\n" +
                       "\n".join(p.err_text()[-2000:] for p in alive))


def measure(sc: Scratch, tag: str, marker: Path, n: int, cap: float,
            procs: list[Proc]) -> Teardown:
    """Poll every 0.1 s from the crash until no process of the job is left (or the cap)."""
    crash = wait_marker(marker, START_TIMEOUT, procs)
    hosts = sc.tb.hosts[:n]
    crashed = hosts[1].name
    crashed_gone: float | None = None
    while True:
        now = time.time()
        left = run_pids(sc.tb, tag, hosts)
        if crashed_gone is None and not left[crashed]:
            crashed_gone = now - crash
        if not any(left.values()):
            return Teardown(now - crash, 0, crashed_gone)
        if now - crash > cap:
            return Teardown(None, sum(len(v) for v in left.values()), crashed_gone)
        time.sleep(max(0.0, 0.1 - (time.time() - now)))


def noticed(proc: Proc, crash: float) -> float | None:
    hits = [x.wall for x in proc.err if "stopping the job on every other node" in x.text]
    return hits[0] - crash if hits else None


def fleet_once(sc: Scratch, n: int, cap: float) -> Teardown:
    marker = sc.dir / f"crash-{time.monotonic_ns()}"
    job = sc.job("crash", CRASH_SCRIPT, next_port(), args=[str(marker)])
    proc = sc.fleet("up", str(job), "-i", str(sc.inventory(n)))
    run_id = ""
    try:
        if not proc.until(lambda p: run_id_of(p) is not None, 60):
            raise RuntimeError(f"fleet printed no run id:\n{proc.err_text()}")
        run_id = run_id_of(proc) or ""
        result = measure(sc, run_id, marker, n, cap, [proc])
        code = proc.wait(120)
        if code != 1:
            raise RuntimeError(f"fleet up exited {code}, not 1:\n{proc.err_text()}")
        result.noticed = noticed(proc, float(marker.read_text()))
        return result
    finally:
        proc.kill()
        if run_id:
            kill_run(sc.tb, run_id)


def ssh_once(sc: Scratch, n: int, cap: float) -> Teardown:
    tb, port, tag = sc.tb, next_port(), new_tag()
    marker = sc.dir / f"crash-{time.monotonic_ns()}"
    for h in tb.hosts[:n]:
        (h.home / "crash.py").write_text(CRASH_SCRIPT)
    procs = [Proc(ssh_argv(tb, h, torchrun_line(tb, i, n, port, "crash.py", [str(marker)],
                                                tag=tag)))
             for i, h in enumerate(tb.hosts[:n])]
    try:
        return measure(sc, tag, marker, n, cap, procs)
    finally:
        for p in procs:
            p.kill()
        kill_run(tb, tag)


def run(cfg: Config) -> list[Table]:
    counts, reps = cfg.pick((2, 4, 8), (2, 4)), cfg.reps(3, 1)
    cap = 30.0 if not cfg.quick else 15.0
    table = Table("teardown: rank 1 crashes; seconds from the crash until the job's last process "
                  "is gone on every host (polled every 0.1 s)",
                  ["hosts", "fleet up", "ssh loop (bare torchrun)", "fleet/ssh", "target",
                   "fleet: crashed node gone", "fleet: noticed", "ssh: crashed node gone",
                   "ssh: left at cap"])
    with testbed(max(counts), cfg) as tb:
        sc = Scratch(tb, "teardown")
        for n in counts:
            fl: list[Teardown] = []
            base: list[Teardown] = []
            for _ in range(reps):
                wait_idle()
                fl.append(fleet_once(sc, n, cap))
                if fl[-1].gone is None:
                    table.problems.append(f"{n} hosts: fleet left {fl[-1].left} process(es) "
                                          f"after {cap:.0f} s (killed by PID then)")
                if not base or base[-1].gone is not None:  # past the cap once is enough
                    wait_idle()
                    base.append(ssh_once(sc, n, cap))
            table.add(*row(n, fl, base, cap))
            table.notes.append(f"{n} hosts, each fleet run: "
                               + ", ".join(fmt(x.gone) if x.gone is not None else f"> {cap:.0f}s"
                                           for x in fl))
        table.notes.append(f"fleet: median of {reps} run(s); the ssh loop is not repeated once it "
                           f"passes the {cap:.0f} s cap (static torchrun never stops the other "
                           "nodes: their ranks sleep on for 600 s, then are killed by PID)")
    return [table]


def row(n: int, fl: list[Teardown], base: list[Teardown], cap: float) -> list[object]:
    def med(xs: list[float | None]) -> float | None:
        return median([x for x in xs if x is not None]) if all(x is not None for x in xs) \
            else None

    gone = median([x.gone if x.gone is not None else math.inf for x in fl])
    f = gone if gone is not None and gone < math.inf else None
    b = med([x.gone for x in base])
    ok = f is not None and f < 3.0
    return [n, fmt(f) if f is not None else f"> {cap:.0f}s (cap)",
            fmt(b) if b is not None else f"> {cap:.0f}s (cap)",
            ratio(f, b) if b is not None else ("< " + ratio(f, cap) if f is not None else "-"),
            "< 3 s " + ("met" if ok else "MISSED"), fmt(med([x.crashed_gone for x in fl])),
            fmt(med([x.noticed for x in fl])), fmt(med([x.crashed_gone for x in base])),
            max(x.left for x in base)]
