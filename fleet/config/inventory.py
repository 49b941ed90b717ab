"""The inventory: which hosts a job runs on and how to reach each of them."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from fleet.config.doctor import Bounds, take_bounds
from fleet.config.pinned import parse_pinned
from fleet.config.procs import Nproc, nproc_value
from fleet.config.schema import Table, load_toml

HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")
# An address goes to ssh/paramiko as one argument; refuse anything that could be read as an option
# or that no resolver would accept.
ADDRESS = re.compile(r"[A-Za-z0-9_.:%\[\]-]{1,253}\Z")
IFACE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}\Z")
LOCAL_ADDRESSES = {"localhost", "127.0.0.1", "::1"}


class TransportKind(StrEnum):
    """How fleet reaches a host: over SSH, or this machine itself (fleet.transport's registry
    is keyed by it)."""

    SSH = "ssh"
    LOCAL = "local"


class BackendKind(StrEnum):
    """Which backend runs a job (fleet.backends' registry is keyed by it): the SSH hosts of a
    host list, or a Slurm cluster (an inventory with a `[slurm]` table)."""

    HOSTS = "hosts"
    SLURM = "slurm"


def backend_kind(path: Path) -> BackendKind:
    """The backend an inventory file describes: a `[slurm]` table makes it a cluster."""
    return BackendKind.SLURM if "slurm" in load_toml(path, "inventory") else BackendKind.HOSTS


@dataclass(frozen=True)
class Host:
    """One node of the inventory, with its defaults already applied."""

    name: str
    address: str
    transport: TransportKind = TransportKind.SSH
    user: str | None = None
    port: int | None = None  # None: ssh_config's, else 22
    identity: str | None = None
    known_hosts: str | None = None
    python: str = "python3"
    workdir: str = "~/fleet"
    interface: str | None = None  # pin the NIC for NCCL/Gloo instead of detecting it
    connect_timeout: float = 10.0
    host_key: str | None = None  # pinned: "ssh-ed25519 AAAA...", as in known_hosts
    env: dict[str, str] = field(default_factory=dict)
    nproc_per_node: Nproc | None = None  # overrides the job's on this node
    gpus: tuple[int, ...] | None = None  # GPU indices (nvidia-smi's) the job may use here

    def __post_init__(self) -> None:
        # A host read back from a run record has the transport's word: ValueError if unknown.
        object.__setattr__(self, "transport", TransportKind(self.transport))


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: tuple[Host, ...]
    # `spare = true`: not used at the start; one takes a lost or failed node's place in a
    # restart ([restart] in the job), with that node's rank.
    spares: tuple[Host, ...] = ()
    doctor: Bounds = Bounds()  # `[doctor]`: what fleet doctor calls slow

    @property
    def every_host(self) -> tuple[Host, ...]:
        return self.hosts + self.spares




def _settings(t: Table, base: dict[str, object]) -> dict[str, object]:
    out = dict(base)
    for key in ("user", "identity", "known_hosts", "python", "workdir", "interface", "transport"):
        if t.has(key):
            out[key] = t.take(key, str)
        else:
            t.take(key, str, None)
    if t.has("port"):
        port = t.take("port", int)
        if not 0 < port < 65536:
            raise t.error("port", f"must be between 1 and 65535, not {port}")
        out["port"] = port
    if t.has("connect_timeout"):
        timeout = t.take("connect_timeout", float)
        if timeout <= 0:
            raise t.error("connect_timeout", "must be positive")
        out["connect_timeout"] = float(timeout)
    if "transport" in out:
        if out["transport"] not in {k.value for k in TransportKind}:
            raise t.error("transport", f'must be "ssh" or "local", not {out["transport"]!r}')
        out["transport"] = TransportKind(out["transport"])
    if out.get("interface") is not None and not IFACE.match(str(out["interface"])):
        raise t.error("interface", f"{out['interface']!r} is not a network interface name")
    for key in ("python", "workdir"):
        if key in out and not str(out[key]).strip():
            raise t.error(key, "must not be empty")
    if t.has("nproc_per_node"):
        out["nproc_per_node"] = nproc_value(t, "nproc_per_node")
    if t.has("gpus"):
        out["gpus"] = _gpus(t)
    out["env"] = {**base.get("env", {}), **t.take_env("env")}  # type: ignore[dict-item]
    return out


_GPU_RANGE = re.compile(r"(\d{1,3})(?:-(\d{1,3}))?\Z")


def take_host_key(t: Table) -> str | None:
    """`host_key`: a pinned key as known_hosts writes it ("ssh-ed25519 AAAA..."), checked."""
    host_key = t.take("host_key", str, None)
    if host_key is not None:
        try:
            parse_pinned(host_key)
        except ValueError as e:
            raise t.error("host_key", str(e)) from e
    return host_key


def _gpus(t: Table) -> tuple[int, ...]:
    """GPU indices: a list of integers ([0, 1]) or a string of indices and ranges ("4-7",
    "0,2,5-7"). Indices are nvidia-smi's (fleet sets CUDA_DEVICE_ORDER=PCI_BUS_ID to match)."""
    how = 'a list of GPU indices ([0, 1]) or a string of ranges ("4-7", "0,2,5-7")'
    value = t.data["gpus"]
    t.take("gpus", type(value))
    if isinstance(value, list) and all(type(v) is int for v in value):
        out = list(value)
    elif isinstance(value, str):
        out = []
        for part in value.replace(" ", "").split(","):
            m = _GPU_RANGE.match(part)
            if not m:
                raise t.error("gpus", f"{value!r} is not {how}")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if hi < lo:
                raise t.error("gpus", f"range {part!r} runs backwards")
            out += range(lo, hi + 1)
    else:
        raise t.error("gpus", f"must be {how}")
    if not out:
        raise t.error("gpus", "must name at least one GPU")
    if any(g < 0 for g in out):
        raise t.error("gpus", "GPU indices are 0 or more")
    if len(set(out)) != len(out):
        raise t.error("gpus", f"names a GPU twice: {value!r}")
    return tuple(out)


def load_inventory(path: Path) -> Inventory:
    """Read and check an inventory file; raises ConfigError naming the file and key."""
    root = Table(path, load_toml(path, "inventory"))
    if root.has("slurm"):
        raise root.error("slurm", "this inventory is a Slurm cluster, not a host list: "
                                  "`fleet up`, `check`, `export slurm`, `trust` and the run "
                                  "commands take it; `plan` works on host lists (see `fleet "
                                  "export slurm` for what would be submitted)")
    defaults = root.table("defaults")
    base = _settings(defaults, {})
    defaults.done()
    hosts: list[Host] = []
    spares: list[Host] = []
    seen: dict[str, str] = {}
    for t in root.tables("hosts"):
        name = t.take("name", str)
        if not HOST_NAME.match(name):
            raise t.error("name", f"{name!r} is not a valid host name (letters, digits, '.', "
                                  "'_' and '-', starting with a letter or digit)")
        if name in seen:
            raise t.error("name", f"duplicate host name {name!r} (also {seen[name]})")
        seen[name] = t.key("name")
        address = t.take("address", str)
        if not ADDRESS.match(address) or address.startswith("-"):
            raise t.error("address", f"{address!r} is not a host name or IP address")
        settings = _settings(t, base)
        spare = t.take("spare", bool, False)
        host_key = take_host_key(t)
        if host_key is not None:
            settings["host_key"] = host_key
        t.done()
        settings.setdefault("transport", TransportKind.LOCAL if address in LOCAL_ADDRESSES
                            else TransportKind.SSH)
        if settings["transport"] is TransportKind.LOCAL:
            # This machine: the interpreter fleet itself runs under has what fleet installed.
            settings.setdefault("python", sys.executable)
        host = Host(name=name, address=address, **settings)  # type: ignore[arg-type]
        (spares if spare else hosts).append(host)
    if not hosts:
        raise root.error("hosts", "the inventory lists no hosts" + (
            " but spares (`spare = true`): at least one must run the job" if spares else ""))
    doctor = take_bounds(root.table("doctor"))
    root.done()
    return Inventory(path=path, hosts=tuple(hosts), spares=tuple(spares), doctor=doctor)
