"""Stop: `fleet stop` of a detached sleeping job until its last process is gone on every host."""

from __future__ import annotations

import time
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
    next_port,
    ratio,
    run_dir,
    run_id_of,
    run_pids,
    testbed,
    wait_idle,
)
from tests.testbed import TbHost

READY_SCRIPT = 'import time\nprint("ready", flush=True)\ntime.sleep(600)\n'
TIMEOUT = 180  # seconds for a start
STOP_CAP = 90  # seconds a stop may take before it counts as "> cap" (and leftovers are killed)
POLL_S = 0.05  # how often the hosts are searched for the run's processes


@dataclass
class Stopped:
    exit_s: float | None  # the stop command(s) returned, seconds after the stop began
    gone_s: float | None  # the last process of the run gone on every host (None: past the cap)
    left: dict[str, list[int]]  # what tb.run_processes still saw afterwards (nothing, normally)
    term_s: float | None = None  # fleet: the last node's stop.sh began (its `stopped` file)


def node_log(h: TbHost, run_id: str) -> Path:
    return run_dir(h, run_id) / "node.log"


def start_sleeper(sc: Scratch, n: int) -> str:
    """`fleet up --detach` of a job whose ranks print "ready" and sleep; returns once every
    rank has printed it (its node.log says so)."""
    job = sc.job("sleeper", READY_SCRIPT, next_port())
    proc = sc.fleet("up", "--detach", str(job), "-i", str(sc.inventory(n)))
    code = proc.wait(TIMEOUT)
    run_id = run_id_of(proc)
    if code != 0 or run_id is None:
        raise RuntimeError(f"fleet up --detach failed ({code}):\n{proc.err_text()}")
    deadline = time.monotonic() + TIMEOUT
    for h in sc.tb.hosts[:n]:
        while "ready" not in (node_log(h, run_id).read_text() if node_log(h, run_id).exists()
                              else ""):
            if time.monotonic() > deadline:
                kill_run(sc.tb, run_id)
                raise RuntimeError(f"{h.name} never printed ready")
            time.sleep(0.1)
    return run_id


def stop_with(sc: Scratch, n: int, run_id: str, procs: list[Proc], t0: float) -> Stopped:
    """Poll every POLL_S until the stop command(s) exited and no process of the run is left."""
    hosts = sc.tb.hosts[:n]
    gone: float | None = None
    while time.monotonic() < t0 + STOP_CAP:
        now = time.monotonic()
        if gone is None and not any(run_pids(sc.tb, run_id, hosts).values()):
            gone = now - t0
        if gone is not None and all(p.poll() is not None for p in procs):
            break
        time.sleep(max(0.0, POLL_S - (time.monotonic() - now)))
    codes = [p.wait(1) for p in procs]
    ends = [p.ended for p in procs if p.ended is not None]
    exit_s = max(ends) - t0 if len(ends) == len(procs) else None
    left = {h.name: pids for h in hosts if (pids := sc.tb.run_processes(h.name, run_id))}
    kill_run(sc.tb, run_id)
    if exit_s is not None and any(c != 0 for c in codes):
        raise RuntimeError("stop failed: " + " / ".join(p.err_text()[-500:] for p in procs))
    return Stopped(exit_s, gone, left)


def capped(xs: list[float | None]) -> str:
    return fmt(median([x for x in xs if x is not None])) if None not in xs else f"> {STOP_CAP}s"


def capped_ratio(a: list[float | None], b: list[float | None]) -> str:
    if None in a or None in b:
        return "-"
    return ratio(median([x for x in a if x is not None]), median([x for x in b if x is not None]))


def fleet_stop(sc: Scratch, n: int) -> Stopped:
    run_id = start_sleeper(sc, n)
    wait_idle()
    t0, wall0 = time.monotonic(), time.time()
    result = stop_with(sc, n, run_id, [sc.fleet("stop", run_id)], t0)
    # stop.sh writes `stopped` first thing, then signals: when each node began to stop.
    marks = [run_dir(h, run_id) / "stopped" for h in sc.tb.hosts[:n]]
    if all(m.exists() for m in marks):
        result.term_s = max(m.stat().st_mtime for m in marks) - wall0
    return result


def ideal_stop_run(sc: Scratch, n: int) -> Stopped:
    """The baseline: the ideal parallel stop (common.ideal_stop): one OpenSSH command per node
    at once, each one SIGTERM to exactly the run's processes there."""
    run_id = start_sleeper(sc, n)
    wait_idle()
    t0 = time.monotonic()
    return stop_with(sc, n, run_id, ideal_stop(sc.tb, run_id, sc.tb.hosts[:n]), t0)


def run(cfg: Config) -> list[Table]:
    n, reps = (4 if cfg.quick else 8), cfg.reps(5, 2)
    table = Table("stop: `fleet stop RUN` of a detached job whose ranks sleep, against the ideal "
                  "parallel stop; seconds since the stop began",
                  ["hosts", "fleet stop: last process gone", "fleet stop: command exit",
                   "ideal stop: last process gone", "ideal: ssh exit", "fleet/ideal (gone)",
                   "target", "left after stop", "fleet: last stop.sh began"])
    with testbed(n, cfg) as tb:
        sc = Scratch(tb, "stop")
        fl: list[Stopped] = []
        base: list[Stopped] = []
        for _ in range(reps):
            wait_idle()
            fl.append(fleet_stop(sc, n))
            wait_idle()
            base.append(ideal_stop_run(sc, n))
    gone, ex, ideal_gone = [x.gone_s for x in fl], [x.exit_s for x in fl], \
        [x.gone_s for x in base]
    left = {k: v for x in fl for k, v in x.left.items()}
    ok = (None not in gone + ideal_gone and not left
          and median([x for x in gone if x is not None]) <=  # type: ignore[operator]
          1.1 * median([x for x in ideal_gone if x is not None]))  # type: ignore[operator]
    table.add(n, capped(gone), capped(ex), capped(ideal_gone),
              capped([x.exit_s for x in base]), capped_ratio(gone, ideal_gone),
              "<= 1.1x, nothing left " + ("met" if ok else "MISSED"),
              "nothing" if not left else str(left), capped([x.term_s for x in fl]))
    table.notes.append("each run: " + ", ".join(f"fleet {fmt(x.gone_s)}/{fmt(x.exit_s)}, "
                                                f"ideal {fmt(y.gone_s)}/{fmt(y.exit_s)}"
                                                for x, y in zip(fl, base, strict=True)))
    table.notes.append(f"median of {reps} run(s) each, alternating; the hosts are searched for "
                       f"the run's processes every {POLL_S} s; after every fleet stop "
                       "tb.run_processes found "
                       + ("nothing of the run on any host" if not left else f"{left}"))
    table.notes.append("ideal: OpenSSH to every node at once, each running `kill -TERM` of every "
                       "process whose environment has the run's FLEET_RUN_ID (run.sh, torchrun, "
                       "the workers), found with one grep over /proc; `exit` is when the ssh "
                       "commands returned, `gone` when no process of the run was left")
    table.notes.append("`last stop.sh began`: the latest mtime of the `stopped` file each node's "
                       "stop.sh writes before it signals: what fleet itself took (python, its "
                       "imports, connecting) before the run's processes were told to stop")
    if left:
        table.problems.append(f"fleet stop left processes behind: {left}")
    return [table]
