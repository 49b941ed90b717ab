"""What fleet learns from each node before it plans, in one round trip (fleet/nodeside/probe.sh
and python_facts.py) plus a pure parser: the node's name, python and torch, its addresses, the
route to the master, and the storage under its workdir (nodes that share an NFS home share it);
for `fleet check`, also torch as it imports, GPUs, names and disk (Health)."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fleet.config.inventory import Host, Inventory, TransportKind
from fleet.config.job import Launcher
from fleet.facts.net import NodeNet
from fleet.facts.run_state import held_script, parse_held
from fleet.nodedata import number
from fleet.nodeside import loader, shell_program
from fleet.shell import Raw, home_word
from fleet.transport import Transport


@dataclass(frozen=True)
class Health:
    """What `fleet check` asks of a node beyond the plan's facts (the probe's `deep` mode: it
    imports torch, which takes seconds)."""

    torch: str = ""  # torch.__version__ as it imports (the wheel's metadata may say otherwise)
    torch_error: str = ""  # why torch would not import, or would not say its CUDA
    torchvision: str = ""
    cuda: str = ""  # torch.version.cuda ("" for a CPU build)
    nccl: str = ""  # torch's NCCL, where a GPU is visible
    gpus: int = 0  # visible to torch
    driver: str = ""  # nvidia-smi's driver version ("" without nvidia-smi)
    gpu_processes: tuple[str, ...] = ()  # nvidia-smi's "pid, name, memory" lines
    resolves: tuple[str, ...] = ()  # what the node's own hostname resolves to, there
    resolve_error: str = ""
    reverse_dns_s: float = 0.0  # how long the reverse lookup of its own address took
    disk_free: int = 0  # bytes free under the workdir (or its nearest existing parent)
    disk_path: str = ""


class PythonState(Enum):
    """What the node's interpreter turned out to be, from the probe's answer."""

    OK = "ok"  # it ran, and torch is installed for it
    NO_TORCH = "no torch"  # it ran, without torch
    MISSING = "missing"  # not found or not runnable (Facts.detail has what the node said)


@dataclass(frozen=True)
class Facts:
    hostname: str
    server_ip: str | None  # the node's address that this SSH connection reached
    addrs: tuple[tuple[str, str], ...]  # (interface, IP) of every address, v4 and v6
    python: PythonState
    python_version: str = ""
    torch_version: str = ""
    accelerate_version: str = ""  # "" where it is not installed
    cuda_version: str = ""  # the CUDA torch was built for ("" for a CPU build)
    nccl_version: str = ""  # the NCCL wheel torch uses, where pip installed one
    storage: str = ""  # id of the filesystem under the workdir ("" unknown)
    route_src: str | None = None  # source address towards the master, when asked
    route_error: str = ""
    detail: str = ""  # why python is missing, as the node said it
    held: tuple[str, ...] = ()  # live fleet runs on this machine ("run-id/node"), where asked
    home: str = ""  # $HOME, and the login shell ($SHELL), as the node says them
    shell: str = ""
    node_time: str = ""  # the node's clock, the script's last act (date +%s.%N)
    health: Health | None = None  # where asked (deep), and the node's python could say it
    packages: tuple[str, ...] = ()  # name==version of what the python has installed (sorted)

    def versions(self) -> dict[str, str]:
        """What a run's manifest keeps of this node's software ("" where absent)."""
        return {"python": self.python_version, "torch": self.torch_version,
                "cuda": self.cuda_version, "nccl": self.nccl_version,
                "accelerate": self.accelerate_version}


def probe_script(python: str, workdir: str, master: str | None = None,
                 create: bool = True, held: bool = False, deep: bool = False) -> str:
    """One round trip (fleet/nodeside/probe.sh): name, home and login shell, SSH address,
    python facts (with `deep`, what `fleet check` asks too), and the workdir's storage id,
    which is created unless `create` is false; with `held`, also the fleet runs still alive on
    the node (run_state.held_script); last, the node's clock. Paths may start with ~ (the
    node's home)."""
    lines = [shell_program("probe.sh", Raw(home_word(python)), loader("python_facts.py"),
                           Raw(home_word(workdir)), master or "",
                           secrets.token_hex(8) if create else "", "deep" if deep else "",
                           python="python_facts.py")]
    if held:
        lines.append(f"(\n{held_script(f'{workdir}/runs')}\n)")  # it exits where none are
    lines.append('printf "now=%s\\n" "$(date +%s.%N)"')  # the last act: see clock_offset
    return "\n".join(lines)


