"""Restart: a node killed mid-run, to training again on a spare, against the ideal (a fresh
`fleet up` on the new host list, started the instant the loss is known)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    ROOT,
    Config,
    Line,
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
    snapshot,
    testbed,
    wait_idle,
)
from bench.run import interrupt, run_all
from tests.testbed import TbHost, Testbed, available

# Every rank prints `attempt A step N` after each all_reduce, every 0.2 s; the first attempt
# runs argv[1] steps (far more than it lives), a later one argv[2] steps and succeeds.
SCRIPT = '''import os, sys, time
import torch
import torch.distributed as dist

attempt = int(os.environ.get("FLEET_ATTEMPT", "1"))
steps = int(sys.argv[1] if attempt == 1 else sys.argv[2])
dist.init_process_group("gloo")
t = torch.ones(1)
for i in range(steps):
    dist.all_reduce(t)
    print(f"attempt {attempt} step {i}", flush=True)
    time.sleep(0.2)
dist.destroy_process_group()
'''
# The same job with a checkpoint: rank 0 alone saves one (1 MiB, the next step to run) every
# 10 steps (2 s) into ckpt/, keeps the newest four, and every rank resumes from the newest in
# its own node's ckpt/ (the hosts share no home): what fleet replicated is what it resumes from.
CKPT_SCRIPT = SCRIPT.replace('''t = torch.ones(1)
for i in range(steps):''', '''t = torch.ones(1)
from pathlib import Path
ckpt = Path("ckpt")
ckpt.mkdir(exist_ok=True)
saved = sorted(ckpt.glob("step=*.pt"), key=lambda p: int(p.stem[5:]))
begin = torch.load(saved[-1])["step"] if saved else 0
if begin:
    print(f"attempt {attempt} resumed at step {begin}", flush=True)
for i in range(begin, begin + steps):
    if dist.get_rank() == 0 and i and i % 10 == 0:
        torch.save({"step": i, "w": torch.zeros(1 << 18)}, ckpt / "next.tmp")
        (ckpt / "next.tmp").rename(ckpt / f"step={i}.pt")
        for old in sorted(ckpt.glob("step=*.pt"), key=lambda p: int(p.stem[5:]))[:-4]:
            old.unlink()''')
CKPT_AT = 10  # the checkpoint fleet must have copied before the master is killed
FIRST_STEPS = 300  # 60 s at most: the kill comes after KILL_AT steps
AFTER_STEPS = 3  # the attempt after the loss (and the ideal's fresh run) then succeeds
KILL_AT = 5  # steps of the first attempt printed before its node2 is killed
UNREACHABLE_AFTER = 4.0  # [watchdog] unreachable_after: its minimum
RESTART = (f"[restart]\nmax = 1\nbackoff = 0\n[watchdog]\nunreachable_after = "
           f"{UNREACHABLE_AFTER:g}\n")
START_TIMEOUT = 180  # seconds for a run to reach its KILL_AT-th step
HEAL_TIMEOUT = 120  # seconds from the kill to the next attempt's first line
POLL_S = 0.05  # how often the hosts are searched for a run's processes
IDLE_WAIT_S = 5.0  # the settling before each measurement, bounded: others share this machine
STEP = re.compile(r"\| attempt (\d+) step (\d+)$")
COPIED = re.compile(r"fleet: checkpoint step=(\d+)\.pt \(\S+ \S+\) from (\S+) to ")
RESUMED = re.compile(r"\| attempt 2 resumed at step (\d+)$")


def step_line(proc: Proc, attempt: int, step: int | None = None) -> Line | None:
    """fleet's first stdout line of the job's `attempt A step N` (any step where None)."""
    with proc.cond:
        for x in proc.out:
            m = STEP.search(x.text)
            if m and int(m.group(1)) == attempt and (step is None or int(m.group(2)) == step):
                return x
    return None


def err_at(proc: Proc, t: float, needle: str, last: bool = False) -> float | None:
    """The arrival time (monotonic) of fleet's first (or last) stderr line from t on that holds
    `needle`."""
    with proc.cond:
        hits = [x.t for x in proc.err if x.t >= t and needle in x.text]
    return (hits[-1] if last else hits[0]) if hits else None


def since(t: float | None, t0: float | None) -> float | None:
    return None if t is None or t0 is None else t - t0


@dataclass
class Launch:
    """One launch of the job by fleet (`fleet up`, or an attempt), seconds in each phase."""

    prepare: float | None = None  # to its last `node rank` line: connect, claim, probe, plan
    upload: float | None = None  # to its last `code:` or `preflight:` line (side by side)
    start: float | None = None  # to its last `started` line: every node's job launched
    startup: float | None = None  # to the job's first line: torch imported, Gloo rendezvous

    @classmethod
    def read(cls, proc: Proc, t0: float, first: float) -> Launch:
        """The phases of the launch whose `run RUN:` line came at t0, from fleet's stderr."""
        planned = err_at(proc, t0, "  node rank ", last=True)
        code = err_at(proc, t0, "  code: ", last=True)
        checked = err_at(proc, t0, "fleet: preflight: ")
        uploaded = None if code is None or checked is None else max(code, checked)
        started = err_at(proc, t0, "  started ", last=True)
        return cls(since(planned, t0), since(uploaded, planned), since(started, uploaded),
                   since(first, started))


