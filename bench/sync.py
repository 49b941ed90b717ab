"""Sync: fleet's code sync of 1,000 small files to 4 hosts against rsync over ssh."""

from __future__ import annotations

import re
import shutil
import time
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
    testbed,
    wait_idle,
)
from tests.testbed import TbHost

HOSTS = 4
FILES = 1000  # main.py and 999 others, in 10 directories
CODE = re.compile(r"^fleet: (\S+)\s+code: sent (\d+) file\(s\), (\d+) bytes "
                  r"\((\d+) unchanged, ([\d.]+)s\)$")
RSYNC = "/usr/bin/rsync"
TIMEOUT = 120


def make_tree(root: Path) -> None:
    (root / "main.py").parent.mkdir(parents=True, exist_ok=True)
    (root / "main.py").write_text("print('hi')\n")
    for i in range(FILES - 1):
        d = root / f"pkg{i % 10}"
        d.mkdir(exist_ok=True)
        (d / f"mod{i}.py").write_text(f"# module {i}\nVALUE = {i}\n" + "x = 1\n" * (i % 20))


def sync_job(sc: Scratch) -> Path:
    """A job that syncs the tree and runs only `true` (no torch start-up in the way)."""
    make_tree(sc.dir / "tree")
    job = sc.dir / "sync.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "tree"\nlauncher = "command"\n'
                   f'command = ["true"]\nnproc_per_node = 1\n[rendezvous]\nport = {next_port()}\n')
    return job


def fleet_sync(sc: Scratch, job: Path) -> tuple[float, float, int]:
    """One `fleet up --detach`: (wall seconds of the sync phase from stderr arrival times,
    the slowest node's own figure, files sent in all)."""
    proc = sc.fleet("up", "--detach", str(job), "-i", str(sc.inventory(HOSTS, workdir="~/fleet")))
    code = proc.wait(TIMEOUT)
    run_id = run_id_of(proc)
    if run_id:
        kill_run(sc.tb, run_id)
    if code != 0:
        raise RuntimeError(f"fleet up --detach failed ({code}):\n{proc.err_text()}")
    idx = [i for i, x in enumerate(proc.err) if CODE.match(x.text)]
    if len(idx) != HOSTS or idx[0] == 0:
        raise RuntimeError(f"expected {HOSTS} `code: sent` lines:\n{proc.err_text()}")
    # From the end of planning (the last `node rank` line: the upload starts right after it,
    # beside the preflight's port checks) to the last node's `code: sent` line.
    planned = max(i for i, x in enumerate(proc.err[:idx[0]]) if "  node rank " in x.text)
    wall = proc.err[idx[-1]].t - proc.err[planned].t
    matches = [m for i in idx if (m := CODE.match(proc.err[i].text))]
    own = max(float(m.group(5)) for m in matches)
    sent = sum(int(m.group(2)) for m in matches)
    unchanged = {int(m.group(4)) + int(m.group(2)) for m in matches}
    if unchanged != {FILES}:
        raise RuntimeError(f"fleet saw {unchanged} files, not {FILES}:\n{proc.err_text()}")
    return wall, own, sent


def ssh_e(sc: Scratch, control: Path | None) -> str:
    tb = sc.tb
    cm = f" -o ControlPath={control}" if control else ""
    return (f"ssh -i {tb.key} -o UserKnownHostsFile={tb.known_hosts} "
            f"-o StrictHostKeyChecking=yes -o BatchMode=yes{cm}")


def rsync_all(sc: Scratch, controls: dict[str, Path] | None = None) -> float:
    """rsync -a of the tree to every host in parallel; seconds until the last one is done."""
    t0 = time.monotonic()
    procs = [Proc([RSYNC, "-a", "-e", ssh_e(sc, (controls or {}).get(h.name)),
                   f"{sc.dir / 'tree'}/", f"root@{h.addr}:rsync-tree/"])
             for h in sc.tb.hosts[:HOSTS]]
    codes = [p.wait(TIMEOUT) for p in procs]
    if any(c != 0 for c in codes):
        raise RuntimeError(f"rsync failed {codes}: " + procs[0].err_text()[-500:])
    return max(p.ended or 0.0 for p in procs) - t0


def open_masters(sc: Scratch) -> tuple[dict[str, Path], list[Proc]]:
    """An OpenSSH ControlMaster connection per host, like the connections fleet holds open."""
    controls = {h.name: sc.tb.dir / f"cm-{h.name}" for h in sc.tb.hosts[:HOSTS]}
    procs = [Proc(["ssh", "-M", "-N", "-i", str(sc.tb.key), "-o",
                   f"UserKnownHostsFile={sc.tb.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                   "-o", "BatchMode=yes", "-o", f"ControlPath={controls[h.name]}",
                   f"root@{h.addr}"]) for h in sc.tb.hosts[:HOSTS]]
    deadline = time.monotonic() + 15
    while not all(c.exists() for c in controls.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return controls, procs


def clear(hosts: list[TbHost]) -> None:
    """Forget what earlier syncs left on the hosts (fleet's code dir and rsync's copy)."""
    for h in hosts:
        shutil.rmtree(h.home / "fleet" / "code", ignore_errors=True)
        shutil.rmtree(h.home / "rsync-tree", ignore_errors=True)


def run(cfg: Config) -> list[Table]:
    reps = cfg.reps(5, 3)
    table = Table(f"sync: workdir of {FILES} small files to {HOSTS} hosts in parallel, seconds "
                  "(fleet: its sync phase inside `fleet up --detach`, connections already open)",
                  ["case", "fleet sync phase", "fleet: slowest node's own figure",
                   "rsync, new ssh connections", "rsync, open connections (ControlMaster)",
                   "fleet/rsync new", "fleet/rsync open", "files fleet sent"])
    with testbed(HOSTS, cfg) as tb:
        sc = Scratch(tb, "sync")
        job = sync_job(sc)
        clear(tb.hosts)
        controls, masters = open_masters(sc)
        try:
            wait_idle()
            first = fleet_sync(sc, job)
            rsync_first = rsync_all(sc)
            table.add("first sync (1 run)", fmt(first[0]), fmt(first[1]), fmt(rsync_first), "-",
                      ratio(first[0], rsync_first), "-", first[2])
            again: list[tuple[float, float, int]] = []
            cold: list[float] = []
            warm: list[float] = []
            for _ in range(reps):
                wait_idle()
                again.append(fleet_sync(sc, job))
                cold.append(rsync_all(sc))
                warm.append(rsync_all(sc, controls))
        finally:
            for p in masters:
                p.kill()
    f, c, w = median([a[0] for a in again]), median(cold), median(warm)
    table.add(f"unchanged re-sync (median of {reps})", fmt(f), fmt(median([a[1] for a in again])),
              fmt(c), fmt(w), ratio(f, c), ratio(f, w), max(a[2] for a in again))
    table.notes.append("fleet's phase: from the end of planning (the last `node rank` line) to "
                       "the last `code: sent` line: per node one listing (find: size and mtime), "
                       "then one verified bundle of the changed files with the run's scripts; "
                       "rsync: -a, to ~/rsync-tree on each host")
    if any(a[2] for a in again):
        table.problems.append(f"fleet re-sent files of an unchanged tree: {[a[2] for a in again]}")
    return [table]
