"""What fleet learns from each node before it plans: python, and the route to the master."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from fleet.inventory import Host, Inventory
from fleet.plan import NodeNet
from fleet.shell import Raw, quote, sh
from fleet.transport import Transport

_HAS_TORCH = ("import importlib.util as u, sys; "
              "sys.exit(0 if u.find_spec('torch') else 3)")


@dataclass(frozen=True)
class Facts:
    hostname: str
    server_ip: str | None  # the node's address that this SSH connection reached
    addrs: tuple[tuple[str, str], ...]  # (interface, IPv4) of every global address
    python: str  # "ok", "missing", or "no torch"


def probe(t: Transport) -> Facts:
    py = quote(t.host.python)
    script = "; ".join([
        'printf "hostname=%s\\n" "$(hostname)"',
        'printf "ssh=%s\\n" "${SSH_CONNECTION:-}"',
        f"{py} -c {quote(_HAS_TORCH)} >/dev/null 2>&1; printf 'python=%s\\n' $?",
        "command -v ip >/dev/null 2>&1 && ip -o -4 addr show scope global | sed 's/^/addr=/'",
        "true",
    ])
    r = t.run(script, timeout=30)
    hostname, server_ip, python, addrs = "", None, "missing", []
    for line in r.out.splitlines():
        key, _, value = line.partition("=")
        if key == "hostname":
            hostname = value
        elif key == "ssh" and value:
            fields = value.split()
            server_ip = fields[2] if len(fields) >= 3 else None
        elif key == "python":
            python = {"0": "ok", "3": "no torch"}.get(value, "missing")
        elif key == "addr":
            m = re.match(r"\d+:\s+(\S+)\s+inet\s+([\d.]+)/", value)
            if m:
                addrs.append((m.group(1), m.group(2)))
    return Facts(hostname, server_ip, tuple(addrs), python)


def python_problem(host: Host, facts: Facts) -> str | None:
    if facts.python == "ok":
        return None
    if facts.python == "no torch":
        return f"{host.python} has no torch; install it there or set `python` in the inventory"
    return (f"python {host.python!r} not found or not runnable; set `python` for this host in "
            "the inventory (full path to the venv's python)")


def master_address(inventory: Inventory, facts: Facts) -> str:
    """An IP the workers can reach: never a name that might resolve to loopback on a node
    (this machine alone: loopback itself)."""
    master = inventory.hosts[0]
    if master.transport == "local" and len(inventory.hosts) == 1:
        return "127.0.0.1"
    if _is_ipv4(master.address) and not ipaddress.ip_address(master.address).is_loopback:
        return master.address
    if facts.server_ip and _is_ipv4(facts.server_ip) and \
            not ipaddress.ip_address(facts.server_ip).is_loopback:
        return facts.server_ip
    return master.address


def route_to(t: Transport, facts: Facts, master_ip: str) -> NodeNet:
    """The interface and source address this node uses to reach the master."""
    if t.host.interface:
        own = [ip for dev, ip in facts.addrs if dev == t.host.interface]
        return NodeNet(t.host.interface, own[0] if own else None, "pinned in the inventory")
    holding = [dev for dev, ip in facts.addrs if ip == master_ip]
    if holding:
        return NodeNet(holding[0], master_ip, f"holds the master address {master_ip}")
    if not _is_ipv4(master_ip):
        return NodeNet(None, None, f"master address {master_ip!r} is not an IPv4 address")
    r = t.run(sh("ip", "-o", "-4", "route", "get", master_ip) + " " + Raw("2>&1"), timeout=15)
    dev = re.search(r"\bdev (\S+)", r.out)
    src = re.search(r"\bsrc ([\d.]+)", r.out)
    if not r.ok or not dev:
        raise RuntimeError(f"no route to the master address {master_ip}: {r.out.strip()}")
    if dev.group(1) == "lo":
        return NodeNet(None, None, "master is this machine (loopback)")
    return NodeNet(dev.group(1), src.group(1) if src else None,
                   f"route to the master {master_ip} leaves through it")


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False