@dataclass
class Healed:
    """fleet with [restart]: seconds from the kill to the first line of attempt 2, and in
    each step of the way."""

    total: float
    detect: float | None = None  # to fleet's line `... stopping the job on every other node`
    stop: float | None = None  # to `restart: attempt 2/2 in 0s`: stopped, reported, decided
    backoff: float | None = None  # to attempt 2's `run RUN-a2:` line
    launch: Launch = field(default_factory=Launch)
    spare_ran: bool = False  # attempt 2 has a run directory on the spare
    restore: float | None = None  # replicated: `restart: attempt 2/2` to the checkpoint line
    said: str = ""  # ... that line
    resumed: int | None = None  # ... the step attempt 2 resumed at (from the job's own line)


@dataclass
class Ideal:
    """The ideal: the loss known unreachable_after after the kill, then a fresh `fleet up`."""

    stop: float | None  # from the known instant to the old run's last process gone
    up: float  # the fresh `fleet up` from its start to the job's first line
    launch: Launch = field(default_factory=Launch)

    @property
    def total(self) -> float:
        return UNREACHABLE_AFTER + self.up


def hosts_for(tb: Testbed, k: int) -> tuple[TbHost, TbHost, TbHost]:
    """The k-th measurement's hosts: node1 (the master, always alive), the node killed, and the
    spare that takes its place. The spare of one measurement is the node killed in the next,
    so that 2 + number-of-measurements hosts serve them all, none of them brought back."""
    return tb.hosts[0], tb.hosts[k + 1], tb.hosts[k + 2]


def inventory(sc: Scratch, hosts: list[TbHost], spare: TbHost | None, k: int,
              what: str) -> Path:
    per_host: dict[str, dict[str, object]] = {spare.name: {"spare": True}} if spare else {}
    names = [h.name for h in hosts] + ([spare.name] if spare else [])
    return sc.tb.inventory(sc.dir / f"inv-{what}-{k}.toml", names, per_host=per_host,
                           workdir=f"~/fleet-restart-{what}-{k}")


def kill(tb: Testbed, h: TbHost, silent: bool) -> float:
    """The host goes down as in a power cut: every process, sshd too (tb.kill_host). Its
    address still refuses connections at once (the namespace's stack lives on); `silent`
    first takes its link off the bridge, so that nothing answers at all, not even the
    FIN or RST of its dying connections, as when a machine loses power or its cable. Returns
    the monotonic time just before it went."""
    t = time.monotonic()
    if silent:
        subprocess.run(["ip", "link", "set", h.veth, "down"], check=True, timeout=30)
    tb.kill_host(h.name)
    return t


def cleanup(tb: Testbed, run_ids: list[str], hosts: list[TbHost]) -> dict[str, list[int]]:
    """What any of the runs still had on these hosts (then killed by PID)."""
    found: dict[str, list[int]] = {}
    for run_id in run_ids:
        for name, pids in run_pids(tb, run_id, hosts).items():
            found.setdefault(name, []).extend(pids)
        kill_run(tb, run_id)
    return {k: v for k, v in found.items() if v}


