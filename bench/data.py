"""Data: `fleet up` of a job's data directory (100 MB to 4 GB, 1 to 8 hosts): unshaped against
rsync over ssh, and behind a 100 Mbit uplink against the uplink's ideal; fleet's peak RSS."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    PY,
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
    ssh_argv,
    testbed,
    wait_idle,
)
from bench.sync import RSYNC, ssh_e
from tests.testbed import TbHost, Testbed

MB = 10**6  # sizes, rates and RSS here are decimal, as the targets are written
SIZES = {"100 MB": 100 * MB, "1 GB": 1000 * MB, "4 GB": 4000 * MB}
FILES = 4  # a data set is FILES random files of equal size
CHUNK = 1 << 20
UPLINK = "100mbit"
UPLINK_BITS = 100e6
IDEAL_TARGET = 1.3  # (a): first transfer behind the uplink, 4 and 8 hosts, against the ideal
RSYNC_TARGET = 1.2  # (b) first transfer, (c) touched re-up: 1 host, unshaped, against rsync
RSS_TARGET = 200 * MB  # (d): fleet's peak RSS at 4 GB
# fleet is stopped above this RSS (20x the target: missed either way), so that a launch that
# holds the data in memory cannot push this machine (and every host on it) out of memory.
RSS_GUARD = 4000 * MB
POLL = 0.2  # seconds between looks at fleet's RSS
# A launch is stopped at this many times its baseline (plus a minute for fixed costs): far
# past any target, it is a miss whatever the exact figure would have been.
STOP_AT_BASELINE = 5.0
STOP_AT_IDEAL = 3.0
DATA_LINE = re.compile(r"^fleet: (\S+)\s+data: (.*)$")
# `sent 4 file(s), 953.7 MiB`: fleet says sizes in binary units (1 decimal at most)
SENT = re.compile(r"sent (\d+) file\(s\), ([0-9.]+) (bytes|KiB|MiB|GiB|TiB)")
UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
PLANNED = "  node rank "


@dataclass(frozen=True)
class Case:
    """One row or two: `size` to the first `hosts` hosts, `reps` times; with `touched`, also a
    second up after `touch` of every file; `rsync`: how many of the reps run the rsync
    baseline too (parallel rsync to every host)."""

    size: str
    hosts: int
    reps: int
    touched: bool = False
    rsync: int = -1  # -1: every rep
    # also a first up with fleet's own connection only (FLEET_OPENSSH=0): the stream as it
    # went before the `ssh` binary carried it, side by side in the same run
    paramiko: bool = False

    @property
    def rsync_reps(self) -> int:
        return self.reps if self.rsync < 0 else self.rsync


def matrix(cfg: Config) -> tuple[list[Case], list[Case]]:
    """The cases (unshaped, behind the uplink). Full: about 15 min once fleet streams at
    rsync's speed; quick: about 4 min. Behind the uplink rsync runs once per case (it sends
    the data once per host: 67 s for 100 MB to 8 hosts) and not at all for 1 GB (11 min)."""
    if cfg.quick:
        return ([Case("100 MB", 1, 1, touched=True),
                 Case("1 GB", 1, 1, touched=True, paramiko=True), Case("4 GB", 1, 1)],
                [Case("100 MB", 4, 1)])
    return ([Case("100 MB", 1, 3, touched=True), Case("1 GB", 1, 3, touched=True, paramiko=True),
             Case("4 GB", 1, 1, touched=True),
             Case("1 GB", 2, 1), Case("1 GB", 4, 1), Case("1 GB", 8, 1)],
            [*(Case("100 MB", n, 3, rsync=1) for n in (1, 2, 4, 8)),
             Case("1 GB", 4, 1, rsync=0), Case("1 GB", 8, 1, rsync=0)])


# ---- the data sets ---------------------------------------------------------------------------
@dataclass
class DataSet:
    dir: Path
    size: int

    @property
    def files(self) -> list[Path]:
        return [self.dir / f"part{i}.bin" for i in range(FILES)]

    def touch(self) -> None:
        """A new mtime on every file (at least 2 s later: fleet compares whole seconds), the
        content as it was."""
        for f in self.files:
            t = max(time.time(), f.stat().st_mtime + 2)
            os.utime(f, (t, t))


def make_dataset(root: Path, label: str, size: int) -> DataSet:
    """FILES files of random bytes totalling `size`, written 1 MiB at a time."""
    ds = DataSet(root / f"data-{label.replace(' ', '')}", size)
    ds.dir.mkdir()
    each = size // FILES
    for f in ds.files:
        with open(f, "wb") as out:
            for _ in range(each // CHUNK):
                out.write(os.urandom(CHUNK))
            out.write(os.urandom(each % CHUNK))
    return ds


def sample(path: Path) -> str:
    """sha256 of a file's first and last MiB, with its size: enough to tell a copy whole."""
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f:
        h.update(f.read(CHUNK))
        f.seek(max(0, size - CHUNK))
        h.update(f.read(CHUNK))
    return f"{size}:{h.hexdigest()}"


