"""End: from the last torchrun's exit on any node to the command's exit, fleet against the
OpenSSH loop running the same torchrun lines."""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    run_dir,
    run_id_of,
    ssh_argv,
    testbed,
    torchrun_line,
    wait_idle,
)

# Every rank joins the group, all-reduces once, prints its sum and exits (the job).
ALLREDUCE_SCRIPT = '''import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
'''
TIMEOUT = 180  # seconds for one whole run


@dataclass
class End:
    total: float  # the command(s) began to the last exit, seconds
    end: float  # the last torchrun exited on any node to the command's (the loop's) exit
    first_after: float | None = None  # fleet: its first stderr line after that torchrun exit
    report: float | None = None  # fleet: its last stderr line (the verdict), after the exit


def wall(p: Proc) -> float:
    """When the process was seen to exit, as time.time()."""
    assert p.ended is not None
    return time.time() - (time.monotonic() - p.ended)


def fleet_once(sc: Scratch, n: int) -> End:
    job = sc.job("end", ALLREDUCE_SCRIPT, next_port())
    t0 = time.time()
    proc = sc.fleet("up", str(job), "-i", str(sc.inventory(n)))
    run_id = ""
    try:
        code = proc.wait(TIMEOUT)
        run_id = run_id_of(proc) or ""
        if code != 0 or not run_id:
            raise RuntimeError(f"fleet up exited {code}:\n{proc.err_text()}")
        # run.sh writes exit_code (then renames it into place) right after torchrun exits.
        last = max((run_dir(h, run_id) / "exit_code").stat().st_mtime for h in sc.tb.hosts[:n])
        done = wall(proc)
        after = [x.wall for x in proc.err if x.wall >= last]
        return End(done - t0, done - last, after[0] - last if after else None,
                   after[-1] - last if after else None)
    finally:
        proc.kill()
        if run_id:
            kill_run(sc.tb, run_id)


def loop_once(sc: Scratch, n: int) -> End:
    """The OpenSSH loop: one `ssh HOST torchrun ...` per node at once, each writing the time
    its torchrun exited (date, right after it, as fleet's run.sh writes exit_code)."""
    tb, port, tag = sc.tb, next_port(), new_tag()
    for h in tb.hosts[:n]:
        (h.home / "end.py").write_text(ALLREDUCE_SCRIPT)
    mark = f"end-{tag}"
    t0 = time.time()
    procs = [Proc(ssh_argv(tb, h, torchrun_line(tb, i, n, port, "end.py", tag=tag,
                                                like_fleet=True) + f"; date +%s.%N > ~/{mark}"))
             for i, h in enumerate(tb.hosts[:n])]
    try:
        codes = [p.wait(TIMEOUT) for p in procs]
        if any(c != 0 for c in codes):
            raise RuntimeError("the loop failed: " + " / ".join(p.err_text()[-500:]
                                                                for p in procs))
        last = max(float((h.home / mark).read_text()) for h in tb.hosts[:n])
        done = max(wall(p) for p in procs)
        return End(done - t0, done - last)
    finally:
        for p in procs:
            p.kill()
        kill_run(tb, tag)


def run(cfg: Config) -> list[Table]:
    counts, reps = cfg.pick((4, 8), (4,)), cfg.reps(5, 3)
    table = Table("end: a job that all-reduces once and exits; seconds from the last torchrun's "
                  "exit on any node to the command's exit",
                  ["hosts", "fleet: end", "OpenSSH loop: end", "fleet - loop", "target (<= 0.3 s)",
                   "fleet: whole run", "loop: whole run", "fleet: first line after",
                   "fleet: last line after"])
    with testbed(max(counts), cfg) as tb:
        sc = Scratch(tb, "end")
        for n in counts:
            fl: list[End] = []
            base: list[End] = []
            for _ in range(reps):
                wait_idle()
                fl.append(fleet_once(sc, n))
                wait_idle()
                base.append(loop_once(sc, n))
            f, b = median([x.end for x in fl]), median([x.end for x in base])
            assert f is not None and b is not None
            table.add(n, fmt(f), fmt(b), fmt(f - b), "met" if f <= 0.3 else "MISSED",
                      fmt(median([x.total for x in fl])), fmt(median([x.total for x in base])),
                      fmt(median([x.first_after for x in fl if x.first_after is not None])),
                      fmt(median([x.report for x in fl if x.report is not None])))
            table.notes.append(f"{n} hosts, each run (fleet / loop): " + ", ".join(
                f"{fmt(x.end)} / {fmt(y.end)}" for x, y in zip(fl, base, strict=True)))
        table.notes.append(
            f"median of {reps} run(s) each, alternating. The last torchrun's exit: fleet, the "
            "latest mtime of exit_code (run.sh writes it right after torchrun exits); the loop, "
            "`date` right after torchrun in the same ssh command. The exit: when the fleet "
            "process (the last ssh client) was seen to exit (polled every 0.02 s)")
        table.notes.append("`first line after` / `last line after`: fleet's first and last "
                           "stderr lines after the last torchrun's exit (the report; the verdict)")
    return [table]