def copied(proc: Proc, source: str) -> int:
    """The newest checkpoint step fleet said it copied from `source` (-1: none yet)."""
    return max((int(m.group(1)) for m in COPIED.finditer(proc.err_text())
                if m.group(2) == source), default=-1)


def fleet_once(sc: Scratch, k: int, silent: bool, replicated: bool = False) -> Healed:
    """With `replicated`, the job checkpoints and fleet replicates it ([restart] checkpoints),
    and the node killed is the master, once fleet copied its checkpoint of CKPT_AT or later."""
    tb = sc.tb
    node1, victim, spare = hosts_for(tb, k)
    job = sc.job(f"heal{k}", CKPT_SCRIPT if replicated else SCRIPT, next_port(),
                 args=[str(FIRST_STEPS), str(AFTER_STEPS)],
                 extra=RESTART.replace("backoff = 0\n", 'backoff = 0\ncheckpoints = "ckpt/"\n')
                 if replicated else RESTART)
    order = [victim, node1] if replicated else [node1, victim]
    proc = sc.fleet("up", str(job), "-i", str(inventory(sc, order, spare, k, "fleet")))
    run_id = ""
    try:
        if not proc.until(lambda p: step_line(p, 1, KILL_AT) is not None and (
                not replicated or copied(p, victim.name) >= CKPT_AT), START_TIMEOUT):
            raise RuntimeError(f"fleet never printed step {KILL_AT}:\n{proc.err_text()[-3000:]}")
        run_id = run_id_of(proc) or ""
        t_kill = kill(tb, victim, silent)
        proc.until(lambda p: step_line(p, 2) is not None or p.poll() is not None, HEAL_TIMEOUT)
        first = step_line(proc, 2)
        code = proc.wait(60)
        if first is None or code != 0:
            raise RuntimeError(f"fleet up did not heal (exit {code}):\n"
                               f"{proc.err_text()[-3000:]}")
        known = err_at(proc, t_kill, "stopping the job on every other node")
        decided = err_at(proc, t_kill, "restart: attempt 2/")
        again = err_at(proc, t_kill, f"run {run_id}-a2:")
        healed = Healed(first.t - t_kill, since(known, t_kill), since(decided, known),
                        since(again, decided),
                        Launch.read(proc, again, first.t) if again is not None else Launch(),
                        run_dir(spare, f"{run_id}-a2").is_dir())
        if replicated and decided is not None:
            with proc.cond:
                line = next((x for x in proc.err if x.t >= decided and
                             x.text.startswith("fleet: checkpoint")), None)
                resumed = [int(m.group(1)) for x in proc.out if (m := RESUMED.search(x.text))]
            healed.restore = since(line.t if line else None, decided)
            healed.said = line.text if line else ""
            healed.resumed = min(resumed) if resumed else None
        return healed
    finally:
        proc.kill()
        if run_id:
            found = cleanup(tb, [run_id, f"{run_id}-a2"], [node1, spare])
            if found:
                raise RuntimeError(f"fleet left processes of the run behind: {found}")