# ---- one launch, one rsync, the ideal ----------------------------------------------------------
@dataclass
class Up:
    wall: float  # the whole `fleet up --detach`
    transfer: float  # its data phase (the whole up where no `data:` line was seen)
    phase_seen: bool
    sent: int | None  # bytes the `data:` lines said were sent, all nodes together
    rss: int  # peak RSS in bytes
    stopped: str = ""  # why the benchmark stopped it, if it did
    failed: str = ""  # fleet's own failure (exit code and its last lines)


def vm_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a live process in KiB; zeros once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    got = {k: int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in text.splitlines())
           if k in ("VmRSS", "VmHWM")}
    return got.get("VmRSS", 0), got.get("VmHWM", 0)


def data_phase(proc: Proc) -> tuple[float, bool, int | None]:
    """(seconds of the data phase, whether fleet's lines showed it, bytes sent). The phase runs
    from the end of planning (the last `node rank` line before the first `data:` line; the
    command itself where there is none) to the last `data:` line."""
    err = list(proc.err)
    idx = [i for i, x in enumerate(err) if DATA_LINE.match(x.text)]
    end = proc.ended if proc.ended is not None else time.monotonic()
    if not idx:
        return end - proc.t0, False, None
    planned = [i for i in range(idx[0]) if PLANNED in err[i].text]
    start = err[planned[-1]].t if planned else proc.t0
    last: dict[str, int] = {}
    for i in idx:
        m = DATA_LINE.match(err[i].text)
        s = SENT.search(m.group(2)) if m else None
        if m and s:
            last[m.group(1)] = round(float(s.group(2)) * UNITS[s.group(3)])
    return err[idx[-1]].t - start, True, sum(last.values()) if last else None


def fleet_up(sc: Scratch, job: Path, inv: Path, deadline: float, paramiko: bool = False) -> Up:
    """One `fleet up --detach` of the data job, watched: stopped past `deadline` seconds or
    RSS_GUARD; the run (which only runs `true`) killed on the hosts afterwards. `paramiko`:
    with FLEET_OPENSSH=0 (no stream through the `ssh` binary)."""
    proc = Proc([PY, "-m", "fleet", "up", "--detach", str(job), "-i", str(inv)],
                env={**sc.env(), **({"FLEET_OPENSSH": "0"} if paramiko else {})}, cwd=sc.dir)
    peak_kib, stopped = 0, ""
    until = time.monotonic() + deadline
    for _ in range(int(deadline / POLL) + 2):
        if proc.poll() is not None:
            break
        rss, hwm = vm_kib(proc.p.pid)
        peak_kib = max(peak_kib, hwm)
        if rss * 1024 > RSS_GUARD:
            stopped = f"RSS over {RSS_GUARD / MB:.0f} MB"
            break
        if time.monotonic() > until:
            break
        time.sleep(POLL)
    if proc.poll() is None:
        stopped = stopped or f"over {deadline:.0f} s"
        proc.kill()
    code = proc.wait(30)
    run_id = run_id_of(proc)
    if run_id:
        kill_run(sc.tb, run_id)
    if stopped:
        kill_strays(sc.tb)
    transfer, seen, sent = data_phase(proc)
    wall = (proc.ended or time.monotonic()) - proc.t0
    failed = "" if stopped or code == 0 else (
        f"exit {code}: " + " / ".join(proc.err_text().splitlines()[-3:]))
    return Up(wall, transfer, seen, sent, max(peak_kib, proc.maxrss_kib) * 1024, stopped, failed)