def parse_probe(out: str) -> Facts:
    fields: dict[str, str] = {}
    other: list[str] = []
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("hostname", "home", "shell", "ssh", "py", "storage", "now"):
            fields[key] = value
        elif sep and key in ("me", "run"):
            continue  # the held listing: parse_held reads it
        elif line.strip():
            other.append(line)
    ssh = fields.get("ssh", "").split()
    server_ip = ssh[2] if len(ssh) >= 3 else None
    py: dict[str, Any] = {}
    try:
        said = json.loads(fields.get("py", "")) if fields.get("py") else {}
        py = said if isinstance(said, dict) else {}
    except ValueError:
        py = {}
    python = (PythonState.OK if py.get("has_torch") else PythonState.NO_TORCH if py
              else PythonState.MISSING)
    addrs = tuple((str(a[0]), str(a[1]).split("%")[0])
                  for a in py.get("addrs", []) if isinstance(a, list) and len(a) == 2)
    return Facts(hostname=fields.get("hostname", ""), server_ip=server_ip, addrs=addrs,
                 python=python, python_version=str(py.get("python", "")),
                 torch_version=str(py.get("torch", "")),
                 accelerate_version=str(py.get("accelerate", "")),
                 cuda_version=str(py.get("cuda", "")), nccl_version=str(py.get("nccl", "")),
                 storage=fields.get("storage", "").strip(),
                 route_src=str(py["route_src"]) if py.get("route_src") else None,
                 route_error=str(py.get("route_error", "")),
                 detail="\n".join(other[-3:]), held=tuple(parse_held(out)),
                 home=fields.get("home", ""), shell=fields.get("shell", ""),
                 node_time=fields.get("now", ""), health=parse_health(py.get("check")),
                 packages=parse_packages(py.get("packages")))


PACKAGES_MAX = 20_000  # a node's list, kept in the run's manifest
PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}==[!-~]{1,100}")  # printable, no space


def parse_packages(said: object) -> tuple[str, ...]:
    """python_facts.py's "packages": `name==version` texts; anything else a node says there is
    dropped (it reaches the manifest and the terminal)."""
    if not isinstance(said, list):
        return ()
    return tuple(p for p in said[:PACKAGES_MAX] if isinstance(p, str) and PACKAGE.fullmatch(p))


def parse_health(said: object) -> Health | None:
    """The deep probe's "check" (python_facts.py); None where the node's python gave none."""
    if not isinstance(said, dict):
        return None

    def text(key: str) -> str:
        return str(said.get(key) or "")

    def texts(key: str) -> tuple[str, ...]:
        value = said.get(key)
        return tuple(str(v) for v in value) if isinstance(value, list) else ()

    rdns = said.get("reverse_dns_s")
    return Health(torch=text("torch"), torch_error=text("torch_error"),
                  torchvision=text("torchvision"), cuda=text("cuda"), nccl=text("nccl"),
                  gpus=number(str(said.get("gpus")), 1 << 16) or 0, driver=text("driver"),
                  gpu_processes=texts("gpu_processes"), resolves=texts("hostname_resolves"),
                  resolve_error=text("hostname_error"),
                  reverse_dns_s=float(rdns) if isinstance(rdns, (int, float)) else 0.0,
                  disk_free=number(str(said.get("disk_free"))) or 0,
                  disk_path=text("disk_path"))


def probe(t: Transport, master: str | None = None, create: bool = True,
          python: str | None = None, held: bool = False, deep: bool = False) -> Facts:
    """The node's facts, its python's from `python` where given (a job's own interpreter), with
    `deep` what `fleet check` asks too (Facts.health). The transport learns the node's home,
    login shell, rc noise and clock from it (the hello a connection skipped)."""
    sent = time.time()
    r = t.run(probe_script(python or t.host.python, t.host.workdir, master, create, held, deep),
              timeout=120 if deep else 60, what="probe")
    # It ends with a printf: a failure means the login shell could not run it at all.
    facts = parse_probe(r.check(t.host.name).out)
    if facts.home:
        t.learnt(facts.home, facts.shell, r.noise, facts.node_time, sent, time.time())
    return facts


