"""What fleet learns from each node before it plans, as commands plus pure parsers: the node's
name, python and torch, its addresses, the route to the master, and the storage under its
workdir (nodes that share an NFS home share it)."""

from __future__ import annotations

import ipaddress
import json
import secrets
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fleet.backends.hosts.node import held_script, parse_held
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Launcher
from fleet.plan import NodeNet
from fleet.shell import home_word, quote
from fleet.transport import Transport

# Runs with the node's python: versions without importing torch (seconds saved per node), every
# address of every interface (getifaddrs through ctypes: no `ip` needed, IPv6 included), and
# the source address the kernel would use towards the master (a UDP connect sends nothing).
_PY = r'''
import ctypes, ctypes.util, importlib.util, json, socket, sys
out = {"python": sys.version.split()[0], "torch": "", "has_torch": False, "addrs": []}
try:
    out["has_torch"] = importlib.util.find_spec("torch") is not None
    from importlib.metadata import version
    out["torch"] = version("torch")
except Exception:
    pass
try:
    out["accelerate"] = version("accelerate")
except Exception:
    pass
import glob, os
for key, pattern in (("nccl", "nvidia_nccl_cu*-*.dist-info"),
                     ("cuda", "nvidia_cuda_runtime*-*.dist-info")):
    for d in sys.path:
        found = glob.glob(os.path.join(d or ".", pattern))
        if found:
            out[key] = os.path.basename(found[0])[:-len(".dist-info")].split("-")[1]
            break
class SA(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 26)]
class IFA(ctypes.Structure):
    pass
IFA._fields_ = [("next", ctypes.POINTER(IFA)), ("name", ctypes.c_char_p),
                ("flags", ctypes.c_uint), ("addr", ctypes.POINTER(SA)),
                ("netmask", ctypes.POINTER(SA)), ("dst", ctypes.c_void_p),
                ("data", ctypes.c_void_p)]
try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    head = ctypes.POINTER(IFA)()
    if libc.getifaddrs(ctypes.byref(head)) == 0:
        p = head
        while p:
            a = p.contents.addr
            if a and a.contents.family in (socket.AF_INET, socket.AF_INET6):
                fam = a.contents.family
                raw = bytes(a.contents.data)
                ip = socket.inet_ntop(fam, raw[2:6] if fam == socket.AF_INET else raw[6:22])
                out["addrs"].append([p.contents.name.decode(), ip])
            p = p.contents.next
        libc.freeifaddrs(head)
except Exception as e:
    out["addrs_error"] = str(e)
if len(sys.argv) > 1 and sys.argv[1]:
    dest = sys.argv[1]
    try:
        s = socket.socket(socket.AF_INET6 if ":" in dest else socket.AF_INET, socket.SOCK_DGRAM)
        s.connect((dest, 9))
        out["route_src"] = s.getsockname()[0]
    except OSError as e:
        out["route_error"] = str(e)
print("py=" + json.dumps(out))
'''


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

    def versions(self) -> dict[str, str]:
        """What a run's manifest keeps of this node's software ("" where absent)."""
        return {"python": self.python_version, "torch": self.torch_version,
                "cuda": self.cuda_version, "nccl": self.nccl_version,
                "accelerate": self.accelerate_version}


def probe_script(python: str, workdir: str, master: str | None = None,
                 create: bool = True, held: bool = False) -> str:
    """One round trip: name, home and login shell, SSH address, python facts, and the workdir's
    storage id, which is created (atomically, NFS-safe: a hard link fails if it exists) unless
    `create` is false; with `held`, also the fleet runs still alive on the node
    (remote.held_script); last, the node's clock. Paths may start with ~ (the node's home)."""
    wd = home_word(workdir)
    lines = [
        'printf "hostname=%s\\n" "$(cat /proc/sys/kernel/hostname 2>/dev/null || hostname)"',
        'printf "home=%s\\nshell=%s\\n" "$HOME" "${SHELL:-}"',
        'printf "ssh=%s\\n" "${SSH_CONNECTION:-}"',
        f"{home_word(python)} -c {quote(_PY)} {quote(master or '')} 2>&1",
    ]
    f = f"{wd}/.fleet-storage"
    if create:
        new = secrets.token_hex(8)
        lines += [f"mkdir -p {wd} 2>/dev/null",
                  f"[ -s {f} ] || {{ printf '%s\\n' {new} > {f}.{new} && ln {f}.{new} {f}; "
                  f"rm -f {f}.{new}; }} 2>/dev/null"]
    lines.append(f'printf "storage=%s\\n" "$(cat {f} 2>/dev/null)"')
    if held:
        lines.append(f"( {held_script(f'{workdir}/runs')} )")
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
        py = json.loads(fields.get("py", "")) if fields.get("py") else {}
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
                 node_time=fields.get("now", ""))


def probe(t: Transport, master: str | None = None, create: bool = True,
          python: str | None = None, held: bool = False) -> Facts:
    """The node's facts, its python's from `python` where given (a job's own interpreter). The
    transport learns the node's home, login shell, rc noise and clock from it (the hello a
    connection skipped)."""
    sent = time.time()
    r = t.run(probe_script(python or t.host.python, t.host.workdir, master, create, held),
              timeout=60, what="probe")
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
    if master.transport == "local" and len(inventory.hosts) == 1:
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
