"""A real multi-host testbed on one machine: each host is a Linux network namespace with its own
address, hostname, PID space, mounts, /tmp and /var/tmp, home directory and OpenSSH sshd (see
docs/TESTING.md), so that it behaves like a separate lab machine.

Every host runs under a small init (PID 1 of its PID namespace, which reaps orphans) whose child
is `sshd -D`: killing sshd alone (`kill_sshd`) leaves the host's other processes running, killing
PID 1 (`kill_host`) kills everything on the host.

Host profiles, combinable (per host: one value for all, or a list with one entry per host):
  shell   login shell: bash (default), zsh, dash, fish or tcsh (sshd runs every command in it)
  noisy   the shell's rc file prints NOISE_STDOUT on stdout and NOISE_STDERR on stderr for every
          ssh command (~/.bashrc, ~/.zshenv, ~/.config/fish/config.fish, ~/.tcshrc; dash reads no
          rc file for a non-interactive command, so a noisy dash host is quiet)
  sftp    "external" (default): Debian's own `Subsystem sftp /usr/lib/openssh/sftp-server`,
          which sshd starts through the login shell (so a noisy rc file garbles it);
          "internal": `internal-sftp` (inside sshd, never through the shell: a kinder host);
          "none" (or False): no sftp subsystem (paramiko's open_sftp() fails: "Channel closed.")
and testbed-wide: shared_home (one home directory for every host, like an NFS home), ipv6
(IPv6-only hosts, TbHost.addr is then a v6 literal), user (log in as a non-root user),
colleagues (more login users on every host, "alice", ...: their own homes, the same test key,
so that `ssh alice@host` works; `start_as` runs a process of theirs in a host, as a colleague's
job) and uplink (a rate such as "100mbit": this machine's own link toward the hosts is shaped
to it, a token bucket on the bridge device, while the hosts reach one another at full speed, as
a laptop on a slow uplink reaches a lab whose machines share a fast switch).

Every host sees this machine's cgroup hierarchies at /sys/fs/cgroup, as a machine does its own.
One host can be made slower than its peers: `cpu_quota` holds every process of it to a
fraction of one CPU (the quota of its own cgroup of the cgroup v1 cpu controller, `cpu_cgroup`),
and `shape_host` holds its link to a rate (tc).

No host has a GPU, nor an nvidia-smi (unless this machine has one in /usr/bin): `fake_gpus`
puts tests/fake_nvidia_smi.py on one host's PATH as `nvidia-smi`, answering from a state (GPUs,
which host processes use them, a driver failure) that a test writes and rewrites.

Every host's sshd runs Debian's sshd_config as the package ships it (STOCK_SSHD_CONFIG: PAM,
StrictModes, MaxSessions 10, MaxStartups 10:30:100, the external sftp-server) with only what a
testbed needs put before it (its address, its host key, no pid file): a host kinder than a
stock one is a profile a test asks for, never the default.

Everything it creates carries a random tag (namespaces, bridge, veths, subnet, /etc/netns
entries, a temp dir) and is removed on exit, even after a failure: processes by PID first.
If the test process is killed before that, its hosts die with it (their namespaces, links and
files stay). Only the addresses of the namespaces it made are ever used.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

SSHD = "/usr/sbin/sshd"
# Debian's sshd_config exactly as the openssh-server package ships it (what /etc/ssh/sshd_config
# is on a host nobody edited).
STOCK_SSHD_CONFIG = Path("/usr/share/openssh/sshd_config")
SFTP_PROFILES = ("external", "internal", "none")
SHELLS = {"bash": "/bin/bash", "zsh": "/usr/bin/zsh", "dash": "/bin/dash",
          "fish": "/usr/bin/fish", "tcsh": "/usr/bin/tcsh"}
NOISE_STDOUT = "Welcome to the lab cluster; module load cuda/12"
NOISE_STDERR = "quota: 81% of /home used"
NOISE_TITLE = re.compile("\x1b\\]0;lab: [^\x07]*\x07")  # a terminal title, no newline after it
USER_ID = 4242  # uid and gid of the non-root login user (Testbed(user=...))
# colleagues get USER_ID + 1, + 2, ... in order (Testbed(colleagues=...))
PREPARE_AT_ONCE = 8  # hosts whose links and files are made at the same time
FAKE_SMI_STATE = ".tb-nvidia-smi.json"  # in a host's private /tmp (see fake_nvidia_smi.py)
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # the cgroup v1 cpu controller's hierarchy (cpu_quota)
SHARES_MAX = 262144  # cgroup v1's largest cpu.shares (cpu_machine's weight)
MOVE_PASSES = 50  # passes over a host's processes to move them all into or out of a cgroup

# PID 1 of every host: starts its command (sshd -D) and reaps every child, orphans included,
# until it is killed. Signals from inside the host are ignored, as by a real init.
_INIT = """\
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_DFL)
if os.fork() == 0:
    os.execv(sys.argv[1], sys.argv[1:])
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        time.sleep(1)
    except InterruptedError:
        pass
"""


def available() -> str | None:
    """Why the testbed cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in (SSHD, str(STOCK_SSHD_CONFIG), shutil.which("ip"), shutil.which("ssh-keygen"),
                 shutil.which("unshare"), shutil.which("nsenter")):
        if not tool or not os.path.exists(tool):
            return f"missing {tool or 'a tool'}: run .ci/setup"
    return None