def python_problem(host: Host, facts: Facts, launcher: Launcher = Launcher.TORCHRUN,
                   needs_torch: bool = True) -> str | None:
    """Why this python cannot run the job; `needs_torch` false where it only probes (the job
    runs with an interpreter its setup makes)."""
    if facts.python is PythonState.NO_TORCH and not needs_torch:
        return None
    if facts.python is PythonState.OK:
        if not needs_torch:
            return None
        if launcher == Launcher.ACCELERATE and not facts.accelerate_version:
            return (f"{host.python} has no accelerate (launcher = \"accelerate\"); install it "
                    "there (pip install accelerate) or set `python` in the inventory")
        return None
    if facts.python is PythonState.NO_TORCH:
        return f"{host.python} has no torch; install it there or set `python` in the inventory"
    said = f" ({facts.detail.strip()})" if facts.detail.strip() else ""
    return (f"python {host.python!r} not found or not runnable{said}; set `python` for this "
            "host in the inventory (full path to the venv's python)")


def _ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not text:
        return None
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return ip.ipv4_mapped
    return ip


def literal_address(address: str) -> str | None:
    """The inventory address as an IP other nodes can use, if it is one (not loopback)."""
    ip = _ip(address)
    return str(ip) if ip is not None and not ip.is_loopback else None


def master_address(inventory: Inventory, facts: Facts | None) -> str:
    """An IP the workers can reach: never a name that might resolve to loopback on a node
    (this machine alone: loopback itself)."""
    master = inventory.hosts[0]
    if master.transport is TransportKind.LOCAL and len(inventory.hosts) == 1:
        return "127.0.0.1"
    literal = literal_address(master.address)
    if literal:
        return literal
    seen = _ip(facts.server_ip) if facts else None
    if seen is not None and not seen.is_loopback:
        return str(seen)
    return master.address


def net_for(host: Host, facts: Facts, master_ip: str) -> NodeNet:
    """The interface and source address this node uses to reach the master (pure: from the
    probe's addresses and the kernel's chosen source address)."""
    if host.interface:
        own = [ip for dev, ip in facts.addrs if dev == host.interface and _usable(ip, master_ip)]
        return NodeNet(host.interface, own[0] if own else None, "pinned in the inventory")
    target = _ip(master_ip)
    if target is not None and target.is_loopback:
        return NodeNet(None, None, "master is this machine (loopback)")
    holding = [dev for dev, ip in facts.addrs if target is not None and _ip(ip) == target]
    if holding:
        return NodeNet(holding[0], str(target), f"holds the master address {master_ip}")
    if target is None:
        return NodeNet(None, None, f"master address {master_ip!r} is not an IP address")
    src = _ip(facts.route_src)
    if src is None:
        raise RuntimeError(f"no route to the master address {master_ip}: "
                           f"{facts.route_error or 'the node could not tell'}")
    if src.is_loopback:
        return NodeNet(None, None, "master is this machine (loopback)")
    devs = [dev for dev, ip in facts.addrs if _ip(ip) == src]
    if not devs:
        return NodeNet(None, str(src), f"source address {src} is on no interface found")
    return NodeNet(devs[0], str(src), f"route to the master {master_ip} leaves through it")


def _usable(ip: str, master_ip: str) -> bool:
    """An address of the master's family, and not link-local (those need a scope)."""
    a, m = _ip(ip), _ip(master_ip)
    return a is not None and (m is None or a.version == m.version) and not a.is_link_local


def storage_groups(facts: dict[str, Facts]) -> list[list[str]]:
    """Nodes grouped by the storage under their workdir, in the order given: nodes in one group
    see the same files (one sync serves them all). Unknown storage is a group of its own."""
    groups: dict[str, list[str]] = {}
    for name, f in facts.items():
        groups.setdefault(f.storage or f"?{name}", []).append(name)
    return list(groups.values())
