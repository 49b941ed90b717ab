"""Fan-out: command to every rank's first line (fleet up vs ssh loop), and fleet's control plane."""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import budget
from bench.common import (
    PY,
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
    snapshot,
    ssh_argv,
    testbed,
    torchrun_line,
    wait_idle,
)
from tests.testbed import Testbed

HELLO_SCRIPT = 'import os\nprint(f"hello {os.environ[\'RANK\']}", flush=True)\n'
SLEEP_SCRIPT = "import time\ntime.sleep(600)\n"
HELLO = re.compile(r"hello (\d+)$")
RUN_TIMEOUT = 180  # seconds any one launch may take before it counts as broken


def first_lines(proc: Proc) -> dict[int, float]:
    """Arrival time (since the command) of each rank's first `hello` line on stdout."""
    seen: dict[int, float] = {}
    for line in proc.out:
        m = HELLO.search(line.text)
        if m and int(m.group(1)) not in seen:
            seen[int(m.group(1))] = line.t - proc.t0
    return seen


# Where BENCH_FANOUT_BEFORE names another fleet tree (a checkout of an earlier commit), fanout
# runs its `fleet up` too, interleaved with this one's and the loop's: before and after, side by
# side under the same load.
BEFORE_VAR = "BENCH_FANOUT_BEFORE"


@dataclass
class Hello:
    first: float  # seconds from the command to every rank's first line
    whole: float  # seconds from the command to its exit (every rank done)
    budget: budget.Budget | None = None  # fleet's round trips per phase (FLEET_TRACE)


def fleet_hello(sc: Scratch, n: int, src: Path | None = None) -> Hello:
    """fleet up of the hello job on n hosts: seconds until every rank's first line, and until
    its exit; where it came from is traced (FLEET_TRACE) for the round-trip budget."""
    job = sc.job("hello", HELLO_SCRIPT, next_port())
    trace = sc.dir / f"trace-{next_port()}.jsonl"
    proc = sc.fleet("up", str(job), "-i", str(sc.inventory(n)), src=src,
                    FLEET_TRACE=str(trace))
    ok = proc.until(lambda p: len(first_lines(p)) >= n, RUN_TIMEOUT)
    code = proc.wait(RUN_TIMEOUT)
    if not ok or code != 0 or proc.ended is None:
        raise RuntimeError(f"fleet up on {n} host(s) failed ({code}):\n{proc.err_text()}")
    return Hello(max(first_lines(proc).values()), proc.ended - proc.t0, budget.read(trace))


def ssh_hello(sc: Scratch, n: int) -> Hello:
    """The same torchrun lines started by a parallel ssh loop: seconds to every first line, and
    to the last ssh's exit."""
    tb, port, tag = sc.tb, next_port(), new_tag()
    for h in tb.hosts[:n]:
        (h.home / "hello.py").write_text(HELLO_SCRIPT)
    t0 = time.monotonic()
    procs = [Proc(ssh_argv(tb, h, torchrun_line(tb, i, n, port, "hello.py", tag=tag)))
             for i, h in enumerate(tb.hosts[:n])]
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        firsts: dict[int, float] = {}
        for p in procs:
            p.until(lambda q: bool(first_lines(q)), max(0.0, deadline - time.monotonic()))
            firsts.update({r: t + p.t0 - t0 for r, t in first_lines(p).items()})
        codes = [p.wait(max(1.0, deadline - time.monotonic())) for p in procs]
        if len(firsts) < n or any(c != 0 for c in codes):
            raise RuntimeError(f"ssh loop on {n} host(s) failed ({codes}): "
                               + " / ".join(p.err_text()[-300:] for p in procs))
        return Hello(max(firsts.values()), max((p.ended or time.monotonic()) for p in procs) - t0)
    finally:
        for p in procs:
            p.kill()
        kill_run(tb, tag)


