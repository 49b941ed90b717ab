"""Teardown: from one rank's crash to the job's last process gone on every host."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    Config,
    Proc,
    Scratch,
    Table,
    fmt,
    ideal_stop,
    kill_run,
    median,
    new_tag,
    next_port,
    ratio,
    run_dir,
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


POLL_S = 0.05  # how often the hosts are searched for the job's processes


@dataclass
class Teardown:
    gone: float | None  # seconds from the crash to the last process gone (None: not by the cap)
    left: int  # processes of the job still alive when the measurement ended
    crashed_gone: float | None  # seconds from the crash to the crashed node's processes gone
    exited: float | None = None  # fleet: the crashed node's torchrun exited (run.sh's exit_code)
    noticed: float | None = None  # fleet: seconds from the crash to its "stopping" line


def wait_marker(marker: Path, timeout: float, alive: list[Proc]) -> float:
    """The crash time the script wrote, waiting for it (and failing if the launchers die)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists():
            return float(marker.read_text())
        if all(p.poll() is not None for p in alive):
            break
        time.sleep(0.02)
    raise RuntimeError("the injected crash never happened:\n" +
                       "\n".join(p.err_text()[-2000:] for p in alive))


def measure(sc: Scratch, tag: str, marker: Path, n: int, cap: float, procs: list[Proc],
            on_crashed_gone: Callable[[], None] | None = None) -> Teardown:
    """Poll every POLL_S from the crash until no process of the job is left (or the cap);
    `on_crashed_gone` is called the moment the crashed node has none left."""
    crash = wait_marker(marker, START_TIMEOUT, procs)
    hosts = sc.tb.hosts[:n]
    crashed = hosts[1].name
    crashed_gone: float | None = None
    while True:
        now = time.time()
        left = run_pids(sc.tb, tag, hosts)
        if crashed_gone is None and not left[crashed]:
            crashed_gone = now - crash
            if on_crashed_gone is not None:
                on_crashed_gone()
                continue
        if not any(left.values()):
            return Teardown(now - crash, 0, crashed_gone)
        if now - crash > cap:
            return Teardown(None, sum(len(v) for v in left.values()), crashed_gone)
        time.sleep(max(0.0, POLL_S - (time.time() - now)))


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
        crash = float(marker.read_text())
        result.noticed = noticed(proc, crash)
        # run.sh writes exit_code (then renames it into place) right after torchrun exits.
        code_file = run_dir(sc.tb.hosts[1], run_id) / "exit_code"
        result.exited = code_file.stat().st_mtime - crash if code_file.exists() else None
        return result
    finally:
        proc.kill()
        if run_id:
            kill_run(sc.tb, run_id)


def ideal_once(sc: Scratch, n: int, cap: float) -> Teardown:
    """The ideal: bare torchrun started by an OpenSSH loop, and a watcher that knows at once
    (polling every POLL_S) when the crashed node's processes are gone, and then stops every
    other node in the ideal way (common.ideal_stop)."""
    tb, port, tag = sc.tb, next_port(), new_tag()
    marker = sc.dir / f"crash-{time.monotonic_ns()}"
    for h in tb.hosts[:n]:
        (h.home / "crash.py").write_text(CRASH_SCRIPT)
    procs = [Proc(ssh_argv(tb, h, torchrun_line(tb, i, n, port, "crash.py", [str(marker)],
                                                tag=tag, like_fleet=True)))
             for i, h in enumerate(tb.hosts[:n])]
    stoppers: list[Proc] = []
    others = [h for i, h in enumerate(tb.hosts[:n]) if i != 1]
    try:
        return measure(sc, tag, marker, n, cap, procs,
                       lambda: stoppers.extend(ideal_stop(tb, tag, others)))
    finally:
        for p in procs + stoppers:
            p.kill()
        kill_run(tb, tag)


def run(cfg: Config) -> list[Table]:
    counts, reps = cfg.pick((2, 4, 8), (2, 4)), cfg.reps(3, 1)
    cap = 30.0 if not cfg.quick else 15.0
    table = Table("teardown: rank 1 crashes; seconds from the crash until the job's last process "
                  f"is gone on every host (searched every {POLL_S} s)",
                  ["hosts", "fleet up", "ideal", "fleet/ideal", "target (<= 1.2x)",
                   "fleet: crashed node gone", "fleet: its torchrun exited", "fleet: noticed",
                   "noticed - exited", "target (<= 0.3 s)", "ideal: crashed node gone"])
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
                wait_idle()
                base.append(ideal_once(sc, n, cap))
            table.add(*row(n, fl, base, cap))
            table.notes.append(f"{n} hosts, each run (fleet / ideal): " + ", ".join(
                f"{fmt(x.gone)} / {fmt(y.gone)}" for x, y in zip(fl, base, strict=True)))
        table.notes.append(
            f"median of {reps} run(s) each, alternating. ideal: torchrun with fleet's options "
            "(--log-dir, --tee 3) started by an OpenSSH loop, and a watcher that sees the "
            f"crashed node's processes gone (within {POLL_S} s) and then runs the ideal "
            "parallel stop on every other node (one "
            "OpenSSH command each: SIGTERM to exactly the run's processes). Bare torchrun alone "
            "never stops the other nodes: their ranks would sleep on for 600 s")
        table.notes.append("`noticed`: fleet's line \"stopping the job on every other node\"; "
                           "`exited`: the mtime of exit_code, which run.sh writes as soon as "
                           "torchrun has exited")
    return [table]


def row(n: int, fl: list[Teardown], base: list[Teardown], cap: float) -> list[object]:
    def med(xs: list[float | None]) -> float | None:
        return median([x for x in xs if x is not None]) if all(x is not None for x in xs) \
            else None

    gone = median([x.gone if x.gone is not None else math.inf for x in fl])
    f = gone if gone is not None and gone < math.inf else None
    b = med([x.gone for x in base])
    lag = med([x.noticed - x.exited if x.noticed is not None and x.exited is not None else None
               for x in fl])
    ok = f is not None and b is not None and f <= 1.2 * b
    return [n, fmt(f) if f is not None else f"> {cap:.0f}s (cap)",
            fmt(b) if b is not None else f"> {cap:.0f}s (cap)", ratio(f, b),
            "met" if ok else "MISSED", fmt(med([x.crashed_gone for x in fl])),
            fmt(med([x.exited for x in fl])), fmt(med([x.noticed for x in fl])), fmt(lag),
            "met" if lag is not None and lag <= 0.3 else "MISSED",
            fmt(med([x.crashed_gone for x in base]))]
