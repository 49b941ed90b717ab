"""A real multi-host testbed on one machine: each host is a Linux network namespace with its own
IPv4 address, hostname, home directory and OpenSSH sshd (see shared/TESTBED.md).

Everything it creates carries a random tag (namespaces, bridge, veths, subnet, /etc/netns
entries, a temp dir) and is removed on exit, even after a failure: processes by PID first.
Only the addresses of the namespaces it made are ever used.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def available() -> str | None:
    """Why the testbed cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in (SSHD, shutil.which("ip"), shutil.which("ssh-keygen"), shutil.which("unshare")):
        if not tool or not os.path.exists(tool):
            return f"missing {tool or 'a tool'}: run .ci/setup"
    return None


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
    sshd: subprocess.Popen[bytes] | None = None


@dataclass
class Testbed:
    """`with Testbed(2) as tb:` gives hosts node1..nodeN reachable over SSH from here."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    n: int
    ifaces: list[str] | None = None  # interface name inside each host (default eth0)
    decoy: bool = False  # add a docker0-like veth, created before the real one, on each host
    bastion: bool = False  # hosts on an inner network that only a bastion host reaches
    tag: str = field(default_factory=lambda: secrets.token_hex(2))
    hosts: list[TbHost] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"fleet-tb-{self.tag}-"))
        self.bridge = f"fl{self.tag}br"
        self.subnet = self._free_subnet()
        self.gateway = f"{self.subnet}.1"
        # With a bastion, the hosts live on an inner bridge with no address on this machine, so
        # that the bastion (on both bridges, not forwarding) is the only way in.
        self.inner_bridge = f"fl{self.tag}bi" if self.bastion else self.bridge
        self.inner_subnet = self._free_subnet(avoid=self.subnet) if self.bastion else self.subnet
        self.bastion_host: TbHost | None = None
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self._links: list[str] = []
        self._netns: list[str] = []
        self._routes: list[str] = []

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

    def _free_subnet(self, avoid: str = "") -> str:
        used = _run("ip", "-o", "-4", "addr", "show").stdout + _run("ip", "-4", "route").stdout
        for _ in range(200):
            candidate = f"10.213.{secrets.randbelow(250) + 2}"
            if f"{candidate}." not in used and candidate != avoid:
                return candidate
        raise RuntimeError("no free 10.213.x.0/24 subnet for the testbed")

    def _setup(self) -> None:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleet-testbed",
             "-f", str(self.key))
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        if self.bastion:
            # Without this the inner subnet would follow this machine's default route out of
            # it: a test must never send a packet anywhere but to its own namespaces.
            _run("ip", "route", "add", "unreachable", f"{self.inner_subnet}.0/24")
            self._routes.append(f"{self.inner_subnet}.0/24")
            _run("ip", "link", "add", self.inner_bridge, "type", "bridge")
            self._links.append(self.inner_bridge)
            _run("ip", "link", "set", self.inner_bridge, "up")
        for i in range(1, self.n + 1):
            iface = self.ifaces[i - 1] if self.ifaces else "eth0"
            h = TbHost(name=f"node{i}", ns=f"fl{self.tag}h{i}",
                       addr=f"{self.inner_subnet}.{10 + i}", iface=iface,
                       veth=f"fl{self.tag}v{i}", home=self.dir / f"home{i}")
            self.hosts.append(h)
        for h in self.hosts:
            self._make_host(h, self.inner_bridge)
        if self.bastion:
            b = TbHost(name="bastion", ns=f"fl{self.tag}bn", addr=f"{self.subnet}.5",
                       iface="eth0", veth=f"fl{self.tag}vb", home=self.dir / "home-bastion")
            self.bastion_host = b
            self._make_host(b, self.bridge)
            # Its second leg, on the inner network.
            _run("ip", "link", "add", f"fl{self.tag}vc", "type", "veth", "peer", "name", "eth1",
                 "netns", b.ns)
            self._links.append(f"fl{self.tag}vc")
            _run("ip", "link", "set", f"fl{self.tag}vc", "master", self.inner_bridge, "up")
            _run("ip", "-n", b.ns, "addr", "add", f"{self.inner_subnet}.5/24", "dev", "eth1")
            _run("ip", "-n", b.ns, "link", "set", "eth1", "up")
        self._write_known_hosts()
        for h in self.hosts + ([self.bastion_host] if self.bastion_host else []):
            self._wait_ssh(h)

    def _make_host(self, h: TbHost, bridge: str) -> None:
        _run("ip", "netns", "add", h.ns)
        self._netns.append(h.ns)
        if self.decoy:
            # A docker0-like interface that exists first, with a lower ifindex than the real one.
            _run("ip", "link", "add", f"fl{self.tag}d{h.name[4:]}", "type", "veth", "peer",
                 "name", "docker0", "netns", h.ns)
            self._links.append(f"fl{self.tag}d{h.name[4:]}")
            _run("ip", "-n", h.ns, "addr", "add", "172.31.250.1/24", "dev", "docker0")
            _run("ip", "-n", h.ns, "link", "set", "docker0", "up")
        _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", h.iface, "netns", h.ns)
        self._links.append(h.veth)
        _run("ip", "link", "set", h.veth, "master", bridge, "up")
        _run("ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.iface)
        _run("ip", "-n", h.ns, "link", "set", h.iface, "up")
        _run("ip", "-n", h.ns, "link", "set", "lo", "up")
        # /etc/netns/<ns>/* is bind-mounted over /etc/* by `ip netns exec`: hosts, resolver and a
        # passwd whose root home is this host's own directory.
        etc = Path("/etc/netns") / h.ns
        etc.mkdir(parents=True, exist_ok=True)
        others = "".join(f"{o.addr} {o.name}\n" for o in self.hosts if o is not h)
        # The seeds' pain, for real: the host's own name resolves to loopback.
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.0.1 {h.name}\n{others}")
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        passwd = Path("/etc/passwd").read_text().splitlines()
        (etc / "passwd").write_text("".join(
            (_with_home(line, h.home) if line.startswith("root:") else line) + "\n"
            for line in passwd))
        ssh = h.home / ".ssh"
        ssh.mkdir(parents=True, mode=0o700)
        shutil.copy(f"{self.key}.pub", ssh / "authorized_keys")
        hostkey = self.dir / f"hostkey_{h.name}"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(hostkey))
        h.host_key_pub = Path(f"{hostkey}.pub").read_text().split()[1]
        cfg = self.dir / f"sshd_{h.name}.conf"
        cfg.write_text(
            f"Port 22\nListenAddress {h.addr}\nHostKey {hostkey}\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "StrictModes no\nUsePAM no\nPidFile none\nSubsystem sftp internal-sftp\n"
            "MaxStartups 100:30:200\nMaxSessions 100\n")
        log = open(self.dir / f"sshd_{h.name}.log", "wb")  # noqa: SIM115 - kept for the process
        h.sshd = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, "unshare", "--uts", "sh", "-c",
             f'hostname "$0" && exec {SSHD} -D -e -f "$1"', h.name, str(cfg)],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

    def _write_known_hosts(self) -> None:
        every = self.hosts + ([self.bastion_host] if self.bastion_host else [])
        self.known_hosts.write_text("".join(f"{h.addr} ssh-ed25519 {h.host_key_pub}\n"
                                            for h in every))

    def _wait_ssh(self, h: TbHost, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if h.sshd is not None and h.sshd.poll() is not None:
                raise RuntimeError(f"sshd on {h.name} exited: "
                                   f"{(self.dir / f'sshd_{h.name}.log').read_text()}")
            if h.addr.startswith(self.subnet + "."):
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
        for ns in self._netns:
            self.kill_all(ns)
        for h in self.hosts + ([self.bastion_host] if self.bastion_host else []):
            if h.sshd is not None and h.sshd.poll() is None:
                h.sshd.kill()
                h.sshd.wait(timeout=10)
        for ns in self._netns:
            _run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for link in self._links:
            if _run("ip", "link", "show", link, check=False).returncode == 0:
                _run("ip", "link", "del", link, check=False)
        for route in self._routes:
            _run("ip", "route", "del", "unreachable", route, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- looking at a host from the inside ---------------------------------------------------
    def host(self, name: str) -> TbHost:
        every = self.hosts + ([self.bastion_host] if self.bastion_host else [])
        return next(h for h in every if h.name == name)

    def ssh_config(self, path: Path) -> Path:
        """An OpenSSH client config: every host (through the bastion, if any) with the test key
        and known_hosts."""
        lines = []
        if self.bastion_host:
            lines += [f"Host {self.inner_subnet}.*", f"  ProxyJump root@{self.bastion_host.addr}"]
        lines += ["Host *", f"  IdentityFile {self.key}",
                  f"  UserKnownHostsFile {self.known_hosts}", "  User root"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path

    def pids(self, ns: str) -> list[int]:
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
            if f"FLEET_RUN_ID={run_id}".encode() in env:
                found.append(pid)
        return found

    def exec(self, name: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.host(name).ns, *argv],
                              capture_output=True, text=True, timeout=timeout)

    def inventory(self, path: Path, hosts: list[str] | None = None, **defaults: object) -> Path:
        """Write an inventory of these hosts (all, or the named ones, in that order)."""
        values = {"user": "root", "identity": str(self.key), "known_hosts": str(self.known_hosts),
                  "python": sys.executable, "workdir": "~/fleet", "connect_timeout": 5.0,
                  **defaults}
        lines = ["[defaults]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
        for name in hosts or [h.name for h in self.hosts]:
            h = self.host(name)
            lines += ["", "[[hosts]]", f"name = {_toml(h.name)}", f"address = {_toml(h.addr)}"]
        path.write_text("\n".join(lines) + "\n")
        return path


def _with_home(passwd_line: str, home: Path) -> str:
    fields = passwd_line.split(":")
    fields[5] = str(home)
    return ":".join(fields)


def _toml(value: object) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


if __name__ == "__main__":
    # A manual session: `python tests/testbed.py 2` keeps a testbed up until Enter.
    with Testbed(int(sys.argv[1]) if len(sys.argv) > 1 else 2) as tb:
        inv = tb.inventory(tb.dir / "inventory.toml")
        print(f"inventory: {inv}\nhosts: {[(h.name, h.addr) for h in tb.hosts]}")
        input("Enter to tear down> ")