def ideal_once(sc: Scratch, k: int, silent: bool, replicated: bool = False) -> Ideal:
    """The same job detached (nothing watches it), node2 killed at the same step; at the kill
    + unreachable_after one SIGTERM to every process of the run left (common.ideal_stop) until
    none is left, then a fresh `fleet up` of the job on node1 and the spare, timed from its
    start to the job's first line."""
    tb = sc.tb
    node1, victim, spare = hosts_for(tb, k)
    script = CKPT_SCRIPT if replicated else SCRIPT
    job = sc.job(f"ideal{k}", script, next_port(), args=[str(FIRST_STEPS), str(AFTER_STEPS)])
    up = sc.fleet("up", "--detach", str(job), "-i",
                  str(inventory(sc, [node1, victim], None, k, "old")))
    code = up.wait(START_TIMEOUT)
    run_id = run_id_of(up)
    if code != 0 or run_id is None:
        raise RuntimeError(f"fleet up --detach failed ({code}):\n{up.err_text()[-3000:]}")
    fresh: Proc | None = None
    stoppers: list[Proc] = []
    try:
        log = run_dir(node1, run_id) / "node.log"
        deadline = time.monotonic() + START_TIMEOUT
        while f"attempt 1 step {KILL_AT}" not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the detached run never printed step {KILL_AT}")
            time.sleep(0.02)
        t_kill = kill(tb, victim, silent)
        time.sleep(max(0.0, t_kill + UNREACHABLE_AFTER - time.monotonic()))
        t_known = time.monotonic()
        stoppers = ideal_stop(tb, run_id, [node1])
        gone: float | None = None
        while time.monotonic() < t_known + 30:
            if not run_pids(tb, run_id, [node1])[node1.name]:
                gone = time.monotonic() - t_known
                break
            time.sleep(POLL_S)
        new = sc.job(f"fresh{k}", script, next_port(), args=[str(AFTER_STEPS)] * 2)
        fresh = sc.fleet("up", str(new), "-i",
                         str(inventory(sc, [node1, spare], None, k, "fresh")))
        fresh.until(lambda p: step_line(p, 1) is not None or p.poll() is not None, HEAL_TIMEOUT)
        first = step_line(fresh, 1)
        code = fresh.wait(60)
        if first is None or code != 0:
            raise RuntimeError(f"the fresh fleet up failed (exit {code}):\n"
                               f"{fresh.err_text()[-3000:]}")
        return Ideal(gone, first.t - fresh.t0, Launch.read(fresh, fresh.t0, first.t))
    finally:
        for p in [*stoppers, *([fresh] if fresh else [])]:
            p.kill()
        ids = [run_id] + ([i] if fresh and (i := run_id_of(fresh)) else [])
        found = cleanup(tb, ids, [node1, spare])
        if found:
            raise RuntimeError(f"the ideal left processes of the run behind: {found}")


def load() -> str:
    """This machine's 1-minute load average: others' work shares its 2 cores."""
    return Path("/proc/loadavg").read_text().split()[0]


# (the loss, silent, replicated): the third kills the master of a job that checkpoints on
# rank 0 alone, on hosts that share no home, with [restart] checkpoints.
LOSSES = (("killed (refuses at once)", False, False),
          ("cut off, then killed (silent)", True, False),
          ("killed without shared storage (master, replicated)", False, True))


def run(cfg: Config) -> list[Table]:
    reps = cfg.reps(3, 1)
    before, t0 = load(), time.monotonic()
    results: list[tuple[str, list[Healed], list[Ideal]]] = []
    with testbed(2 + 2 * reps * len(LOSSES), cfg) as tb:
        sc = Scratch(tb, "restart")
        k = 0
        for loss, silent, replicated in LOSSES:
            fl: list[Healed] = []
            base: list[Ideal] = []
            for _ in range(reps):
                wait_idle(IDLE_WAIT_S)
                fl.append(fleet_once(sc, k, silent, replicated))
                wait_idle(IDLE_WAIT_S)
                base.append(ideal_once(sc, k + 1, silent, replicated))
                k += 2
            results.append((loss, fl, base))
    return [table(results, reps, before, load(), time.monotonic() - t0)]


def med(xs: list[float | None]) -> float | None:
    return median([x for x in xs if x is not None]) if all(x is not None for x in xs) else None


