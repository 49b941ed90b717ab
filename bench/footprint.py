"""Footprint: peak RSS and CPU seconds of `fleet up` streaming a job, against an ssh loop."""

from __future__ import annotations

import re
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
    run_dir,
    run_id_of,
    ssh_argv,
    testbed,
    torchrun_line,
    wait_idle,
)

TICKS = 100  # lines per rank, one every 0.1 s: about 10 s
TICK_SCRIPT = f'''import os, time
for i in range({TICKS}):
    print(f"tick {{i}} of rank {{os.environ['RANK']}}", flush=True)
    time.sleep(0.1)
'''
TICK = re.compile(r"tick (\d+) of rank (\d+)$")
TIMEOUT = 300


@dataclass
class Usage:
    peak_kib: int  # peak RSS: VmHWM as last polled, or the kernel's ru_maxrss if higher
    cpu_s: float  # user + system
    lines: int  # tick lines received
    missing: str = ""  # for fleet, when lines are missing: which, and what node.log holds


def vm_hwm(pid: int) -> int:
    """VmHWM (peak resident set) of a live process in KiB, 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else 0


def watch(procs: list[Proc], timeout: float) -> dict[int, int]:
    """Poll VmHWM of every process every 0.2 s until all have exited; the last reading each."""
    hwm: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        for p in procs:
            hwm[p.p.pid] = max(hwm.get(p.p.pid, 0), vm_hwm(p.p.pid))
        time.sleep(0.2)
    for p in procs:
        p.wait(5)
    return hwm


def ticks(procs: list[Proc]) -> int:
    return sum(1 for p in procs for x in p.out if TICK.search(x.text))


def missing_lines(sc: Scratch, proc: Proc, n: int) -> str:
    """Which tick lines fleet did not print, and the node.log lines that hold them, if any."""
    seen = {(int(m.group(2)), int(m.group(1))) for x in proc.out if (m := TICK.search(x.text))}
    gaps = [(r, i) for r in range(n) for i in range(TICKS) if (r, i) not in seen][:5]
    run_id = run_id_of(proc) or ""
    notes = []
    for r, i in gaps:
        log = run_dir(sc.tb.hosts[r], run_id) / "node.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        held = [line for line in text.splitlines() if f"tick {i} of rank {r}" in line]
        notes.append(f"rank {r} tick {i}: node.log has {held!r}")
    odd = [x.text for x in proc.out if "tick" in x.text and not TICK.search(x.text)][:3]
    return "; ".join(notes) + (f"; malformed lines on stdout: {odd!r}" if odd else "")


def fleet_usage(sc: Scratch, n: int) -> Usage:
    job = sc.job("ticks", TICK_SCRIPT, next_port())
    proc = sc.fleet("up", str(job), "-i", str(sc.inventory(n)))
    try:
        hwm = watch([proc], TIMEOUT)
        if proc.p.returncode != 0:
            raise RuntimeError(f"fleet up failed ({proc.p.returncode}):\n{proc.err_text()}")
        lines = ticks([proc])
        return Usage(max(hwm.get(proc.p.pid, 0), proc.maxrss_kib), proc.cpu_s, lines,
                     missing_lines(sc, proc, n) if lines != n * TICKS else "")
    finally:
        proc.kill()


def ssh_usage(sc: Scratch, n: int) -> Usage:
    """The same torchrun lines over one OpenSSH client per host: their sums."""
    tb, port, tag = sc.tb, next_port(), new_tag()
    for h in tb.hosts[:n]:
        (h.home / "ticks.py").write_text(TICK_SCRIPT)
    procs = [Proc(ssh_argv(tb, h, torchrun_line(tb, i, n, port, "ticks.py", tag=tag)))
             for i, h in enumerate(tb.hosts[:n])]
    try:
        hwm = watch(procs, TIMEOUT)
        if any(p.p.returncode != 0 for p in procs):
            raise RuntimeError("ssh loop failed: " + procs[0].err_text()[-500:])
        return Usage(sum(max(hwm.get(p.p.pid, 0), p.maxrss_kib) for p in procs),
                     sum(p.cpu_s for p in procs), ticks(procs))
    finally:
        for p in procs:
            p.kill()
        kill_run(tb, tag)


def run(cfg: Config) -> list[Table]:
    counts, reps = cfg.pick((1, 16), (8,)), cfg.reps(2, 1)
    table = Table(f"footprint: the local side while {TICKS} lines per rank stream in (one every "
                  "0.1 s, nproc 1 per host)",
                  ["hosts", "fleet up peak RSS", "ssh loop RSS (sum)", "fleet/ssh (RSS)",
                   "fleet up CPU", "ssh loop CPU (sum)", "fleet/ssh (CPU)", "lines"])
    with testbed(max(counts), cfg) as tb:
        sc = Scratch(tb, "footprint")
        for n in counts:
            fl: list[Usage] = []
            base: list[Usage] = []
            for _ in range(reps):
                wait_idle()
                fl.append(fleet_usage(sc, n))
                wait_idle()
                base.append(ssh_usage(sc, n))
            fr, br = median([u.peak_kib / 1024 for u in fl]), median([u.peak_kib / 1024
                                                                       for u in base])
            fc, bc = median([u.cpu_s for u in fl]), median([u.cpu_s for u in base])
            lines = {u.lines for u in fl + base}
            table.add(n, fmt(fr, " MiB", 0), fmt(br, " MiB", 0), ratio(fr, br), fmt(fc),
                      fmt(bc), ratio(fc, bc), "/".join(str(x) for x in sorted(lines)))
            if any(u.lines != n * TICKS for u in fl):
                table.problems.append(f"fleet delivered {[u.lines for u in fl]} of {n * TICKS} "
                                      f"lines at {n} hosts: "
                                      + " / ".join(u.missing for u in fl if u.missing))
    table.notes.append(f"median of {reps} run(s); RSS: VmHWM polled every 0.2 s and the "
                       "kernel's ru_maxrss; CPU: ru_utime + ru_stime from wait4. The ssh sum "
                       "counts shared pages once per client")
    return [table]