def kill_strays(tb: Testbed) -> None:
    """What a stopped launch left running on the hosts (an unpacking tar, say), by PID."""
    for _ in range(3):
        left = [int(s.split()[0]) for h in tb.hosts for s in tb.stray_processes(h.name)]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def rsync_all(sc: Scratch, ds: DataSet, hosts: list[TbHost], deadline: float) -> float | None:
    """`rsync -a` of the data set to ~/rsync-data on every host at once: seconds until the
    last one is done, None past the deadline (all killed)."""
    t0 = time.monotonic()
    procs = [Proc([RSYNC, "-a", "-e", ssh_e(sc, None), f"{ds.dir}/",
                   f"root@{h.addr}:rsync-data/"]) for h in hosts]
    codes = [p.wait(max(1.0, t0 + deadline - time.monotonic())) for p in procs]
    for p in procs:
        p.kill()
    if any(c is None for c in codes):
        kill_strays(sc.tb)  # the rsync servers of the killed clients
        return None
    if any(c != 0 for c in codes):
        raise RuntimeError(f"rsync failed {codes}: " + procs[0].err_text()[-500:])
    return max(p.ended or 0.0 for p in procs) - t0


def ssh_cat(tb: Testbed, ds: DataSet, host: TbHost, deadline: float) -> float:
    """The measured ideal: the data set's bytes once through one plain `ssh HOST 'cat >
    /dev/null'`; seconds to ssh's exit."""
    t0 = time.monotonic()
    cat = subprocess.Popen(["cat", *map(str, ds.files)], stdout=subprocess.PIPE,
                           stdin=subprocess.DEVNULL)
    ssh = subprocess.Popen(ssh_argv(tb, host, "cat > /dev/null"), stdin=cat.stdout,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert cat.stdout is not None
    cat.stdout.close()
    try:
        _, err = ssh.communicate(timeout=deadline)
        took = time.monotonic() - t0
        if ssh.returncode != 0 or cat.wait(10) != 0:
            raise RuntimeError(f"ssh cat failed ({ssh.returncode}): {err.decode()[-300:]}")
        return took
    finally:
        for p in (ssh, cat):
            if p.poll() is None:
                p.kill()
                p.wait(10)


# ---- a testbed's worth of cases ----------------------------------------------------------------
@dataclass
class Bench:
    """One testbed, its scratch dir and data job, and what each host's home and private /tmp
    held at start."""

    sc: Scratch
    sets: dict[str, DataSet]
    problems: list[str] = field(default_factory=list)
    launches: int = 0

    def __post_init__(self) -> None:
        self.keep = {d: set(os.listdir(d)) for d in self.scratch_dirs()}
        (self.sc.dir / "app").mkdir()
        (self.sc.dir / "app" / "main.py").write_text("")

    def job(self, ds: DataSet) -> Path:
        """A job with `data` and a workdir of one empty file, that only runs `true`."""
        path = self.sc.dir / f"{ds.dir.name}.toml"
        path.write_text(f'inventory = "inv.toml"\nworkdir = "app"\ndata = "{ds.dir}"\n'
                        'launcher = "command"\ncommand = ["true"]\nnproc_per_node = 1\n'
                        f"[rendezvous]\nport = {next_port()}\n")
        return path

    def inventory(self, n: int) -> Path:
        """The first n hosts, in a workdir of this launch's own (kept for its touched re-up)."""
        self.launches += 1
        return self.sc.tb.inventory(self.sc.dir / f"inv{self.launches}.toml",
                                    [h.name for h in self.sc.tb.hosts[:n]],
                                    workdir=f"~/fleet-data-{self.launches}")

    def scratch_dirs(self) -> list[Path]:
        """Where a launch may leave copies: each host's home and its private /tmp (the
        testbed's tmp-<host> directory; what was there at start, its mount points, stays)."""
        tb = self.sc.tb
        return [d for h in tb.hosts for d in (h.home, tb.dir / f"tmp-{h.name}") if d.is_dir()]

    def clean(self) -> None:
        """Remove everything that launches and rsync left in the hosts' homes and /tmp."""
        for d in self.scratch_dirs():
            for name in sorted(set(os.listdir(d)) - self.keep.get(d, set())):
                path = d / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)

    def drop_rsync(self, hosts: list[TbHost]) -> None:
        for h in hosts:
            shutil.rmtree(h.home / "rsync-data", ignore_errors=True)

    def room(self, ds: DataSet, n: int, copies: int) -> None:
        """Refuse a case that would not fit on the disk (`copies` on each host at once)."""
        need = copies * n * ds.size + 2 * 10**9
        free = shutil.disk_usage(self.sc.tb.dir).free
        if free < need:
            raise RuntimeError(f"{free / 1e9:.1f} GB free, a case of {n} x {ds.size / 1e9:.1f} "
                               f"GB needs {need / 1e9:.1f} GB")

    def check(self, ds: DataSet, n: int, up: Up) -> None:
        """Every host that fleet sent to holds every file whole (size, first and last MiB)."""
        if up.failed:
            self.problems.append(f"fleet up of {ds.size / MB:.0f} MB to {n} host(s) failed: "
                                 + up.failed)
            return
        if up.stopped:
            return
        want = {f.name: sample(f) for f in ds.files}
        for h in self.sc.tb.hosts[:n]:
            got = {p.name: sample(p) for p in h.home.rglob("part*.bin")
                   if not p.is_relative_to(h.home / "rsync-data")}
            if got != want:
                self.problems.append(f"{h.name}: fleet's copy of {ds.dir.name} is not whole: "
                                     f"{sorted(got)} against {sorted(want)}")