def fanout_table(tb: Testbed, cfg: Config) -> list[Table]:
    sc = Scratch(tb, "fanout")
    counts, reps = cfg.pick((1, 2, 4, 8), (4, 8)), cfg.reps(3, 3)
    before_root = os.environ.get(BEFORE_VAR)
    before: Path | None = None
    if before_root:
        before = Path(tempfile.mkdtemp(prefix="fleet-before-", dir=sc.dir))
        where = snapshot(before, Path(before_root), use=False)
    cols = ["hosts", "fleet: first line", "ssh: first line", "ratio",
            "fleet: whole up", "ssh: whole", "fleet/ssh (whole)", "target (whole)"]
    if before:
        cols += ["before: whole up", "before/ssh (whole)"]
    table = Table("fanout: hello under torchrun, command to every rank's first output line and "
                  "to the exit (the whole `fleet up`)", cols)
    spent = Table("fanout: fleet up's round trips per host and phase (FLEET_TRACE), medians",
                  ["hosts", "fleet", "phase", "round trips per host", "budget", "seconds"])
    for n in counts:
        runs: dict[str, list[Hello]] = {"fleet": [], "ssh": [], "before": []}
        for _ in range(reps):  # interleaved, so drift hits all alike
            wait_idle()
            runs["fleet"].append(fleet_hello(sc, n))
            if before:
                wait_idle()
                runs["before"].append(fleet_hello(sc, n, before))
            wait_idle()
            runs["ssh"].append(ssh_hello(sc, n))

        def med(who: str, attr: str, rs: dict[str, list[Hello]] = runs) -> float | None:
            return median([getattr(h, attr) for h in rs[who]])

        whole, base = med("fleet", "whole"), med("ssh", "whole")
        ok = whole is not None and base is not None and whole <= 1.15 * base
        row = [n, fmt(med("fleet", "first")), fmt(med("ssh", "first")),
               ratio(med("fleet", "first"), med("ssh", "first")), fmt(whole), fmt(base),
               ratio(whole, base), "<= 1.15x " + ("met" if ok else "MISSED")]
        if before:
            row += [fmt(med("before", "whole")), ratio(med("before", "whole"), base)]
        table.add(*row)
        table.notes.append(f"{n} hosts, each run's whole up (fleet / ssh"
                           + (" / before" if before else "") + "): " + ", ".join(
                               " / ".join(fmt(runs[w][i].whole) for w in ("fleet", "ssh", "before")
                                          if runs[w]) for i in range(reps)))
        for who in ("fleet", "before"):
            got = [h.budget for h in runs[who] if h.budget is not None and h.budget.trips]
            for name, trips, secs in budget.merged(got) if got else []:
                if not trips:  # a fleet from before FLEET_TRACE records nothing of it
                    continue
                over = "" if trips <= budget.BUDGET[name] else " (over)"
                spent.add(n, "this" if who == "fleet" else "before", name, f"{trips:g}",
                          f"{budget.BUDGET[name]}{over}", fmt(secs))
    table.notes.append(f"median of {reps} runs each, interleaved; nproc 1, static rendezvous, "
                       "the worker only prints (no torch import in it, but torchrun imports "
                       "torch); `whole`: to fleet's exit, and to the last ssh's exit")
    if before:
        table.notes.append(f"before: fleet from {before_root} ({where})")
    spent.notes.append("a round trip: a connection, or one session channel (a command, a "
                       "stream, an SFTP file); its phase by what it ran (bench/budget.py); "
                       "seconds: from the phase's first round trip to its last one's end, over "
                       "every host (on fleet's clock); the claim's stream counts by its start. "
                       "Upload and port checks run side by side. budget: the round trips per "
                       "host the target allows each phase (one handshake, then one per phase)")
    return [table, spent]


# ---- fleet's control plane ------------------------------------------------------------------
@dataclass
class Phases:
    """Seconds since the command at which the last node reached each phase (stderr lines), and
    where the CPU went meanwhile."""

    connected: float
    planned: float
    preflight: float | None  # fleet's preflight line, where this version of fleet has one
    synced: float
    master_started: float
    all_started: float
    detach_exit: float
    fleet_cpu: float  # fleet's own CPU seconds (user + system), from wait4
    machine_cpu: float  # CPU seconds the whole machine used meanwhile (/proc/stat)

    @property
    def own(self) -> float:
        """Everything fleet did, to its exit: nothing of the job is waited for."""
        return self.detach_exit


def _last(proc: Proc, pattern: str) -> float:
    found = _maybe_last(proc, pattern)
    if found is None:
        raise RuntimeError(f"no stderr line matching {pattern!r}:\n{proc.err_text()}")
    return found


def _maybe_last(proc: Proc, pattern: str) -> float | None:
    rx = re.compile(pattern)
    return max((x.t - proc.t0 for x in proc.err if rx.search(x.text)), default=None)