@contextlib.contextmanager
def _claiming() -> Iterator[None]:
    """The lock that every testbed on this machine takes while it chooses and takes its names
    and subnets (tests/testbed.py's own file in /run/lock, or the temporary folder)."""
    import fcntl

    where = Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path(tempfile.gettempdir())
    with open(where / "fleet-testbed.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p


@dataclass
class TbHost:
    name: str
    ns: str
    addr: str
    iface: str
    veth: str
    home: Path
    host_key_pub: str = ""
    shell: str = "bash"
    noisy: bool = False
    sftp: str = "external"  # see SFTP_PROFILES
    user: str = "root"
    proc: subprocess.Popen[bytes] | None = None  # the host's launcher: its death kills the host
    init_pid: int = 0  # global PID (root PID namespace) of the host's PID 1
    sshd_pid: int = 0  # global PID of its sshd listener; 0 once killed
    sshd_config: Path | None = None
    log: Path | None = None  # init's and sshd's stderr

    @property
    def sshd(self) -> subprocess.Popen[bytes] | None:
        """Deprecated alias of `proc`, the launcher (still in the host's mount namespace):
        kill() on it takes the whole host down. Use Testbed.kill_sshd / kill_host."""
        return self.proc


def _per_host(value: Any, i: int, n: int, what: str) -> Any:
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{what}: {len(value)} values for {n} hosts")
        return value[i]
    return value


@dataclass
class Testbed:
    """`with Testbed(2) as tb:` gives hosts node1..nodeN reachable over SSH from here."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    n: int
    ifaces: list[str] | None = None  # interface name inside each host (default eth0)
    decoy: bool = False  # add a docker0-like veth, created before the real one, on each host
    bastion: bool = False  # hosts on an inner network that only a bastion host reaches
    shell: str | list[str] = "bash"  # login shell per host (see SHELLS)
    noisy: bool | list[bool] = False  # rc files that print on stdout and stderr
    sftp: str | bool | list[str | bool] = "external"  # the sftp subsystem (see SFTP_PROFILES)
    shared_home: bool = False  # one home directory for every host
    ipv6: bool = False  # IPv6-only hosts
    user: str = "root"  # the login user (another name: a non-root user, uid USER_ID)
    colleagues: tuple[str, ...] = ()  # more login users on every host (uid USER_ID+1, ...)
    uplink: str | None = None  # tc rate of this machine's link toward the hosts ("100mbit")
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: list[TbHost] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.uplink_bits = rate_bits(self.uplink) if self.uplink is not None else None
        if self.uplink is not None and not shutil.which("tc"):
            raise RuntimeError("uplink needs tc (iproute2): run .ci/setup")
        for i in range(self.n):
            shell = _per_host(self.shell, i, self.n, "shell")
            _per_host(self.noisy, i, self.n, "noisy")
            _sftp_profile(_per_host(self.sftp, i, self.n, "sftp"))
            if shell not in SHELLS:
                raise ValueError(f"unknown shell {shell!r}: one of {sorted(SHELLS)}")
            if not os.access(SHELLS[shell], os.X_OK):
                raise RuntimeError(f"login shell {SHELLS[shell]} is not installed: run .ci/setup")
        names = [self.user, *self.colleagues]
        if "root" in self.colleagues or len(set(names)) != len(names):
            raise ValueError(f"colleagues {self.colleagues}: distinct names, neither root nor "
                             f"the login user {self.user!r}")
        self.dir = Path(tempfile.mkdtemp(prefix=f"fleet-tb-{self.tag}-"))
        self.dir.chmod(0o755)  # a non-root user's home lies in it
        # The tag's names and the subnets are chosen in _setup, under a lock that the testbeds
        # of parallel test files share (_claim).
        self.bridge = self.inner_bridge = ""
        self.subnet = self.gateway = self.inner_subnet = ""
        self.bastion_host: TbHost | None = None
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self._links: list[str] = []
        self._netns: list[str] = []
        self._routes: list[str] = []
        self._logs: list[IO[bytes]] = []
        self._made_dirs: list[str] = []  # by mount_tmpfs, deepest first
        self._fake_smi: set[str] = set()  # hosts with the stand-in nvidia-smi on their PATH
        self._cgroups: dict[str, Path] = {}  # each host's own cpu cgroup (cpu_cgroup)

    # ---- addressing --------------------------------------------------------------------------
    @property
    def prefixlen(self) -> int:
        return 64 if self.ipv6 else 24

    def _addr(self, subnet: str, k: int) -> str:
        return f"{subnet}::{k}" if self.ipv6 else f"{subnet}.{k}"  # ::11 for node1

    def _net(self, subnet: str) -> str:
        return f"{subnet}::/64" if self.ipv6 else f"{subnet}.0/24"

    def _addr_add(self, addr: str, dev: str, ns: str | None = None) -> None:
        where = ["-n", ns] if ns else []
        extra = ["nodad"] if ":" in addr else []  # no duplicate detection: usable at once
        _run("ip", *where, "addr", "add", f"{addr}/{self.prefixlen}", "dev", dev, *extra)

    def _claim(self) -> None:
        """A tag no other testbed holds, and subnets no other uses, each taken (the bridge made,
        its address added, the bastion's route added) before another testbed may look: two
        test files setting up at once drew the same ones when choosing and taking were apart."""
        for _ in range(16):
            if not Path(f"/sys/class/net/fl{self.tag}br").exists():
                break
            self.tag = secrets.token_hex(2)
        self.bridge = f"fl{self.tag}br"
        self.subnet = self._free_subnet()
        self.gateway = self._addr(self.subnet, 1)
        # With a bastion, the hosts live on an inner bridge with no address on this machine, so
        # that the bastion (on both bridges, not forwarding) is the only way in.
        self.inner_bridge = f"fl{self.tag}bi" if self.bastion else self.bridge
        self.inner_subnet = self._free_subnet(avoid=self.subnet) if self.bastion else self.subnet
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        self._addr_add(self.gateway, self.bridge)
        if self.bastion:
            # Without this the inner subnet would follow this machine's default route out of
            # it: a test must never send a packet anywhere but to its own namespaces.
            _run("ip", "-6" if self.ipv6 else "-4", "route", "add", "unreachable",
                 self._net(self.inner_subnet))
            self._routes.append(self._net(self.inner_subnet))

    def _free_subnet(self, avoid: str = "") -> str:
        fam = "-6" if self.ipv6 else "-4"
        used = _run("ip", "-o", fam, "addr", "show").stdout + _run("ip", fam, "route").stdout
        for _ in range(200):
            if self.ipv6:
                candidate = f"fd00:{secrets.randbelow(0xfff0) + 0x10:x}"
                taken = f"{candidate}:" in used
            else:
                candidate = f"10.213.{secrets.randbelow(250) + 2}"
                taken = f"{candidate}." in used
            if not taken and candidate != avoid:
                return candidate
        raise RuntimeError("no free subnet for the testbed")

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Testbed:
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _every(self) -> list[TbHost]:
        return self.hosts + ([self.bastion_host] if self.bastion_host else [])

    def _setup(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleet-testbed",
             "-f", str(self.key))
        with _claiming():
            self._claim()
        _run("ip", "link", "set", self.bridge, "up")
        if self.uplink is not None:
            self.shape_uplink(self.uplink)
        if self.bastion:
            _run("ip", "link", "add", self.inner_bridge, "type", "bridge")
            self._links.append(self.inner_bridge)
            _run("ip", "link", "set", self.inner_bridge, "up")
        for i in range(1, self.n + 1):
            iface = self.ifaces[i - 1] if self.ifaces else "eth0"
            home = self.dir / ("home" if self.shared_home else f"home{i}")
            h = TbHost(name=f"node{i}", ns=f"fl{self.tag}h{i}",
                       addr=self._addr(self.inner_subnet, 10 + i), iface=iface,
                       veth=f"fl{self.tag}v{i}", home=home, user=self.user,
                       shell=_per_host(self.shell, i - 1, self.n, "shell"),
                       noisy=bool(_per_host(self.noisy, i - 1, self.n, "noisy")),
                       sftp=_sftp_profile(_per_host(self.sftp, i - 1, self.n, "sftp")))
            self.hosts.append(h)
        if self.bastion:
            self.bastion_host = TbHost(
                name="bastion", ns=f"fl{self.tag}bn", addr=self._addr(self.subnet, 5),
                iface="eth0", veth=f"fl{self.tag}vb", user=self.user,
                home=self.dir / ("home" if self.shared_home else "home-bastion"))
        self._write_noise()
        init = self.dir / "init.py"
        init.write_text(_INIT)
        # Links, addresses, files and keys for many hosts at once (64 one by one took about 6 s
        # of an idle machine's time), each host's launcher then started from this thread: its
        # death signal follows the thread that started it (see _die_with_parent).
        with ThreadPoolExecutor(PREPARE_AT_ONCE) as pool:
            list(pool.map(lambda h: self._prepare_host(h, self.inner_bridge), self.hosts))
        for h in self.hosts:
            self._launch_host(h)
        if self.bastion_host:
            b = self.bastion_host
            self._make_host(b, self.bridge)
            # Its second leg, on the inner network.
            _run("ip", "link", "add", f"fl{self.tag}vc", "type", "veth", "peer", "name", "eth1",
                 "netns", b.ns)
            self._links.append(f"fl{self.tag}vc")
            _run("ip", "link", "set", f"fl{self.tag}vc", "master", self.inner_bridge, "up")
            self._addr_add(self._addr(self.inner_subnet, 5), "eth1", b.ns)
            _run("ip", "-n", b.ns, "link", "set", "eth1", "up")
        self._write_known_hosts()
        for h in self._every():
            self._find_pids(h)
        for h in self._every():
            self._wait_ssh(h)

    def shape_uplink(self, rate: str | None) -> None:
        """A token bucket on the bridge device's egress: what this machine's own stack sends
        into the bridge (to any host) is held to `rate` (None: no limit, as at the start).
        Frames a host sends to another are forwarded from port to port and never pass that
        device's queue, and what the hosts send here arrives on its ingress: neither is
        limited. Goes with the bridge."""
        _run("tc", "qdisc", "del", "dev", self.bridge, "root", check=False)
        self.uplink = rate
        self.uplink_bits = rate_bits(rate) if rate is not None else None
        if rate is None or self.uplink_bits is None:
            return
        # burst: at least a 64 KiB GSO frame (tbf drops a frame larger than its bucket), and
        # about 10 ms at the rate; latency: how long a frame may wait (the queue's length).
        burst = max(64 * 1024, int(self.uplink_bits / 8 / 100))
        _run("tc", "qdisc", "add", "dev", self.bridge, "root", "tbf", "rate", rate,
             "burst", str(burst), "latency", "100ms")

    def shape_host(self, name: str, rate: str | None) -> None:
        """A token bucket on host `name`'s own link, both ways (`rate` None: no limit again):
        on its veth's end at the bridge (what reaches the host) and on its interface inside the
        host (what it sends), so that every other host, and this machine, reach it at `rate`
        while they reach one another at full speed: one host with a degraded NIC or cable.
        Goes with the host's link on close."""
        h = self.host(name)
        for where in ([], ["-n", h.ns]):
            dev = h.iface if where else h.veth
            _run("tc", *where, "qdisc", "del", "dev", dev, "root", check=False)
            if rate is not None:
                bits = rate_bits(rate)
                burst = max(64 * 1024, int(bits / 8 / 100))
                _run("tc", *where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                     "burst", str(burst), "latency", "100ms")

    def _write_noise(self) -> None:
        """The banner script that the noisy hosts' rc files run (it checks the hostname, so
        that a shared home can hold rc files for noisy and quiet hosts at once)."""
        names = "|".join(h.name for h in self.hosts if h.noisy)
        (self.dir / "lab-motd.sh").write_text(
            f'case "$(cat /proc/sys/kernel/hostname)" in\n  {names or "-"})\n'
            f"    echo {shlex.quote(NOISE_STDOUT)}\n    echo {shlex.quote(NOISE_STDERR)} >&2\n"
            # a terminal title, as many rc files set one: no newline after it
            "    printf '\\033]0;%s\\007' \"lab: $(cat /proc/sys/kernel/hostname)\"\n"
            "    ;;\nesac\n")

    def _accounts(self, h: TbHost) -> list[tuple[str, int, Path]]:
        """The host's login users but root, as (name, uid = gid, home): the non-root login
        user, then the colleagues (a home of their own beside the host's, or one shared)."""
        out = [(h.user, USER_ID, h.home)] if h.user != "root" else []
        return out + [(name, USER_ID + 1 + k, Path(f"{h.home}-{name}"))
                      for k, name in enumerate(self.colleagues)]

    def _write_home(self, h: TbHost) -> None:
        noisy = any(o.noisy for o in self.hosts if o.home == h.home)
        homes = [("root", 0, h.home)] if h.user == "root" else []
        for _, uid, home in homes + self._accounts(h):
            ssh = home / ".ssh"
            ssh.mkdir(parents=True, mode=0o700, exist_ok=True)
            shutil.copy(f"{self.key}.pub", ssh / "authorized_keys")
            if noisy:
                motd = self.dir / "lab-motd.sh"
                (home / ".bashrc").write_text(f". {motd}\n")
                (home / ".zshenv").write_text(f". {motd}\n")
                (home / ".tcshrc").write_text(f"/bin/sh {motd}\n")
                (home / ".config" / "fish").mkdir(parents=True, exist_ok=True)
                (home / ".config" / "fish" / "config.fish").write_text(f"/bin/sh {motd}\n")
            if uid:
                for path in [home, *home.rglob("*")]:
                    os.lchown(path, uid, uid)

    def _write_etc(self, h: TbHost) -> None:
        """/etc/netns/<ns>/* is bind-mounted over /etc/* by `ip netns exec`: hosts, resolver,
        and passwd (root's home is this host's own directory), group, shadow, shells for the
        login users and their shell."""
        etc = Path("/etc/netns") / h.ns
        etc.mkdir(parents=True, exist_ok=True)
        others = "".join(f"{o.addr} {o.name}\n" for o in self.hosts if o is not h)
        v6 = "::1 localhost ip6-localhost ip6-loopback\n" if self.ipv6 else ""
        # The seeds' pain, for real: the host's own name resolves to loopback, on the address
        # Debian's installer writes for it (127.0.1.1, not 127.0.0.1).
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{v6}127.0.1.1 {h.name}\n{others}")
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        shell = SHELLS[h.shell]
        accounts = self._accounts(h)
        ours = tuple(f"{name}:" for name, _, _ in accounts)
        passwd: list[str] = []
        for line in Path("/etc/passwd").read_text().splitlines():
            if line.startswith("root:"):
                line = _with(line, home=h.home, shell=shell if h.user == "root" else None)
            if not line.startswith(ours):
                passwd.append(line)
        group = [g for g in Path("/etc/group").read_text().splitlines()
                 if not g.startswith(ours)]
        shadow = [s for s in Path("/etc/shadow").read_text().splitlines()
                  if not s.startswith(ours)]
        for name, uid, home in accounts:
            passwd.append(f"{name}:x:{uid}:{uid}:lab user:{home}:{shell}")
            group.append(f"{name}:x:{uid}:")
            # '*': no password, not locked ('!' would make sshd refuse with UsePAM no)
            shadow.append(f"{name}:*:{int(time.time() // 86400)}:0:99999:7:::")
        if accounts:
            (etc / "shadow").write_text("\n".join(shadow) + "\n")
            (etc / "shadow").chmod(0o640)
        (etc / "passwd").write_text("\n".join(passwd) + "\n")
        (etc / "group").write_text("\n".join(group) + "\n")
        shells = Path("/etc/shells").read_text().splitlines()
        (etc / "shells").write_text("\n".join(shells + [s for s in SHELLS.values()
                                                         if s not in shells]) + "\n")

    def _make_host(self, h: TbHost, bridge: str) -> None:
        self._prepare_host(h, bridge)
        self._launch_host(h)

    def _prepare_host(self, h: TbHost, bridge: str) -> None:
        """Everything a host needs before its sshd starts: safe to run for several hosts at
        once (list.append is atomic; every name and file is the host's own)."""
        _run("ip", "netns", "add", h.ns)
        self._netns.append(h.ns)
        if self.decoy:
            # A docker0-like interface that exists first, with a lower ifindex than the real one.
            _run("ip", "link", "add", f"fl{self.tag}d{h.name[4:]}", "type", "veth", "peer",
                 "name", "docker0", "netns", h.ns)
            self._links.append(f"fl{self.tag}d{h.name[4:]}")
            _run("ip", "-n", h.ns, "addr", "add",
                 "fd17:ac1f:fa::1/64" if self.ipv6 else "172.31.250.1/24", "dev", "docker0",
                 *(["nodad"] if self.ipv6 else []))
            _run("ip", "-n", h.ns, "link", "set", "docker0", "up")
        _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", h.iface, "netns", h.ns)
        self._links.append(h.veth)
        _run("ip", "link", "set", h.veth, "master", bridge, "up")
        self._addr_add(h.addr, h.iface, h.ns)
        _run("ip", "-n", h.ns, "link", "set", h.iface, "up")
        _run("ip", "-n", h.ns, "link", "set", "lo", "up")
        self._write_etc(h)
        hostkey = self.dir / f"hostkey_{h.name}"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(hostkey))
        h.host_key_pub = Path(f"{hostkey}.pub").read_text().split()[1]
        h.sshd_config = self.dir / f"sshd_{h.name}.conf"
        h.sshd_config.write_text(sshd_config(h.addr, hostkey, h.sftp))
        h.log = self.dir / f"sshd_{h.name}.log"

    def _launch_host(self, h: TbHost) -> None:
        assert h.log is not None
        self._write_home(h)  # here, one host at a time: a shared home is written by each
        log = open(h.log, "wb")  # noqa: SIM115 - kept for the process, closed by close()
        self._logs.append(log)
        h.proc = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, "unshare", "--uts", "--mount", "--pid", "--fork",
             "--kill-child", "--mount-proc", "--propagation", "private",
             "sh", "-c", self._boot_script(h)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_die_with_parent)

    def _boot_script(self, h: TbHost) -> str:
        """What PID 1 of the host runs, in its new namespaces, before it becomes the init:
        hostname, a private /tmp (with the testbed's directory still at its path), /var/tmp
        and /dev/shm, for non-root users a traversable /root; then init with `sshd -D`."""
        q = shlex.quote
        private = self.dir / f"tmp-{h.name}"
        vartmp = self.dir / f"vartmp-{h.name}"
        for d in (private, vartmp):
            d.mkdir(mode=0o1777)
            d.chmod(0o1777)  # as Debian's /tmp and /var/tmp (mkdir's mode obeys the umask)
        lines = ["set -e", f"hostname {q(h.name)}", f"mount --bind {q(str(vartmp))} /var/tmp"]
        for keep in _kept_in_tmp(self.dir):
            inner = private / keep.relative_to("/tmp")
            inner.mkdir(parents=True)
            lines.append(f"mount --bind {q(str(keep))} {q(str(inner))}")
        lines += [f"mount --rbind {q(str(private))} /tmp",
                  "mount -t tmpfs -o mode=1777,size=25% tmpfs /dev/shm"]
        lines += _cgroup_mounts()
        if self._accounts(h):
            # /root is 0700; the venv's python is a link into /root/.pyenv: a 0755 /root that
            # holds only what the interpreter and the repository need.
            for top in _under_root():
                stash = self.dir / f"stash-{h.name}-{top}"
                stash.mkdir()
                lines.append(f"mount --rbind {q('/root/' + top)} {q(str(stash))}")
            lines.append("mount -t tmpfs -o mode=0755,size=1m tmpfs /root")
            for top in _under_root():
                stash = self.dir / f"stash-{h.name}-{top}"
                lines += [f"mkdir /root/{q(top)}",
                          f"mount --move {q(str(stash))} /root/{q(top)}"]
        init = self.dir / "init.py"
        lines.append(f"exec {q(sys.executable)} -I -S {q(str(init))} {SSHD} -D -e "
                     f"-f {q(str(h.sshd_config))}")
        return "\n".join(lines)

    def _find_pids(self, h: TbHost, timeout: float = 15) -> None:
        """The global PIDs of the host's init (the launcher's child) and of its sshd."""
        assert h.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if h.proc.poll() is not None:
                raise RuntimeError(f"host {h.name} exited: {self._log_text(h)}")
            if not h.init_pid:
                kids = _children(h.proc.pid)
                h.init_pid = kids[0] if kids else 0
            if h.init_pid:
                h.sshd_pid = self._sshd_of(h)
                if h.sshd_pid:
                    return
            time.sleep(0.02)
        raise RuntimeError(f"host {h.name} did not start sshd in {timeout}s: "
                           f"{self._log_text(h)}")

    def _sshd_of(self, h: TbHost) -> int:
        for pid in _children(h.init_pid):
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if exe == os.path.realpath(SSHD) and str(h.sshd_config).encode() in cmdline:
                return pid
        return 0

    def _log_text(self, h: TbHost) -> str:
        return h.log.read_text(errors="replace") if h.log and h.log.exists() else ""

    def _write_known_hosts(self) -> None:
        self.known_hosts.write_text("".join(f"{h.addr} ssh-ed25519 {h.host_key_pub}\n"
                                            for h in self._every()))

    def _wait_ssh(self, h: TbHost, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        outer = h is self.bastion_host or not self.bastion
        while time.monotonic() < deadline:
            if h.proc is not None and h.proc.poll() is not None:
                raise RuntimeError(f"host {h.name} exited: {self._log_text(h)}")
            if outer:
                try:
                    with socket.create_connection((h.addr, 22), timeout=1) as s:
                        if s.recv(4).startswith(b"SSH"):
                            return
                except OSError:
                    pass
            elif subprocess.run(["ip", "netns", "exec", h.ns, "bash", "-c",
                                 f"exec 3<>/dev/tcp/{h.addr}/22"],
                                capture_output=True, timeout=10).returncode == 0:
                return  # the inner network: seen from the host itself
            time.sleep(0.1)
        raise RuntimeError(f"sshd on {h.name} ({h.addr}) did not come up in {timeout}s")

    def close(self) -> None:
        every = self._every()
        for h in every:
            if self._init_is_live(h):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(h.init_pid, signal.SIGKILL)  # the whole host
        for ns in self._netns:
            self.kill_all(ns)
        for h in every:
            if h.proc is not None:
                if h.proc.poll() is None:
                    h.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    h.proc.wait(timeout=10)
        for log in self._logs:
            log.close()
        for cg in self._cgroups.values():  # the hosts are dead: nothing of theirs is left
            with contextlib.suppress(RuntimeError, OSError):
                _remove_cgroup(cg, cg.parent)
        for made in sorted(set(self._made_dirs), key=len, reverse=True):  # empty by now
            with contextlib.suppress(OSError):
                os.rmdir(made)
        for ns in self._netns:
            _run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for link in self._links:
            if _run("ip", "link", "show", link, check=False).returncode == 0:
                _run("ip", "link", "del", link, check=False)
        for route in self._routes:
            _run("ip", "-6" if self.ipv6 else "-4", "route", "del", "unreachable", route,
                 check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- faults --------------------------------------------------------------------------------
    def kill_sshd(self, name: str, timeout: float = 10) -> None:
        """SIGKILL the host's sshd listener only: open sessions and every other process on
        the host go on (they are re-parented to the host's init); new logins are refused."""
        h = self.host(name)
        pid, h.sshd_pid = h.sshd_pid, 0
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, timeout)

    def start_sshd(self, name: str, timeout: float = 15) -> None:
        """Start the host's sshd again (after kill_sshd), as a child of the host's init."""
        h = self.host(name)
        if h.sshd_pid:
            return
        r = self.exec(name, SSHD, "-f", str(h.sshd_config), "-E", str(h.log), timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"sshd on {name} did not start: {r.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while not h.sshd_pid and time.monotonic() < deadline:
            h.sshd_pid = self._sshd_of(h)
            time.sleep(0.02)
        self._wait_ssh(h, max(1.0, deadline - time.monotonic()))

    def kill_host(self, name: str, timeout: float = 10) -> None:
        """SIGKILL the host's PID 1: every process of the host dies with it, as in a power
        cut (the network namespace, its links and files stay)."""
        h = self.host(name)
        if self._init_is_live(h):
            with contextlib.suppress(ProcessLookupError):
                os.kill(h.init_pid, signal.SIGKILL)
            _wait_gone(h.init_pid, timeout)
        if h.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                h.proc.wait(timeout=timeout)
        # Its PIDs are free for the machine to give again (pid_max wraps within a CI run):
        # kept, a later close() or exec() would signal or enter another test's process.
        h.init_pid = h.sshd_pid = 0

    @staticmethod
    def _init_is_live(h: TbHost) -> bool:
        """h.init_pid is still the host's init: a child of the host's launcher (this process's
        own child, unreaped while it runs, so neither PID can have been given to another)."""
        return bool(h.init_pid and h.proc is not None and h.proc.poll() is None
                    and h.init_pid in _children(h.proc.pid))

    def cpu_cgroup(self, name: str) -> Path:
        """Host `name`'s own cgroup of the cgroup v1 cpu controller (CPU_CGROUP), as a
        container's or a Slurm job's is: made at the first call, under the cgroup the host's
        init is in, and every process of the host's PID namespace (its init and sshd, whatever
        runs there) moved into it; what starts there later is their child and is born in it,
        so that a process that looks up its cgroup once, at its start, finds this one, as on a
        machine. No limit until cpu_quota sets one. Removed by close()."""
        if name in self._cgroups:
            return self._cgroups[name]
        why = cpu_quota_available()
        if why is not None:
            raise RuntimeError(f"cpu_cgroup: {why}")
        h = self.host(name)
        if not h.init_pid:
            raise RuntimeError(f"cpu_cgroup: host {name} is not running")
        parent = CPU_CGROUP / _cpu_cgroup_of(h.init_pid).lstrip("/")
        cg = parent / f"fleet-tb-{self.tag}-{name}-{secrets.token_hex(3)}"
        cg.mkdir()
        self._cgroups[name] = cg
        _move_all(lambda: set(_pid_ns_members(h.init_pid)), cg)
        return cg

    @contextlib.contextmanager
    def cpu_quota(self, name: str, fraction: float, period_us: int = 100_000) -> Iterator[Path]:
        """Every process of host `name` held to `fraction` of one CPU while it lasts, as a
        container's limit lowered in place or a colleague's share of a lab machine: the quota
        of the host's own cgroup (cpu_cgroup), cpu.cfs_quota_us = fraction * cpu.cfs_period_us,
        which its processes, those running and those started later, are subject to in the
        cgroup they already live in. Yields the cgroup (its cpu.stat counts the periods
        throttled). On exit, after a failure too, the limit before it is put back: none, or
        cpu_machine's (the processes stay in the host's cgroup)."""
        if not 0 < fraction <= 64 or not 1000 <= period_us <= 1_000_000:
            raise ValueError(f"cpu_quota({fraction}, period_us={period_us}): a fraction of a "
                             "CPU in (0, 64], a period of 1 ms to 1 s")
        cg = self.cpu_cgroup(name)
        before = [(cg / f).read_text().strip() for f in ("cpu.cfs_period_us", "cpu.cfs_quota_us")]
        try:
            _set_quota(cg, period_us, max(1000, int(fraction * period_us)))
            yield cg
        finally:
            _set_quota(cg, int(before[0]), int(before[1]))

    @contextlib.contextmanager
    def cpu_machine(self, names: list[str], cpus: float, period_us: int = 100_000
                    ) -> Iterator[None]:
        """Hosts `names` each a machine of `cpus` CPUs of its own while it lasts: each one's
        cgroup (cpu_cgroup) held to `cpus` (its quota) and given the largest weight
        (cpu.shares), so that it gets what it asks for up to that whatever else this machine
        runs at the time (other tests, other testbeds), and never more. Hosts made so keep one
        speed under a load that comes and goes beside them, as separate machines do; hosts that
        share this machine's CPUs by weight alone slow down with the load, all alike. What they
        get is taken from the rest of the suite: together they may have a third of this
        machine's CPUs at most, and only for the minutes that need it. cpu_quota lowers one's
        limit for a while and puts this one back; on exit, after a failure too, the hosts share
        by weight again."""
        room = (os.cpu_count() or 1) / 3
        if not names or not 0 < cpus * len(names) <= room:
            raise ValueError(f"cpu_machine({names}, {cpus}): the testbed's machines may take a "
                             f"third of this machine's {os.cpu_count()} CPUs at most ({room:g})")
        before = {}
        try:
            for name in names:
                cg = self.cpu_cgroup(name)
                before[name] = [(cg / f).read_text().strip()
                                for f in ("cpu.cfs_period_us", "cpu.cfs_quota_us", "cpu.shares")]
                _set_quota(cg, period_us, max(1000, int(cpus * period_us)))
                (cg / "cpu.shares").write_text(str(SHARES_MAX))
            yield
        finally:
            for name, (period, quota, shares) in before.items():
                cg = self.cpu_cgroup(name)
                (cg / "cpu.shares").write_text(shares)
                _set_quota(cg, int(period), int(quota))

    def cpu_seconds(self, name: str) -> float:
        """CPU seconds (user + system) used so far by the processes of host `name` alive now:
        two looks apart tell how much of a CPU the host's work gets (cpu_quota's measure)."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in _pid_ns_members(self.host(name).init_pid):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime (stat's 14th, 15th)
        return total / tick

    def cut_off(self, name: str) -> None:
        """Drop every packet into and out of the host (its loopback excepted), inside its own
        network namespace: to its peers and to this machine it looks as a partition or a power
        cut does, nothing closes and nothing answers, while its processes go on. Undone by
        reconnect(name), and with the namespace on close()."""
        ns = self.host(name).ns
        for chain, lo in (("INPUT", "-i"), ("OUTPUT", "-o")):
            _run("ip", "netns", "exec", ns, "iptables", "-I", chain, "1", "-j", "DROP")
            _run("ip", "netns", "exec", ns, "iptables", "-I", chain, "1", lo, "lo", "-j",
                 "ACCEPT")

    def reconnect(self, name: str) -> None:
        """Undo cut_off(name)."""
        ns = self.host(name).ns
        for chain in ("INPUT", "OUTPUT"):
            _run("ip", "netns", "exec", ns, "iptables", "-F", chain)

    def mount_tmpfs(self, name: str, path: str | Path, size: str = "64k") -> None:
        """Mount a tmpfs of `size` at `path` (created if missing) inside the host only: what
        every process of the host sees there from now on (a small, full disk). Owned by the
        login user. Gone with the host; `umount(name, path)` removes it earlier."""
        owner = f",uid={USER_ID},gid={USER_ID}" if self.user != "root" else ""
        path = Path(path)
        missing = [str(p) for p in (path, *path.parents)
                   if self.exec(name, "test", "-e", str(p)).returncode != 0]
        r = self.exec(name, "sh", "-c", 'mkdir -p "$1" && mount -t tmpfs -o "$2" tmpfs "$1"',
                      "sh", str(path), f"size={size},mode=0755{owner}")
        # Directories made outside /tmp and /root (the hosts' own) are this machine's: removed
        # again by close().
        self._made_dirs += [p for p in missing if not p.startswith(("/tmp/", "/root/"))]
        if r.returncode != 0:
            raise RuntimeError(f"mount tmpfs at {path} on {name}: {r.stderr.strip()}")

    def put_on_path(self, name: str, command: str, text: str) -> None:
        """A command on this host's PATH only (a fake `nvidia-smi`, say): /usr/local/bin is
        bind-mounted, inside the host, over a directory of its own (in the host's private /tmp)
        that keeps every entry of the real one as a link and adds this file."""
        own, real = "/tmp/.tb-path", "/tmp/.tb-path-real"
        private = self.dir / f"tmp-{name}" / own.removeprefix("/tmp/")
        private.mkdir(exist_ok=True)
        (private / command).write_text(text)
        (private / command).chmod(0o755)
        r = self.exec(name, "sh", "-c", 'set -e; mkdir -p "$2"\n'
                      'mountpoint -q "$2" || mount --bind /usr/local/bin "$2"\n'
                      'for x in "$2"/*; do [ -e "$x" ] && ln -sfn "$x" "$1/"; done\n'
                      'mountpoint -q /usr/local/bin || mount --bind "$1" /usr/local/bin',
                      "sh", own, real)
        if r.returncode != 0:
            raise RuntimeError(f"put {command} on {name}'s PATH: {r.stderr.strip()}")

    def fake_gpus(self, name: str, state: dict[str, Any]) -> None:
        """GPUs for host `name`: the stand-in nvidia-smi (tests/fake_nvidia_smi.py) on its
        PATH, answering from `state` (see there); called again, the state is replaced. The
        state file is written whole and renamed into place: a query never reads half of it."""
        if name not in self._fake_smi:
            program = Path(__file__).with_name("fake_nvidia_smi.py").read_text()
            self.put_on_path(name, "nvidia-smi", f"#!{sys.executable} -I\n{program}")
            self._fake_smi.add(name)
        path = self.dir / f"tmp-{name}" / FAKE_SMI_STATE
        tmp = path.with_name(f"{FAKE_SMI_STATE}.{secrets.token_hex(4)}")
        tmp.write_text(json.dumps(state))
        tmp.chmod(0o644)
        os.replace(tmp, path)

    def umount(self, name: str, path: str | Path) -> None:
        r = self.exec(name, "umount", str(path))
        if r.returncode != 0:
            raise RuntimeError(f"umount {path} on {name}: {r.stderr.strip()}")

    # ---- looking at a host from the inside ---------------------------------------------------
    def host(self, name: str) -> TbHost:
        return next(h for h in self._every() if h.name == name)

    def ssh_config(self, path: Path, user: str | None = None) -> Path:
        """An OpenSSH client config: every host (through the bastion, if any) with the test key
        and known_hosts, logged into as `user` (default: the login user)."""
        user = user or self.user
        lines = []
        if self.bastion_host:
            jump = self.bastion_host.addr
            jump = f"[{jump}]" if ":" in jump else jump
            pattern = f"{self.inner_subnet}::*" if self.ipv6 else f"{self.inner_subnet}.*"
            lines += [f"Host {pattern}", f"  ProxyJump {user}@{jump}"]
        lines += ["Host *", f"  IdentityFile {self.key}",
                  f"  UserKnownHostsFile {self.known_hosts}", f"  User {user}"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path

    def pids(self, ns: str) -> list[int]:
        """Global PIDs of every process in network namespace `ns` (the host's processes, and
        any launcher or nsenter of this machine's that lives there)."""
        out = _run("ip", "netns", "pids", ns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self, ns: str) -> None:
        for _ in range(3):
            pids = self.pids(ns)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    def run_processes(self, name: str, run_id: str) -> list[int]:
        """PIDs in host `name` whose environment carries this fleet run id, seen from the host
        itself (not from fleet's own state)."""
        found = []
        for pid in self.pids(self.host(name).ns):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            # As fleet's run_pids.sh: the attempt's own id (every attempt of a run has the
            # run's FLEET_RUN_ID), else FLEET_RUN_ID where there is no attempt id.
            attempts = [e for e in env if e.startswith(b"FLEET_ATTEMPT_ID=")]
            if (f"FLEET_ATTEMPT_ID={run_id}".encode() in attempts if attempts
                    else f"FLEET_RUN_ID={run_id}".encode() in env):
                found.append(pid)
        return found

    def stray_processes(self, name: str) -> list[str]:
        """Every process on the host but its init and sshd (the listener, and sessions still
        closing): what anything run there left behind, as "pid command line"."""
        h = self.host(name)
        left = []
        for pid in self.pids(h.ns):
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue  # gone meanwhile
            if pid in (h.init_pid, h.proc.pid if h.proc else 0) or exe == os.path.realpath(SSHD):
                continue
            if cmd.startswith(("ip netns exec", "unshare ", "nsenter ")):
                continue  # this machine's own launcher of the host, or a look inside it
            left.append(f"{pid} {cmd.strip()}")
        return left

    def silence_bound(self, name: str, floor: int = 12, ceiling: int = 60) -> int:
        """A watchdog's hang_timeout that a job's start on this host does not reach under the
        machine's load now: 3 times what importing torch takes on the host now (torchrun
        prints nothing while it imports torch, nor a rank before its first line), at least
        `floor` seconds, and at most `ceiling` (the tests' own time limits). A test that proves
        the watchdog stops a silent run then proves it on a loaded machine too, without
        calling a slow start a hang."""
        t0 = time.monotonic()
        self.exec(name, sys.executable, "-c", "import torch, torch.distributed", timeout=300)
        return min(ceiling, max(floor, int(3 * (time.monotonic() - t0)) + 1))

    def exec(self, name: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run argv as root inside the host: its network, UTS, mount and PID namespaces (its
        own /proc, /tmp and mounts), with this process's environment."""
        h = self.host(name)
        return subprocess.run(["nsenter", "-t", str(h.init_pid), "-m", "-u", "-n", "-p",
                               "--", *argv], capture_output=True, text=True, timeout=timeout)

    def start_as(self, name: str, user: str, *argv: str) -> int:
        """Start argv in host `name` as `user` (a colleague, the login user or root), as that
        user's own job would run there: detached (its own session, stdin/stdout/stderr
        /dev/null), the user's groups and a fresh login environment (HOME, PATH...). Its PID as
        seen inside the host (what ps or nvidia-smi there shows); the host's init reaps it."""
        uids = {"root": 0, **{n: uid for n, uid, _ in self._accounts(self.host(name))}}
        if user not in uids:
            raise ValueError(f"no user {user!r} on {name}: one of {sorted(uids)}")
        uid = str(uids[user])
        # In the background of a non-interactive sh the job is no process group leader, so
        # setsid needs no fork: $! is the program's own PID once it has exec'd.
        r = self.exec(name, "sh", "-c", 'u=$1; shift\n'
                      'setpriv --reuid="$u" --regid="$u" --init-groups --reset-env '
                      'setsid "$@" </dev/null >/dev/null 2>&1 &\necho $!', "sh", uid, *argv)
        if r.returncode != 0 or not r.stdout.strip().isdigit():
            raise RuntimeError(f"start {argv} as {user} on {name}: {r.stderr.strip()}")
        return int(r.stdout)

    def alive(self, name: str, pid: int) -> bool:
        """Host-PID `pid` exists in host `name` and is not a zombie."""
        r = self.exec(name, "cat", f"/proc/{pid}/stat")
        return r.returncode == 0 and r.stdout.rsplit(")", 1)[1].split()[0] not in ("Z", "X")

    def kill_in(self, name: str, pid: int) -> None:
        """SIGKILL host-PID `pid` in host `name` (its init then reaps it)."""
        r = self.exec(name, "kill", "-KILL", str(pid))
        if r.returncode != 0:
            raise RuntimeError(f"kill {pid} on {name}: {r.stderr.strip()}")

    def inventory(self, path: Path, hosts: list[str] | None = None,
                  per_host: dict[str, dict[str, object]] | None = None,
                  **defaults: object) -> Path:
        """Write an inventory of these hosts (all, or the named ones, in that order), with
        `per_host` settings in a host's own table; `defaults` add to or override the
        [defaults] table (user="alice": logged into as a colleague)."""
        values = {"user": self.user, "identity": str(self.key),
                  "known_hosts": str(self.known_hosts), "python": sys.executable,
                  "workdir": "~/fleet", "connect_timeout": 5.0, **defaults}
        lines = ["[defaults]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
        for name in hosts or [h.name for h in self.hosts]:
            h = self.host(name)
            lines += ["", "[[hosts]]", f"name = {_toml(h.name)}", f"address = {_toml(h.addr)}"]
            lines += [f"{k} = {_toml(v)}" for k, v in (per_host or {}).get(name, {}).items()]
        path.write_text("\n".join(lines) + "\n")
        return path


_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12,
               "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40}


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate in bits ("100mbit", "1.5gbit", "512kibit"); tc's byte
    units ("mbps" is megabytes a second there) are refused, being easy to misread."""
    text = rate.strip().lower()
    unit = text.lstrip("0123456789.")
    number = text[:len(text) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _RATE_UNITS or not value > 0:
        raise ValueError(f"uplink rate {rate!r}: a number and one of {sorted(_RATE_UNITS)}, "
                         'as tc writes it ("100mbit")')
    return value * _RATE_UNITS[unit]


def _sftp_profile(value: object) -> str:
    profile = {True: "external", False: "none"}.get(value, value)  # type: ignore[call-overload]
    if profile not in SFTP_PROFILES:
        raise ValueError(f"unknown sftp profile {value!r}: one of {SFTP_PROFILES}")
    return str(profile)


def sshd_config(addr: str, hostkey: Path, sftp: str = "external") -> str:
    """A host's sshd_config: what only a testbed needs (its own address and host key, no pid
    file), then Debian's shipped config unchanged but for the sftp profile asked for. sshd keeps
    the first value it reads of a keyword, so nothing below can undo the lines above, and the
    stock file decides everything else (PAM, StrictModes, MaxSessions, MaxStartups...)."""
    stock = STOCK_SSHD_CONFIG.read_text()
    lines = []
    for line in stock.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].lower() == "subsystem" and words[1] == "sftp":
            if sftp == "internal":
                line = "Subsystem\tsftp\tinternal-sftp"
            elif sftp == "none":
                line = "# (testbed profile sftp=none) " + line
        lines.append(line)
    if sftp == "external" and not any(
            ln.split()[:2] == ["Subsystem", "sftp"] for ln in lines if ln.strip()):
        raise RuntimeError(f"{STOCK_SSHD_CONFIG} has no `Subsystem sftp` line to keep")
    head = (f"# fleet testbed: this host's own settings, then {STOCK_SSHD_CONFIG} as shipped\n"
            f"ListenAddress {addr}\nHostKey {hostkey}\nPidFile none\n\n")
    return head + "\n".join(lines) + "\n"


def _with(passwd_line: str, home: Path, shell: str | None) -> str:
    fields = passwd_line.split(":")
    fields[5] = str(home)
    if shell:
        fields[6] = shell
    return ":".join(fields)


def _kept_in_tmp(testbed_dir: Path) -> list[Path]:
    """What stays visible in a host's private /tmp: the testbed's own directory, and the
    software every host runs (this repository and its venv, as installed on every machine of a
    lab), where those live under /tmp (a fresh clone there, as CI may make)."""
    wanted = [testbed_dir, Path(__file__).resolve().parent.parent, Path(sys.prefix).absolute()]
    under = sorted({p for p in wanted if p.is_relative_to("/tmp") and p != Path("/tmp")},
                   key=lambda p: len(p.parts))
    kept: list[Path] = []
    for p in under:
        if not any(p.is_relative_to(k) for k in kept):
            kept.append(p)
    return kept


def _under_root() -> list[str]:
    """The entries of /root that the interpreter, the venv and the repository live in."""
    repo = Path(__file__).resolve().parent.parent
    tops = []
    for p in (os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, str(repo)):
        parts = Path(os.path.realpath(p)).parts
        if len(parts) > 2 and parts[:2] == ("/", "root") and parts[2] not in tops:
            tops.append(parts[2])
    return tops


def _die_with_parent() -> None:
    """In the launcher, before exec: SIGKILL when the thread that made the testbed dies, so
    that a test run killed before close() leaves no host running (--kill-child passes it on
    to the host's init, and the host's PID namespace dies with its init)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            kids.append(int(entry.name))
    return sorted(kids)


def _set_quota(cg: Path, period_us: int, quota_us: int) -> None:
    """A cpu cgroup's period and quota (-1: none): no quota in force while the period changes."""
    (cg / "cpu.cfs_quota_us").write_text("-1")
    (cg / "cpu.cfs_period_us").write_text(str(period_us))
    (cg / "cpu.cfs_quota_us").write_text(str(quota_us))


def cpu_quota_available() -> str | None:
    """Why Testbed.cpu_quota cannot work here, or None if it can."""
    if not (CPU_CGROUP / "cpu.cfs_quota_us").exists():
        return (f"no cgroup v1 cpu controller at {CPU_CGROUP} (cpu.cfs_quota_us): a cgroup v2 "
                "machine has none")
    if not os.access(CPU_CGROUP, os.W_OK):
        return f"{CPU_CGROUP} is not writable (needs root)"
    return None


def _cgroup_mounts() -> list[str]:
    """Boot lines that give a host this machine's /sys/fs/cgroup, as every machine has it
    (`ip netns exec` mounts a fresh /sys, without it): the same hierarchies mounted again, each
    as it is here, and its links (cpu -> cpu,cpuacct). A process of the host then finds the
    cgroup its /proc/self/cgroup names (a quota's cpu.stat, say) where a machine's would."""
    root = "/sys/fs/cgroup"
    mounts = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, options = line.split()[:4]
        if kind in ("cgroup", "cgroup2") and os.path.dirname(where) == root:
            mounts.append((os.path.basename(where), kind, options))
    if not mounts:
        return []
    q = shlex.quote
    lines = [f"mount -t tmpfs -o mode=0755,size=64k tmpfs {root}"]
    for name, kind, options in mounts:
        lines += [f"mkdir {root}/{q(name)}",
                  f"mount -t {kind} -o {q(options)} {kind} {root}/{q(name)}"]
    for entry in os.scandir(root):
        if entry.is_symlink():
            lines.append(f"ln -s {q(os.readlink(entry.path))} {root}/{q(entry.name)}")
    return lines


def _pid_ns_members(init_pid: int) -> list[int]:
    """Global PIDs of every process in the PID namespace whose PID 1 is init_pid (none once it
    is gone): a host's processes, not this machine's launcher or nsenter of it."""
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                    found.append(int(entry.name))
    return found


def _cpu_cgroup_of(pid: int) -> str:
    """The path of `pid`'s cgroup in the cpu controller's hierarchy ("/" where unknown)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                return path
    return "/"


def _procs(cg: Path) -> list[int]:
    try:
        return [int(p) for p in (cg / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _move(pid: int, cg: Path) -> None:
    """Move process `pid` (every thread of it) into cgroup `cg`; one that is gone is left."""
    with contextlib.suppress(ProcessLookupError):
        (cg / "cgroup.procs").write_text(str(pid))


def _move_all(members: Callable[[], set[int]], cg: Path) -> None:
    """Move every process of members() into `cg`, pass after pass until one finds none
    outside it: a process forked while its parent was moved may have been born outside."""
    for _ in range(MOVE_PASSES):
        outside = members() - set(_procs(cg))
        if not outside:
            return
        for pid in outside:
            _move(pid, cg)
    raise RuntimeError(f"processes still outside {cg} after {MOVE_PASSES} passes")


def _remove_cgroup(cg: Path, back: Path) -> None:
    """Move what is still in `cg` (a process born in it while the others were moved out) to
    `back`, then remove it: bounded, and an error if it cannot be."""
    for _ in range(MOVE_PASSES):
        if not cg.exists():
            return
        for pid in _procs(cg):
            _move(pid, back)
        try:
            cg.rmdir()
            return
        except OSError:  # EBUSY: a process was still in it
            time.sleep(0.02)
    raise RuntimeError(f"cgroup {cg} could not be removed: {_procs(cg)} still in it")


def _wait_gone(pid: int, timeout: float) -> None:
    """Until /proc/pid is gone: dead and reaped (bounded)."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


if __name__ == "__main__":
    # A manual session: `python tests/testbed.py 2 [--shell zsh] [--noisy] [--sftp none]
    # [--shared-home] [--ipv6] [--user lab] [--colleague alice ...] [--uplink 100mbit]` keeps a
    # testbed up until Enter.
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="?", default=2)
    ap.add_argument("--shell", default="bash", choices=sorted(SHELLS))
    ap.add_argument("--noisy", action="store_true")
    ap.add_argument("--sftp", default="external", choices=SFTP_PROFILES)
    ap.add_argument("--shared-home", action="store_true")
    ap.add_argument("--ipv6", action="store_true")
    ap.add_argument("--user", default="root")
    ap.add_argument("--colleague", action="append", default=[], help="another login user")
    ap.add_argument("--uplink", help='shape this machine\'s link toward the hosts ("100mbit")')
    a = ap.parse_args()
    with Testbed(a.n, shell=a.shell, noisy=a.noisy, sftp=a.sftp,  # noqa: S604
                 shared_home=a.shared_home, ipv6=a.ipv6, user=a.user,
                 colleagues=tuple(a.colleague), uplink=a.uplink) as tb:
        inv = tb.inventory(tb.dir / "inventory.toml")
        cfg = tb.ssh_config(tb.dir / "ssh_config")
        print(f"inventory: {inv}\nssh -F {cfg} <addr>\n"
              f"hosts: {[(h.name, h.addr) for h in tb.hosts]}")
        input("Enter to tear down> ")