def table(results: list[tuple[str, list[Healed], list[Ideal]]], reps: int, before: str,
          after: str, took: float) -> Table:
    t = Table("restart: node2 of 2 goes down mid-run, a spare takes its place; seconds from "
              "the loss to the job's first line of the next attempt on fleet's stdout",
              ["node2", "fleet [restart]", "ideal", "fleet/ideal", "target (<= 1.2x)",
               "fleet: detect", "stop", "backoff", "prepare", "upload", "start",
               "job start-up", "ideal: known", "up: prepare", "upload", "start",
               "job start-up", "ideal: stop (not counted)"])
    for loss, fl, base in results:
        f = median([x.total for x in fl])
        b = median([x.total for x in base])
        ok = f is not None and b is not None and f <= 1.2 * b
        t.add(loss, fmt(f), fmt(b), ratio(f, b), "met" if ok else "MISSED",
              *(fmt(med([getattr(x, a) for x in fl])) for a in ("detect", "stop", "backoff")),
              *(fmt(med([getattr(x.launch, a) for x in fl]))
                for a in ("prepare", "upload", "start", "startup")),
              fmt(UNREACHABLE_AFTER),
              *(fmt(med([getattr(x.launch, a) for x in base]))
                for a in ("prepare", "upload", "start", "startup")),
              fmt(med([x.stop for x in base])))
        t.notes.append(f"{loss}, each run (fleet / ideal): " + ", ".join(
            f"{fmt(x.total)} / {fmt(y.total)}" for x, y in zip(fl, base, strict=True)))
        if not all(x.spare_ran for x in fl):
            t.problems.append(f"{loss}: attempt 2 did not run on the spare every time")
        for x in (x for x in fl if x.said or x.resumed is not None):
            t.notes.append(f"{loss}: {x.said.removeprefix('fleet: ')} ({fmt(x.restore)} after "
                           f"the restart was decided); attempt 2 resumed at step {x.resumed}")
            if x.resumed is None or x.resumed < CKPT_AT:
                t.problems.append(f"{loss}: attempt 2 did not resume from the checkpoint "
                                  f"replicated before the loss (step {CKPT_AT} or later)")
    t.notes.append(
        f"median of {reps} run(s) each, alternating; the phases are medians each (they need not "
        "add up to the median total). The job: torchrun of 1 Gloo rank on each of 2 nodes, "
        f"printing `attempt A step N` after an all_reduce every 0.2 s; node2 goes down after "
        f"step {KILL_AT}. fleet: [restart] max = 1, backoff = 0; [watchdog] unreachable_after = "
        f"{UNREACHABLE_AFTER:g} (its minimum); a third host with `spare = true`")
    t.notes.append(
        "killed: tb.kill_host (every process of the host, sshd too; its address still refuses "
        "connections). silent: its link taken off the bridge first, then killed: nothing "
        "answers at all, not even the dying connections' FIN or RST")
    t.notes.append(
        "ideal: the same job detached (nothing watches it), node2 down at the same step; known "
        f"= the loss + unreachable_after ({UNREACHABLE_AFTER:g} s: what a detector bounded by "
        "that setting needs); then one SIGTERM to every process of the run left (`ideal: "
        "stop`, until none was left) and a fresh `fleet up` (no [restart]) on node1 and the "
        "spare, from its start to the job's first line: ideal = known + that")
    t.notes.append(
        "fleet's phases from its stderr lines, timestamped as they arrive: `detect` to \"... "
        "stopping the job on every other node\", `stop` to \"restart: attempt 2/2 in 0s\" "
        "(every node stopped, the attempt reported), `backoff` to attempt 2's `run RUN-a2:` "
        "line; then, for attempt 2 and the ideal's `fleet up` alike, `prepare` to the last "
        "`node rank` line (connect, claim, probe, plan), `upload` to the later of the last "
        "`code:` and the `preflight:` line, `start` to the last `started` line, `job "
        "start-up` to the job's first line (torch imported, Gloo rendezvous: the job's own)")
    t.notes.append(f"this machine's load average (1 min) at the start and the end of the "
                   f"benchmark: {before} and {after} (2 cores); it took {took:.0f} s")
    return t


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.restart [--quick] [--out FILE]`: this benchmark alone, through
    bench.run's runner (its list of benchmarks does not name it)."""
    ap = argparse.ArgumentParser(prog="python -m bench.restart", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one run of each instead of three")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) to this file")
    args = ap.parse_args(argv)
    why = available()
    if why is not None:
        print(f"bench: the testbed cannot run here: {why}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(ROOT)
    snap = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    try:
        return run_all(Config(quick=args.quick), ["restart"], args.out, snapshot(snap))
    finally:
        shutil.rmtree(snap, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