def machine_cpu_s() -> float:
    """CPU seconds used by everything on this machine since boot (/proc/stat, not idle)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def control_plane_once(sc: Scratch, n: int) -> Phases:
    """`fleet up --detach` of a `command` job that sleeps: every step fleet takes (connect,
    probe, plan, preflight, sync, start), and nothing of the job to wait for (no torchrun)."""
    job = sc.dir / "control.toml"
    (sc.dir / "control").mkdir(exist_ok=True)
    (sc.dir / "control" / "main.py").write_text(SLEEP_SCRIPT)
    job.write_text('inventory = "inv.toml"\nworkdir = "control"\nlauncher = "command"\n'
                   'command = ["sleep", "600"]\nnproc_per_node = 1\n'
                   f"[rendezvous]\nport = {next_port()}\n")
    cpu0 = machine_cpu_s()
    proc = sc.fleet("up", "--detach", str(job), "-i", str(sc.inventory(n)))
    code = proc.wait(RUN_TIMEOUT)
    machine = machine_cpu_s() - cpu0
    detach_exit = (proc.ended or time.monotonic()) - proc.t0 if code is not None else -1.0
    run_id = run_id_of(proc)
    try:
        if code != 0 or run_id is None:
            raise RuntimeError(f"fleet up --detach on {n} host(s) failed ({code}):\n"
                               f"{proc.err_text()}")
        ph = Phases(connected=_last(proc, r"  connected \("), planned=_last(proc, r"  node rank "),
                    preflight=_maybe_last(proc, r"^fleet: preflight"),
                    synced=_last(proc, r"  code: sent "),
                    master_started=_last(proc, r"  started master "),
                    all_started=_last(proc, r"  started (master )?\(pid"),
                    detach_exit=detach_exit, fleet_cpu=proc.cpu_s, machine_cpu=machine)
    finally:
        if run_id is not None:
            # Cleanup, not measured (the stop benchmark measures `fleet stop`): by PID at once.
            kill_run(sc.tb, run_id)
    return ph


def fixed_costs(sc: Scratch) -> tuple[float | None, float | None]:
    """What any launch pays before its first remote command, fleet and ssh alike."""
    imports, ssh_true = [], []
    for _ in range(5):
        # what `fleet up` loads before it connects (the commands import theirs as they run)
        p = Proc([PY, "-c", "import fleet.cli.commands, fleet.backends, fleet.lifecycle.runner"],
                 env=sc.env(), cwd=sc.dir)
        if p.wait(60) == 0 and p.ended is not None:
            imports.append(p.ended - p.t0)
        q = Proc(ssh_argv(sc.tb, sc.tb.hosts[0], "true"))
        if q.wait(60) == 0 and q.ended is not None:
            ssh_true.append(q.ended - q.t0)
    return median(imports), median(ssh_true)


def control_plane_table(tb: Testbed, cfg: Config) -> Table:
    sc = Scratch(tb, "control")
    counts, reps = cfg.pick((1, 4, 8, 16), (1, 4, 8)), cfg.reps(3, 1)
    table = Table("control plane: `fleet up --detach` of a job that only sleeps (launcher "
                  "`command`, no torchrun), medians in seconds since the command (last node to "
                  "reach each phase)",
                  ["hosts", "connected", "probed+planned", "preflight", "synced+rendered",
                   "master started", "all started", "own (--detach exit)",
                   "own / own(1 host)", "fleet CPU", "machine CPU", "machine busy"])
    own1: float | None = None
    results: dict[int, float | None] = {}
    for n in counts:
        runs: list[Phases] = []
        for _ in range(reps):
            wait_idle()
            runs.append(control_plane_once(sc, n))

        def med(attr: str, rs: list[Phases] = runs) -> float | None:
            return median([getattr(r, attr) for r in rs])

        own = med("own")
        own1 = own if n == 1 else own1
        results[n] = own
        pre = [r.preflight for r in runs if r.preflight is not None]
        busy = median([r.machine_cpu / r.detach_exit for r in runs])
        table.add(n, fmt(med("connected")), fmt(med("planned")),
                  fmt(median(pre) if len(pre) == len(runs) else None), fmt(med("synced")),
                  fmt(med("master_started")), fmt(med("all_started")), fmt(own),
                  ratio(own, own1), fmt(med("fleet_cpu")), fmt(med("machine_cpu")),
                  f"{busy:.2f} cores" if busy is not None else "-")
    top = max(counts)
    top_own = results[top]
    if top_own is not None and own1 is not None:
        verdict = "met" if top_own <= 1.3 * own1 else "MISSED"
        table.notes.append(f"target: {top} hosts within 1.3x of 1 host (fleet's own time): "
                           f"{verdict} ({fmt(top_own)}, {ratio(top_own, own1)})")
    imports, ssh_true = fixed_costs(sc)
    table.notes.append(f"fixed costs, medians of 5: starting python and importing fleet's CLI "
                       f"(paramiko, typer, jinja2) {fmt(imports)}; one OpenSSH `ssh HOST true` "
                       f"(start, connect, authenticate, run) {fmt(ssh_true)}")
    table.notes.append(f"median of {reps} run(s); `fleet CPU`: the fleet process's user+system "
                       "seconds (wait4); `machine CPU`: what the whole machine used from the "
                       "command to its exit (/proc/stat), i.e. fleet plus every host's sshd, "
                       "shells and the probes' pythons; `machine busy` = machine CPU / wall "
                       f"time, out of {os.cpu_count()} cores")
    return table


def run(cfg: Config) -> list[Table]:
    n = 8 if cfg.quick else 16
    with testbed(n, cfg) as tb:
        return [*fanout_table(tb, cfg), control_plane_table(tb, cfg)]
