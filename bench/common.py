"""Shared benchmark machinery: timed processes, the fleet CLI, the ssh baseline, tables."""

from __future__ import annotations

import compileall
import contextlib
import itertools
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.testbed import TbHost, Testbed

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable  # the venv's python: fleet's, and the testbed hosts' interpreter
# Where `python -m fleet` is imported from: the working tree, or a snapshot of it (see snapshot)
FLEET_PATH = [ROOT]
RUN_ID = re.compile(r"^fleet: run (\S+): ", re.M)
_ports = itertools.count(29600 + secrets.randbelow(200) * 10)


@dataclass(frozen=True)
class Config:
    """How much to measure: --quick uses fewer repeats and host counts."""

    quick: bool = False

    def reps(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def pick(self, full: Sequence[int], quick: Sequence[int]) -> list[int]:
        return list(quick if self.quick else full)


def next_port() -> int:
    """A rendezvous port not used before in this process (hosts are fresh namespaces)."""
    return next(_ports)


# ---- processes whose output lines are timestamped as they arrive ------------------------------
@dataclass
class Line:
    t: float  # time.monotonic() at arrival
    wall: float  # time.time() at arrival
    text: str


class Proc:
    """A subprocess whose stdout and stderr lines are read as they come, each with its arrival
    time; `until` waits for a condition on them, always with a deadline."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.t0 = time.monotonic()
        self.p = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True)
        self.out: list[Line] = []
        self.err: list[Line] = []
        self.cond = threading.Condition()
        self.rusage: object | None = None
        self.ended: float | None = None  # time.monotonic() when it was seen to have exited
        self._readers = [threading.Thread(target=self._read, args=(s, d), daemon=True)
                         for s, d in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for r in self._readers:
            r.start()

    def _read(self, stream: object, dest: list[Line]) -> None:
        assert stream is not None
        for raw in stream:  # type: ignore[attr-defined]
            line = Line(time.monotonic(), time.time(),
                        raw.decode("utf-8", "replace").rstrip("\n"))
            with self.cond:
                dest.append(line)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def until(self, done: Callable[[Proc], bool], timeout: float) -> bool:
        """Wait until done(self) (checked on every new line and every 0.1 s) or the deadline."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not done(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(min(left, 0.1))
        return True

    def err_text(self) -> str:
        with self.cond:
            return "\n".join(x.text for x in self.err)

    def out_text(self) -> str:
        with self.cond:
            return "\n".join(x.text for x in self.out)

    def poll(self) -> int | None:
        """The exit code once it has exited (reaping it: records `ended` and its rusage)."""
        if self.ended is None:
            try:
                pid, status, usage = os.wait4(self.p.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (Popen): no rusage then
                self.ended = time.monotonic()
                return self.p.returncode
            if not pid:
                return None
            self.ended = time.monotonic()
            self.p.returncode = os.waitstatus_to_exitcode(status)
            self.rusage = usage
        return self.p.returncode

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None after killing it at the deadline."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                return None
            time.sleep(0.02)
        for r in self._readers:
            r.join(5)
        return self.p.returncode

    @property
    def cpu_s(self) -> float:
        """User + system CPU seconds of the process itself (after it was reaped)."""
        u = self.rusage
        return 0.0 if u is None else u.ru_utime + u.ru_stime  # type: ignore[attr-defined]

    @property
    def maxrss_kib(self) -> int:
        return 0 if self.rusage is None else int(self.rusage.ru_maxrss)  # type: ignore[attr-defined]

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        for r in self._readers:
            r.join(5)


# ---- fleet, and the plain-ssh baseline ------------------------------------------------------
@dataclass
class Scratch:
    """A scratch directory inside the testbed's own (removed with it) for jobs and state."""

    tb: Testbed
    name: str
    dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir = self.tb.dir / f"bench-{self.name}-{secrets.token_hex(2)}"
        self.dir.mkdir()
        self.launches = 0

    def env(self, src: Path | None = None, **extra: str) -> dict[str, str]:
        return {**os.environ, "FLEET_STATE_DIR": str(self.dir / ".fleet"), "NO_COLOR": "1",
                "PYTHONPATH": str(src or FLEET_PATH[0]), **extra}

    def fleet(self, *args: str, src: Path | None = None, **extra: str) -> Proc:
        """`python -m fleet ARGS` from the snapshot (or `src`), `extra` in its environment."""
        return Proc([PY, "-m", "fleet", *args], env=self.env(src, **extra), cwd=self.dir)

    def inventory(self, n: int, workdir: str | None = None) -> Path:
        """An inventory of the first n hosts. Each one gets a workdir of its own unless given,
        so no launch meets an earlier run's directory (fleet refuses hosts it thinks busy)."""
        self.launches += 1
        wd = workdir or f"~/fleet-{self.name}-{self.launches}"
        return self.tb.inventory(self.dir / f"inv{self.launches}.toml",
                                 [h.name for h in self.tb.hosts[:n]], workdir=wd)

    def job(self, name: str, script: str, port: int, args: Sequence[str] = (),
            extra: str = "") -> Path:
        """A job file `name.toml` whose workdir is `name/` holding `script` as main.py."""
        work = self.dir / name
        work.mkdir(exist_ok=True)
        (work / "main.py").write_text(script)
        path = self.dir / f"{name}.toml"
        argv = ", ".join(f'"{a}"' for a in args)
        path.write_text(f'inventory = "inv.toml"\nworkdir = "{name}"\nscript = "main.py"\n'
                        f"args = [{argv}]\nnproc_per_node = 1\n{extra}"
                        f"[rendezvous]\nport = {port}\n")
        return path


def snapshot(dest: Path, root: Path = ROOT, use: bool = True) -> str:
    """Copy fleet (with its templates, where the installed package maps them) from `root` to
    dest, check that it runs, and (`use`) use it for every launch: the tree may be edited while
    benchmarks run. Returns where it came from (commit, and whether fleet had uncommitted
    changes)."""
    for attempt in range(5):
        shutil.rmtree(dest / "fleet", ignore_errors=True)
        shutil.copytree(root / "fleet", dest / "fleet",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(root / "templates", dest / "fleet" / "templates",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # Byte-compiled, as `pip install` leaves a package: where PYTHONDONTWRITEBYTECODE is
        # set (this machine sets it) every launch would otherwise compile fleet's modules anew.
        compileall.compile_dir(str(dest / "fleet"), quiet=1)
        env = {**os.environ, "PYTHONPATH": str(dest)}
        probe = "import fleet.cli, fleet.templates as t; print(t.__file__)"
        check = subprocess.run([PY, "-c", probe], env=env, capture_output=True, text=True,
                               timeout=60, cwd=dest)
        if check.returncode == 0 and check.stdout.startswith(str(dest)):
            if use:
                FLEET_PATH[0] = dest
            break
        time.sleep(2 + attempt)  # caught in the middle of an edit: try again
    else:
        raise RuntimeError(f"fleet in {root} does not import: {check.stderr.strip()[-500:]}")
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, timeout=30).stdout.strip() or "unknown"
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "fleet", "templates"],
                           capture_output=True, text=True, timeout=30).stdout.strip()
    return f"commit {head}" + (" with uncommitted changes in fleet/" if dirty else "")


def run_id_of(proc: Proc) -> str | None:
    m = RUN_ID.search(proc.err_text())
    return m.group(1) if m else None


def ssh_argv(tb: Testbed, host: TbHost, command: str, *opts: str) -> list[str]:
    """Plain OpenSSH to a testbed host, host key checked against the testbed's known_hosts."""
    return ["ssh", "-i", str(tb.key), "-o", f"UserKnownHostsFile={tb.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
            *opts, f"root@{host.addr}", command]


def torchrun_line(tb: Testbed, rank: int, nnodes: int, port: int, script: str,
                  args: Sequence[str] = (), tag: str = "", directory: str = "~",
                  like_fleet: bool = False) -> str:
    """The command an ssh loop runs on node `rank`: torchrun of a script in `directory`.
    `tag` is put in the environment as FLEET_RUN_ID so the processes can be found and killed.
    `like_fleet`: with the options fleet's own torchrun line has beside these (each rank's
    output in a log dir and tee'd with its rank prefix, which costs torchrun time to exit)."""
    env = f"FLEET_RUN_ID={tag} " if tag else ""
    extra = "".join(f" {a}" for a in args)
    logs = f"--log-dir {directory}/torchrun-{tag or port} --tee 3 " if like_fleet else ""
    return (f"cd {directory} && {env}GLOO_SOCKET_IFNAME=eth0 PYTHONUNBUFFERED=1 {PY} "
            f"-m torch.distributed.run --nnodes {nnodes} --node-rank {rank} "
            f"--master-addr {tb.hosts[0].addr} --master-port {port} --nproc-per-node 1 "
            f"{logs}{script}{extra}")


def ideal_stop_command(run_id: str) -> str:
    """The ideal stop of one node, as a person who knew exactly what to signal would type it:
    one SIGTERM to every process of the run (found by FLEET_RUN_ID in /proc, as fleet's
    stop.sh finds them) at once, nothing else; the ssh command returns right after."""
    return (f"kill -TERM $(grep -lzxF FLEET_RUN_ID={run_id} /proc/[0-9]*/environ 2>/dev/null"
            " | cut -d/ -f3) 2>/dev/null; true")


def ideal_stop(tb: Testbed, run_id: str, hosts: Sequence[TbHost]) -> list[Proc]:
    """ideal_stop_command on every host at once, one OpenSSH client each."""
    return [Proc(ssh_argv(tb, h, ideal_stop_command(run_id))) for h in hosts]


def new_tag() -> str:
    return f"bench-{secrets.token_hex(4)}"


# ---- the job's processes, as seen from the hosts -------------------------------------------
def run_pids(tb: Testbed, run_id: str, hosts: Sequence[TbHost] | None = None,
             ) -> dict[str, list[int]]:
    """Per host, the PIDs in its network namespace carrying FLEET_RUN_ID=run_id: what
    tb.run_processes sees, in one pass over /proc instead of one `ip netns pids` per host."""
    hosts = list(hosts if hosts is not None else tb.hosts)
    ns_of: dict[tuple[int, int], str] = {}
    for h in hosts:
        with contextlib.suppress(OSError):
            st = os.stat(f"/run/netns/{h.ns}")
            ns_of[(st.st_dev, st.st_ino)] = h.name
    found: dict[str, list[int]] = {h.name: [] for h in hosts}
    needle = f"FLEET_RUN_ID={run_id}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
            name = ns_of.get((st.st_dev, st.st_ino))
            if name is None:
                continue
            env = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found[name].append(int(entry.name))
    return found


def wait_gone(tb: Testbed, run_id: str, timeout: float, hosts: Sequence[TbHost] | None = None,
              interval: float = 0.1) -> float | None:
    """Poll every `interval` until no process of the run is left on any host; the wall-clock
    time (time.time()) of the first poll that found none, or None at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t = time.time()
        if not any(run_pids(tb, run_id, hosts).values()):
            return t
        time.sleep(interval)
    return None


def run_dir(h: TbHost, run_id: str) -> Path:
    """A fleet run's directory on a host (under whichever workdir the launch used)."""
    found = sorted(h.home.glob(f"*/runs/{run_id}/{h.name}"))
    return found[0] if found else h.home / "fleet" / "runs" / run_id / h.name


def kill_run(tb: Testbed, run_id: str) -> dict[str, list[int]]:
    """SIGKILL whatever of the run is left on the hosts, by PID, fleet's run.sh last (so that
    it still records an exit code); returns what was there."""
    left = {k: v for k, v in run_pids(tb, run_id).items() if v}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [p for ps in run_pids(tb, run_id).values() for p in ps]
        if not pids:
            break
        late = time.monotonic() > deadline - 8  # run.sh had 2 s to end by itself
        for pid in pids:
            if late or not _is_run_sh(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return left


def _is_run_sh(pid: int) -> bool:
    try:
        return b"./run.sh" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def wait_idle(max_wait: float = 10, load: float = 0.5) -> None:
    """Let the machine settle between runs: wait (bounded) until the 1-second CPU use of
    everything is below `load` cores' worth."""
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        a = _cpu_busy()
        time.sleep(0.5)
        b = _cpu_busy()
        if (b - a) / 0.5 < load:
            return


def _cpu_busy() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


# ---- numbers and tables ---------------------------------------------------------------------
def median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fmt(x: float | None, unit: str = "s", digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}{unit}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # checks that failed: the run exits 1

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def render(self) -> str:
        widths = [max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
                  for i, c in enumerate(self.columns)]
        line = "| " + " | ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True))
        sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
        body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
                for r in self.rows]
        notes = [f"- {n}" for n in self.notes] + [f"- PROBLEM: {p}" for p in self.problems]
        return "\n".join([f"### {self.title}", "", line + " |", sep, *body,
                          *([""] + notes if notes else [])])


def testbed(n: int, cfg: Config, uplink: str | None = None) -> Testbed:
    """The testbed for a benchmark: tests/testbed.py's, whose hosts are separate machines
    (own PID namespace, /proc and /tmp); `uplink` shapes this machine's link toward them."""
    return Testbed(n, uplink=uplink)