def settle() -> None:
    """Dirty pages of the last copy written out, then the machine idle: each transfer starts
    from the same state and pays for no earlier one's writeback."""
    os.sync()
    wait_idle()


@dataclass
class Row:
    ups: list[Up] = field(default_factory=list)
    rsyncs: list[float | None] = field(default_factory=list)
    again: list[Up] = field(default_factory=list)  # after touch
    rsync_again: list[float | None] = field(default_factory=list)
    paramiko: list[Up] = field(default_factory=list)  # first, fleet's own connection only


def run_unshaped(b: Bench, case: Case) -> Row:
    ds, n, row = b.sets[case.size], case.hosts, Row()
    hosts = b.sc.tb.hosts[:n]
    slow = 120 + n * ds.size / (10 * MB)  # rsync's deadline: 10 MB/s per host would be broken
    job = b.job(ds)
    b.room(ds, n, 2 if case.touched else 1)
    for _ in range(case.reps):
        b.clean()
        inv = b.inventory(n)
        settle()
        base = rsync_all(b.sc, ds, hosts, slow)
        row.rsyncs.append(base)
        if not case.touched:
            b.drop_rsync(hosts)  # not needed again: the disk holds one copy per host at most
        settle()
        up = fleet_up(b.sc, job, inv, 60 + STOP_AT_BASELINE * (base or slow))
        row.ups.append(up)
        b.check(ds, n, up)
        if case.touched and not (up.stopped or up.failed):
            ds.touch()
            settle()
            base = rsync_all(b.sc, ds, hosts, slow)
            row.rsync_again.append(base)
            settle()
            again = fleet_up(b.sc, job, inv, 60 + STOP_AT_BASELINE * (base or slow))
            row.again.append(again)
            b.check(ds, n, again)
        b.clean()
        if case.paramiko and not (up.stopped or up.failed):
            settle()
            old = fleet_up(b.sc, job, b.inventory(n), 60 + STOP_AT_BASELINE * (base or slow),
                           paramiko=True)
            row.paramiko.append(old)
            b.check(ds, n, old)
            b.clean()
        if up.stopped or up.failed:
            break  # missed by far, or broken: the other runs would say the same
    return row


def run_shaped(b: Bench, case: Case, ideal: float) -> Row:
    ds, n, row = b.sets[case.size], case.hosts, Row()
    hosts = b.sc.tb.hosts[:n]
    naive = n * ds.size * 8 / UPLINK_BITS  # the bytes once per host through the uplink
    job = b.job(ds)
    b.room(ds, n, 1)
    for rep in range(case.reps):
        b.clean()
        settle()
        up = fleet_up(b.sc, job, b.inventory(n), 60 + STOP_AT_IDEAL * ideal)
        row.ups.append(up)
        b.check(ds, n, up)
        b.clean()
        if rep < case.rsync_reps:
            settle()
            row.rsyncs.append(rsync_all(b.sc, ds, hosts, 120 + 2 * naive))
            b.clean()
        if up.stopped or up.failed:
            break
    return row


# ---- tables ------------------------------------------------------------------------------------
def seconds(ups: list[Up], what: str) -> str:
    """The median of a time over the runs, or why there is none."""
    if not ups:
        return "-"
    bad = next((u for u in ups if u.stopped or u.failed), None)
    if bad is not None:
        return f"> {bad.wall:.0f}s, stopped" if bad.stopped else "failed"
    return fmt(median([getattr(u, what) for u in ups]))


def value(ups: list[Up], what: str) -> float | None:
    if not ups or any(u.stopped or u.failed for u in ups):
        return None
    return median([getattr(u, what) for u in ups])


def base_value(xs: list[float | None]) -> float | None:
    return median([x for x in xs if x is not None]) if xs and None not in xs else None


