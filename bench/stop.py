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
    kill_run,
    median,
    next_port,
    ratio,
    run_id_of,
    run_pids,
    ssh_argv,
    wait_idle,
)
from tests.testbed import TbHost, Testbed

READY_SCRIPT = 'import time\nprint("ready", flush=True)\ntime.sleep(600)\n'
TIMEOUT = 180  # seconds for a start, and for a stop


@dataclass
class Stopped:
    exit_s: float  # the stop command(s) returned, seconds after the stop began
    gone_s: float  # the last process of the run gone on every host
    left: dict[str, list[int]]  # what tb.run_processes still saw afterwards (nothing, normally)


def node_log(h: TbHost, run_id: str) -> Path:
    return h.home / "fleet" / "runs" / run_id / "node.log"


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
    """Poll every 0.1 s until the stop command(s) exited and no process of the run is left."""
    hosts = sc.tb.hosts[:n]
    gone: float | None = None
    deadline = t0 + TIMEOUT
    while time.monotonic() < deadline:
        now = time.monotonic()
        if gone is None and not any(run_pids(sc.tb, run_id, hosts).values()):
            gone = now - t0
        if gone is not None and all(p.poll() is not None for p in procs):
            break
        time.sleep(max(0.0, 0.1 - (time.monotonic() - now)))
    for p in procs:
        p.wait(5)
    if any(p.p.returncode != 0 for p in procs):
        raise RuntimeError("stop failed: " + " / ".join(p.err_text()[-500:] for p in procs))
    left = {h.name: pids for h in hosts if (pids := sc.tb.run_processes(h.name, run_id))}
    kill_run(sc.tb, run_id)
    ended = max(p.ended or time.monotonic() for p in procs)
    return Stopped(ended - t0, gone if gone is not None else float("inf"), left)


def fleet_stop(sc: Scratch, n: int) -> Stopped:
    run_id = start_sleeper(sc, n)
    wait_idle()
    t0 = time.monotonic()
    return stop_with(sc, n, run_id, [sc.fleet("stop", run_id)], t0)


def ssh_stop(sc: Scratch, n: int) -> Stopped:
    """The baseline: an OpenSSH loop running the same node stop.sh that `fleet stop` runs."""
    run_id = start_sleeper(sc, n)
    wait_idle()
    t0 = time.monotonic()
    procs = [Proc(ssh_argv(sc.tb, h, f"bash {h.home}/fleet/runs/{run_id}/stop.sh"))
             for h in sc.tb.hosts[:n]]
    return stop_with(sc, n, run_id, procs, t0)


def run(cfg: Config) -> list[Table]:
    n, reps = (4 if cfg.quick else 8), cfg.reps(3, 2)
    table = Table("stop: `fleet stop RUN` of a detached job whose ranks sleep, seconds since the "
                  "stop began",
                  ["hosts", "fleet stop: last process gone", "fleet stop: command exit",
                   "ssh loop stop.sh: gone", "ssh loop: exit", "fleet/ssh (gone)",
                   "fleet/ssh (exit)", "target", "left after stop"])
    with Testbed(n) as tb:
        sc = Scratch(tb, "stop")
        fl: list[Stopped] = []
        base: list[Stopped] = []
        for _ in range(reps):
            wait_idle()
            fl.append(fleet_stop(sc, n))
            wait_idle()
            base.append(ssh_stop(sc, n))
    fg, fe = median([x.gone_s for x in fl]), median([x.exit_s for x in fl])
    bg, be = median([x.gone_s for x in base]), median([x.exit_s for x in base])
    left = {k: v for x in fl for k, v in x.left.items()}
    ok = fg is not None and fg < 3.0 and fe is not None and fe < 3.0 and not left
    table.add(n, fmt(fg), fmt(fe), fmt(bg), fmt(be), ratio(fg, bg), ratio(fe, be),
              "< 3 s, nothing left " + ("met" if ok else "MISSED"),
              "nothing" if not left else str(left))
    table.notes.append(f"median of {reps} runs each; after every stop tb.run_processes found "
                       + ("nothing of the run on any host" if not left else f"{left}"))
    table.notes.append("the ssh loop runs each node's own stop.sh (what `fleet stop` runs) over "
                       "OpenSSH: the ratio is fleet's CLI and connection overhead")
    if left:
        table.problems.append(f"fleet stop left processes behind: {left}")
    return [table]
