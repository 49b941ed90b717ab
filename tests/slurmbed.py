"""A real Slurm cluster on a testbed's hosts (docs/TESTING.md, "A real Slurm in the
testbed"): one munged, one slurmctld on a head node of its own, and one slurmd inside each
chosen host, so that a job step's processes live in that host (its hostname, /tmp, home and PID
space) and fleet sees them over SSH like on a real cluster. The test process is the login node:
clients (sbatch, srun, squeue, scancel, sinfo, scontrol) run here with `Slurm.env`.

    with Testbed(2, shared_home=True) as tb, Slurm(tb) as slurm:
        job = slurm.sbatch(script, "-N2", "--wait")

Where a job runs: Slurm expects one filesystem on every node. Use `Testbed(shared_home=True)`
and put job scripts, working directories (`--chdir`) and `--output` files under the shared
home or under tb.dir: both are at the same path on every host and here (a host's own /tmp is
not). With per-host homes a job that cds to $HOME sees a different directory on each node.

The head node is a network namespace of its own on the testbed's bridge (its address ending in
.2), so that concurrent clusters never share a port and slurmctld listens on no interface of
this machine. The cluster runs as root with proctrack/linuxproc, no cgroups and no accounting:
`sacct` does not work; `scontrol show job` does, for MinJobAge (300 s) after a job ends.

Everything it starts is stopped by PID on exit (also after a failure): jobs cancelled, then
slurmd, slurmctld and munged; what it wrote is removed. If the test process is killed first,
its daemons die with it (a parent-death signal; each slurmd with its host).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tests.testbed import Testbed, _children, _die_with_parent, _run, _wait_gone

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")
HEAD = "slurmhead"  # the controller's hostname
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})  # a job's terminal JobStates


def available() -> str | None:
    """Why a Slurm cluster cannot run here (with a testbed that can), or None if it can."""
    for tool in (SLURMCTLD, SLURMD, MUNGED, *(shutil.which(c) or c for c in CLIENTS)):
        if not os.access(tool, os.X_OK):
            return f"missing {tool}: run .ci/setup"
    return None


@dataclass
class Slurm:
    """`with Slurm(tb) as slurm:` on an entered Testbed: a cluster of the named hosts (all by
    default), `cpus` CPUs and `memory_mb` of memory each, in one default partition."""

    tb: Testbed
    nodes: list[str] | None = None
    cpus: int = 2
    memory_mb: int = 1000
    partition: str = "debug"
    kill_wait: int = 5  # seconds between a cancelled step's SIGTERM and its SIGKILL
    start_timeout: float = 20
    names: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        tb = self.tb
        if not tb.hosts:
            raise ValueError("Slurm needs an entered Testbed (`with Testbed(n) as tb`)")
        if tb.ipv6 or tb.bastion:
            raise ValueError("Slurm runs on an IPv4 testbed without a bastion")
        self.names = list(self.nodes or [h.name for h in tb.hosts])
        unknown = set(self.names) - {h.name for h in tb.hosts}
        if unknown:
            raise ValueError(f"no such testbed hosts: {sorted(unknown)}")
        self.dir = tb.dir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.head_ns = f"fl{tb.tag}sh"
        self.head_veth = f"fl{tb.tag}vs"
        self.head_addr = f"{tb.subnet}.2"
        self.env = {"SLURM_CONF": str(self.conf)}
        self.munged_pid = 0
        self.slurmctld_pid = 0
        self.slurmd_pids: dict[str, int] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self._made_ns = False
        self._made_veth = False
        self.start_seconds = 0.0  # how long __enter__ took to see every node idle

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Slurm:
        if self.dir.exists():  # its files and head node are another Slurm's: leave them be
            raise RuntimeError(f"a Slurm cluster already runs on this testbed ({self.dir})")
        t0 = time.monotonic()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _setup(self) -> None:
        self.dir.mkdir(mode=0o755)
        for d in ("state", "spool", "munge"):
            (self.dir / d).mkdir(mode=0o755)
        for name in self.names:
            # slurmd does not create its spool directory.
            (self.dir / "spool" / name).mkdir(mode=0o755)
        self._start_munged()
        self._make_head()
        self._write_conf()
        self._start_slurmctld()
        for name in self.names:
            self._start_slurmd(name)
        self._wait_idle(self.start_timeout)

    def _popen(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.dir / log_name, "wb")  # noqa: SIM115 - closed by close()
        self._logs.append(log)
        p = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=_die_with_parent)
        self._procs.append(p)
        return p

    def _start_munged(self) -> None:
        m = self.dir / "munge"
        key = m / "munge.key"
        with open(key, "wb", opener=lambda p, f: os.open(p, f, 0o400)) as f:
            f.write(os.urandom(1024))
        self.socket = m / "munge.socket"
        p = self._popen([MUNGED, "--foreground", f"--socket={self.socket}",
                         f"--key-file={key}", f"--pid-file={m / 'munged.pid'}",
                         f"--seed-file={m / 'munged.seed'}", f"--log-file={m / 'munged.log'}"],
                        "munged.out")
        self.munged_pid = p.pid
        self._wait_for(self.socket.is_socket, p, "munged", m / "munged.log", 10)

    def _make_head(self) -> None:
        """The head node: a network namespace on the testbed's bridge, with a resolver that
        answers nothing at once and a hosts file naming every node."""
        _run("ip", "netns", "add", self.head_ns)
        self._made_ns = True
        _run("ip", "link", "add", self.head_veth, "type", "veth", "peer", "name", "eth0",
             "netns", self.head_ns)
        self._made_veth = True
        _run("ip", "link", "set", self.head_veth, "master", self.tb.bridge, "up")
        _run("ip", "-n", self.head_ns, "addr", "add", f"{self.head_addr}/24", "dev", "eth0")
        _run("ip", "-n", self.head_ns, "link", "set", "eth0", "up")
        _run("ip", "-n", self.head_ns, "link", "set", "lo", "up")
        etc = Path("/etc/netns") / self.head_ns  # bind-mounted over /etc/* by `ip netns exec`
        etc.mkdir(parents=True, exist_ok=True)
        hosts = "".join(f"{h.addr} {h.name}\n" for h in self.tb.hosts)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.head_addr} {HEAD}\n{hosts}")
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    def _write_conf(self) -> None:
        d = self.dir
        nodes = []
        for name in self.names:
            h = self.tb.host(name)
            nodes.append(f"NodeName={h.name} NodeAddr={h.addr} NodeHostname={h.name} "
                         f"CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN")
        self.conf.write_text("\n".join([
            f"ClusterName=fleettb{self.tb.tag}",
            f"SlurmctldHost={HEAD}({self.head_addr})",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'spool'}/%n/slurmd.pid",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            # No systemd, no cgroups here: processes are tracked by their parentage.
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill", "MpiDefault=none",
            # Schedule a batch job when it comes (Slurm's default waits up to 3 s for more).
            "SchedulerParameters=batch_sched_delay=0",
            "ReturnToService=2",
            # A node may claim more CPUs than this small machine has.
            "SlurmdParameters=config_overrides",
            f"KillWait={self.kill_wait}", "InactiveLimit=0",
            "MailProg=/bin/true",  # there is no mail here (the default is missing: an error)
            *nodes,
            f"PartitionName={self.partition} Nodes={','.join(self.names)} Default=YES "
            "MaxTime=INFINITE State=UP",
        ]) + "\n")
        # slurmd 22.05 initializes a cgroup plugin whatever the other plugins, and autodetects
        # it from /sys/fs/cgroup, where a host has no cgroup filesystem (`ip netns exec` mounts
        # a fresh /sys): name it, so that nothing is detected (none is used).
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _start_slurmctld(self) -> None:
        # `ip netns exec` brings the head's /etc/hosts and resolv.conf; the UTS namespace its
        # hostname, which slurmctld checks against SlurmctldHost. Each step execs: the
        # process's PID is slurmctld's.
        p = self._popen(["ip", "netns", "exec", self.head_ns, "unshare", "--uts", "sh", "-c",
                         f"hostname {HEAD} && exec {SLURMCTLD} -D -i -f "
                         f"{shlex.quote(str(self.conf))}"], "slurmctld.out")
        self.slurmctld_pid = p.pid
        self._wait_for(self._ctld_listening, p, "slurmctld",
                       self.dir / "slurmctld.log", 15)

    def _ctld_listening(self) -> bool:
        r = subprocess.run(["ip", "netns", "exec", self.head_ns, "ss", "-Hltn", "sport = :6817"],
                           capture_output=True, text=True, timeout=10)
        return bool(r.stdout.strip())

    def _start_slurmd(self, name: str) -> None:
        """slurmd inside the host: its network, UTS, mount and PID namespaces, as a child of
        nsenter (which forks into the PID namespace); slurmstepd daemonizes and becomes a child
        of the host's init, which reaps it."""
        h = self.tb.host(name)
        p = self._popen(["nsenter", "-t", str(h.init_pid), "--net", "--uts", "--mount", "--pid",
                         f"--wd={self.dir}", "--", SLURMD, "-D", "-N", name,
                         "-f", str(self.conf)], f"slurmd-{name}.out")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and p.poll() is None:
            kids = _children(p.pid)
            if kids:
                self.slurmd_pids[name] = kids[0]
                return
            time.sleep(0.02)
        raise RuntimeError(f"slurmd on {name} did not start: "
                           f"{self._tail(self.dir / f'slurmd-{name}.out')}"
                           f"{self._tail(self.dir / f'slurmd-{name}.log')}")

    def _wait_for(self, ready: Callable[[], bool], p: subprocess.Popen[bytes], what: str,
                  log: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"{what} exited ({p.returncode}): {self._tail(log)}"
                                   f"{self._tail(self.dir / f'{what}.out')}")
            if ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{what} not ready in {timeout}s: {self._tail(log)}")

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, pid in self.slurmd_pids.items():
                if not os.path.exists(f"/proc/{pid}"):
                    raise RuntimeError(f"slurmd on {name} exited: "
                                       f"{self._tail(self.dir / f'slurmd-{name}.log')}")
            r = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10)
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in self.names):
                return
            time.sleep(0.2)
        logs = "".join(self._tail(self.dir / f"slurmd-{n}.log") for n in self.names)
        raise RuntimeError(f"nodes not idle in {timeout}s: {states}; "
                           f"{self._tail(self.dir / 'slurmctld.log')}{logs}")

    @staticmethod
    def _tail(path: Path, lines: int = 15) -> str:
        if not path.exists():
            return ""
        text = path.read_text(errors="replace").splitlines()[-lines:]
        return f"\n--- {path.name}:\n" + "\n".join(text)

    def close(self) -> None:
        """Cancel every job, stop the daemons by PID (slurmd, slurmctld, munged: TERM, then
        KILL after a while), remove the head node and what was written. Safe to call twice."""
        if self.slurmctld_pid and os.path.exists(f"/proc/{self.slurmctld_pid}"):
            with contextlib.suppress(Exception):
                self.run("scancel", "--user=root", check=False, timeout=10)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    r = self.run("squeue", "-h", "-o", "%i", check=False, timeout=10)
                    if r.returncode != 0 or not r.stdout.strip():
                        break
                    time.sleep(0.2)
        for pid in self.slurmd_pids.values():
            _stop(pid, 10, self._procs)
        self.slurmd_pids = {}
        # A step that outlived its cancellation (or a controller that could not cancel it):
        # the host's init reaps it.
        for name in self.names:
            for pid in self._pids_of(name, b"slurmstepd: ["):
                _stop(pid, 5, [])
        for attr in ("slurmctld_pid", "munged_pid"):
            pid = getattr(self, attr)
            if pid:
                _stop(pid, 10, self._procs)
                setattr(self, attr, 0)
        for p in self._procs:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self._procs = []
        for log in self._logs:
            log.close()
        self._logs = []
        if self._made_veth:
            _run("ip", "link", "del", self.head_veth, check=False)
            self._made_veth = False
        if self._made_ns:
            _run("ip", "netns", "del", self.head_ns, check=False)
            shutil.rmtree(Path("/etc/netns") / self.head_ns, ignore_errors=True)
            self._made_ns = False
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- using it ----------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 60,
            ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command, run here (the login node) against this cluster."""
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **self.env}, stdin=subprocess.DEVNULL)
        if check and p.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {p.returncode}: "
                               f"{p.stderr.strip()}{p.stdout.strip()}")
        return p

    def sbatch(self, script: Path, *args: str, timeout: float = 60) -> int:
        """Submit `script` (sbatch options first) and return the job id; with --wait, once the
        job has ended (whatever its exit code: see job_state)."""
        r = self.run("sbatch", "--parsable", *args, str(script), check=False, timeout=timeout)
        first = r.stdout.strip().split(";")[0]
        if not first.isdigit():
            raise RuntimeError(f"sbatch {script} exited {r.returncode}: {r.stderr.strip()}")
        return int(first)

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, NodeList, ...)."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id)).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait(self, job_id: int, timeout: float = 120, step: float = 0.1) -> dict[str, str]:
        """The job once it has ended (a JobState in ENDED), polled every `step` seconds:
        `sbatch --wait` itself polls every 2 to 10 s, too coarse to time anything with."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in ENDED:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {info.get('JobState')} after {timeout}s")
            time.sleep(step)

    def _pids_of(self, name: str, prefix: bytes) -> list[int]:
        """Global PIDs in host `name` whose command line starts with `prefix`."""
        found = []
        for pid in self.tb.pids(self.tb.host(name).ns):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(prefix):
                    found.append(pid)
        return found

    def job_processes(self, name: str, job_id: int) -> list[int]:
        """Global PIDs in host `name` that belong to job `job_id`, seen from the host's own
        processes: its slurmstepds and every process with the job's SLURM_JOB_ID."""
        found = []
        mark = f"SLURM_JOB_ID={job_id}".encode()
        for pid in self.tb.pids(self.tb.host(name).ns):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline.startswith(f"slurmstepd: [{job_id}.".encode()) or mark in env:
                found.append(pid)
        return found


def _stop(pid: int, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    """TERM, then KILL after `timeout`; until the process is gone (bounded). A process of
    ours (one of `procs`) is reaped here, any other by its own parent."""
    mine = next((p for p in procs if p.pid == pid), None)

    def gone(t: float) -> bool:
        if mine is None:
            _wait_gone(pid, t)
            return not os.path.exists(f"/proc/{pid}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            mine.wait(timeout=t)
        return mine.poll() is not None

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not gone(timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        gone(5)