def base_text(xs: list[float | None]) -> str:
    if xs and None in xs:
        return "killed (too slow)"
    return fmt(base_value(xs))


def verdict(ups: list[Up], measured: float | None, base: float | None, limit: float) -> str:
    """met / MISSED of fleet's `measured` against limit x base (stopped or failed: MISSED)."""
    if any(u.stopped or u.failed for u in ups):
        return f"<= {limit}x MISSED"
    if measured is None or base is None:
        return "-"
    return f"<= {limit}x " + ("met" if measured <= limit * base else "MISSED")


def rss_text(ups: list[Up]) -> str:
    if not ups:
        return "-"
    peak = max(u.rss for u in ups)
    stopped = any(u.stopped.startswith("RSS") for u in ups)
    return f"{'> ' if stopped else ''}{peak / MB:.0f} MB"


def rss_verdict(ups: list[Up]) -> str:
    if not ups or any(u.failed for u in ups):
        return "-"
    ok = max(u.rss for u in ups) < RSS_TARGET and not any(u.stopped for u in ups)
    return f"< {RSS_TARGET / MB:.0f} MB " + ("met" if ok else "MISSED")


def sent_text(ups: list[Up]) -> str:
    sent = [u.sent for u in ups if u.sent is not None]
    return f"{max(sent) / MB:.0f} MB" if sent else "-"


def unshaped_row(table: Table, case: Case, row: Row) -> None:
    one = case.hosts == 1
    for label, ups, rs, judged in (("first", row.ups, row.rsyncs, "transfer"),
                                   ("touched", row.again, row.rsync_again, "wall"),
                                   ("first, paramiko", row.paramiko, row.rsyncs, "")):
        if (label == "touched" and not case.touched) or (judged == "" and not ups):
            continue
        base = base_value(rs)
        target = (("(b) transfer " if judged == "transfer" else "(c) up ")
                  + verdict(ups, value(ups, judged), base, RSYNC_TARGET)) \
            if one and judged else "-"
        table.add(case.size, case.hosts, label, len(ups), seconds(ups, "wall"),
                  seconds(ups, "transfer"), base_text(rs),
                  ratio(value(ups, "transfer"), base), ratio(value(ups, "wall"), base), target,
                  sent_text(ups), rss_text(ups),
                  rss_verdict(ups) if case.size == "4 GB" else "-")


def shaped_row(table: Table, case: Case, row: Row, ideal: float, measured: float) -> None:
    t = value(row.ups, "transfer")
    base = base_value(row.rsyncs)
    target = verdict(row.ups, t, ideal, IDEAL_TARGET) if case.hosts >= 4 else "-"
    table.add(case.size, case.hosts, len(row.ups), seconds(row.ups, "wall"),
              seconds(row.ups, "transfer"), fmt(ideal), fmt(measured), ratio(t, ideal),
              ratio(t, measured), f"(a) {target}" if target != "-" else "-",
              base_text(row.rsyncs) if row.rsyncs else "-", ratio(t, base),
              rss_text(row.ups))


def remarks(table: Table, rows: list[tuple[Case, Row]]) -> None:
    """Notes on runs that are not what they seem: stopped ones (why), whole-up transfers."""
    for case, row in rows:
        for label, ups in (("first", row.ups), ("touched", row.again)):
            for u in ups:
                if u.stopped:
                    table.notes.append(f"{case.size} to {case.hosts} host(s), {label}: stopped "
                                       f"after {u.wall:.0f} s ({u.stopped})")
    if any(not u.phase_seen for _, r in rows for u in r.ups + r.again
           if not (u.stopped or u.failed)):
        table.notes.append("where fleet printed no `data:` line, its transfer is the whole up")


# ---- the benchmark -----------------------------------------------------------------------------
@contextlib.contextmanager
def datasets(labels: set[str]) -> Iterator[tuple[dict[str, DataSet], float]]:
    """The data sets the matrix needs, made once in a scratch dir (removed at the end), and
    the seconds that took."""
    root = Path(tempfile.mkdtemp(prefix="fleet-bench-data-"))
    try:
        t0 = time.monotonic()
        sets = {label: make_dataset(root, label, SIZES[label])
                for label in SIZES if label in labels}
        yield sets, time.monotonic() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def load() -> str:
    """This machine's 1-minute load average: anything else running here shares its 2 cores
    and its disk with every transfer measured."""
    return Path("/proc/loadavg").read_text().split()[0]


def run(cfg: Config) -> list[Table]:
    plain, shaped = matrix(cfg)
    load_before = load()
    first = Table("data: `fleet up --detach` of a job whose `data` is 4 random files, no shaping; "
                  "seconds (rsync: `rsync -a -e ssh` to every host at once)",
                  ["size", "hosts", "run", "runs", "fleet up", "fleet transfer", "rsync",
                   "transfer/rsync", "up/rsync", "target", "fleet sent", "fleet peak RSS",
                   "target (d)"])
    behind = Table(f"data: first transfer behind a {UPLINK} uplink (this machine's link toward "
                   "the hosts shaped, host to host not); seconds",
                   ["size", "hosts", "runs", "fleet up", "fleet transfer", "ideal: bytes*8/rate",
                    "ideal: one ssh cat", "transfer/ideal", "transfer/ssh cat", "target",
                    "rsync to every host", "transfer/rsync", "fleet peak RSS"])
    with datasets({c.size for c in plain + shaped}) as (sets, made):
        with testbed(max(c.hosts for c in plain), cfg) as tb:
            b = Bench(Scratch(tb, "data"), sets)
            rows = [(c, run_unshaped(b, c)) for c in plain]
            first.problems += b.problems
        for c, r in rows:
            unshaped_row(first, c, r)
        with testbed(max(c.hosts for c in shaped), cfg, uplink=UPLINK) as tb:
            b = Bench(Scratch(tb, "data"), sets)
            ideals: dict[str, float] = {}
            for size in dict.fromkeys(c.size for c in shaped):
                reps = max(c.reps for c in shaped if c.size == size)
                ds = sets[size]
                runs = [ssh_cat(tb, ds, tb.hosts[0], 120 + 3 * ds.size * 8 / UPLINK_BITS)
                        for _ in range(reps)]
                ideals[size] = median(runs) or 0.0
            srows = [(c, run_shaped(b, c, ideals[c.size])) for c in shaped]
            behind.problems += b.problems
        for c, r in srows:
            shaped_row(behind, c, r, sets[c.size].size * 8 / UPLINK_BITS, ideals[c.size])
    first.notes += [
        "fleet up: the command to its exit (--detach; the job runs `true`); fleet transfer: "
        "from the end of planning (the last `node rank` line) to the last `data:` line, "
        "stderr lines timestamped as they arrive; fleet sent: what its `data:` lines say",
        "first, paramiko: the same first up with FLEET_OPENSSH=0 (the stream on fleet's own "
        "paramiko connection, as before the `ssh` binary carried it), after the others, "
        "against the same rsync",
        "touched: `touch` of every file after the first run (content unchanged), then the "
        "same `fleet up` into the same workdir, and rsync again onto its own copy",
        f"targets at 1 host: (b) first transfer <= {RSYNC_TARGET}x rsync, (c) the touched "
        f"re-up (the whole up) <= {RSYNC_TARGET}x rsync; (d) peak RSS (wait4's ru_maxrss and "
        f"VmHWM polled every {POLL} s) < {RSS_TARGET / MB:.0f} MB at 4 GB. 1 MB = 10^6 bytes",
        f"a launch is stopped at {STOP_AT_BASELINE:.0f}x rsync's time + 60 s, or when its RSS "
        f"passes {RSS_GUARD / MB:.0f} MB (this machine's memory); the hosts' copies are "
        f"removed after every run; data sets made in {made:.0f} s",
    ]
    behind.notes += [
        f"uplink: `tc qdisc ... tbf rate {UPLINK}` on the testbed's bridge (Testbed(uplink=)); "
        "the ideal is the data's bytes once through it: computed (bytes*8/rate) and measured "
        "(one plain `ssh HOST 'cat > /dev/null'` of the same bytes, with TCP/IP and ssh framing)",
        f"(a) at 4 and 8 hosts: fleet's transfer <= {IDEAL_TARGET}x the computed ideal; a "
        f"launch is stopped at {STOP_AT_IDEAL:.0f}x the measured ideal + 60 s or RSS over "
        f"{RSS_GUARD / MB:.0f} MB; rsync (one run per case) sends the bytes once per host, so "
        "not for 1 GB (8 GB through 100 Mbit would take 11 min)",
    ]
    remarks(first, rows)
    remarks(behind, srows)
    behind.notes.append(f"this machine's load average (1 min) at the start and the end of the "
                        f"benchmark: {load_before} and {load()} (2 cores)")
    return [first, behind]
