"""Slurm clusters: the `[slurm]` inventory table, every mistake named by file and key (the batch
script built from a cluster and a job is fleet.backends.slurm.script)."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.config.inventory import (
    ADDRESS,
    IFACE,
    LOCAL_ADDRESSES,
    Host,
    TransportKind,
    load_inventory,
    take_host_key,
)
from fleet.config.job import Job, Launcher
from fleet.config.procs import Nproc, nproc_value
from fleet.config.schema import Table, load_toml
from fleet.errors import ConfigError

# What sbatch accepts, kept to what cannot be read as anything else on an #SBATCH line.
NAME = re.compile(r"[A-Za-z0-9_.,+-]{1,64}\Z")  # partition(s), account, qos
TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}\Z|UNLIMITED\Z|infinite\Z")
GPUS = re.compile(r"([A-Za-z0-9_.-]+:)?\d{1,4}\Z")  # 4, or a type and a count: a100:4
SBATCH_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/%@+=-]+)?\Z")
LAUNCHERS = (Launcher.TORCHRUN,)  # what a Slurm task can start as the job says (check_job)


@dataclass(frozen=True)
class Cluster:
    """Where and how a job runs on Slurm: the allocation it asks for, and (for `fleet up`) the
    login node fleet submits from, which sees the cluster's shared filesystem."""

    path: Path  # the inventory it came from
    login: Host | None  # None: no [slurm] table (an export from a host list)
    nodes: int
    partition: str | None = None
    account: str | None = None
    time: str | None = None  # sbatch --time: minutes, HH:MM:SS, D-HH:MM...
    gpus_per_node: str | None = None
    cpus_per_task: int | None = None
    nproc_per_node: Nproc | None = None  # processes per node (default: the job's)
    python: str = "python3"  # the interpreter on the compute nodes
    workdir: str | None = "~/fleet"  # on the shared filesystem; None: the job's own directory
    interface: str | None = None  # pin the NIC instead of detecting it on each node
    env: dict[str, str] = field(default_factory=dict)
    sbatch_args: tuple[str, ...] = ()  # more #SBATCH options, as --name=value


def is_cluster(path: Path) -> bool:
    """Whether an inventory describes a Slurm cluster (a `[slurm]` table) instead of hosts."""
    return "slurm" in load_toml(path, "inventory")


def load_cluster(path: Path) -> Cluster:
    """A `[slurm]` inventory; every mistake is a ConfigError naming the file and the key."""
    root = Table(path, load_toml(path, "inventory"))
    if root.has("hosts") or root.has("defaults"):
        raise root.error("hosts" if root.has("hosts") else "defaults",
                         "an inventory is either a Slurm cluster ([slurm]) or a host list "
                         "([[hosts]]), not both")
    t = root.table("slurm")
    login_at = t.take("login", str, "localhost")
    if not ADDRESS.match(login_at) or login_at.startswith("-"):
        raise t.error("login", f"{login_at!r} is not a host name or IP address")
    word = t.take("transport", str, "local" if login_at in LOCAL_ADDRESSES else "ssh")
    if word not in {k.value for k in TransportKind}:
        raise t.error("transport", f'must be "ssh" or "local", not {word!r}')
    transport = TransportKind(word)
    port = t.take("port", int, None)
    if port is not None and not 0 < port < 65536:
        raise t.error("port", f"must be between 1 and 65535, not {port}")
    host_key = take_host_key(t)
    workdir = t.take("workdir", str, "~/fleet")
    python = t.take("python", str, "python3")
    for key, value in (("workdir", workdir), ("python", python)):
        if not value.strip() or "\n" in value:
            raise t.error(key, "must be a path")
    login = Host(name="login", address=login_at, transport=transport,
                 user=t.take("user", str, None), port=port,
                 identity=t.take("identity", str, None),
                 known_hosts=t.take("known_hosts", str, None), host_key=host_key,
                 connect_timeout=float(t.take("connect_timeout", float, 10.0)),
                 workdir=workdir, python=sys.executable if transport is TransportKind.LOCAL
                 else python)
    nodes = t.take("nodes", int, 1)
    if nodes < 1:
        raise t.error("nodes", f"must be at least 1, not {nodes}")
    cluster = Cluster(path=path, login=login, nodes=nodes, python=python, workdir=workdir,
                      partition=_name(t, "partition"), account=_name(t, "account"),
                      time=_time(t), gpus_per_node=_gpus(t),
                      cpus_per_task=_positive(t, "cpus_per_task"),
                      nproc_per_node=nproc_value(t, "nproc_per_node")
                      if t.has("nproc_per_node") else None,
                      interface=_iface(t), env=t.take_env("env"),
                      sbatch_args=_sbatch_args(t))
    t.done()
    root.done()
    return cluster


def _name(t: Table, key: str) -> str | None:
    value = t.take(key, str, None)
    if value is not None and not NAME.match(value):
        raise t.error(key, f"{value!r} is not a Slurm name (letters, digits, '_.,+-')")
    return value


def _time(t: Table, key: str = "time") -> str | None:
    if not t.has(key):
        return None
    value = t.data[key]
    if type(value) is int:
        t.take(key, int)
        if value < 1:
            raise t.error(key, "must be at least 1 minute")
        return str(value)
    text = t.take(key, str)
    if not TIME.match(text):
        raise t.error(key, f"{text!r} is not a Slurm time limit (minutes, \"HH:MM:SS\", "
                           "\"D-HH:MM:SS\", \"UNLIMITED\")")
    return text


def _gpus(t: Table, key: str = "gpus_per_node") -> str | None:
    if not t.has(key):
        return None
    value = t.data[key]
    text = str(t.take(key, int)) if type(value) is int else t.take(key, str)
    if not GPUS.match(text) or text.endswith(":0") or text == "0":
        raise t.error(key, f"{text!r} is not a GPU count (4, or a type and a count: "
                           "\"a100:4\")")
    return text


def _positive(t: Table, key: str) -> int | None:
    value = t.take(key, int, None)
    if value is not None and value < 1:
        raise t.error(key, f"must be at least 1, not {value}")
    return value


def _iface(t: Table) -> str | None:
    value = t.take("interface", str, None)
    if value is not None and not IFACE.match(value):
        raise t.error("interface", f"{value!r} is not a network interface name")
    return value


def _sbatch_args(t: Table) -> tuple[str, ...]:
    args = t.take_str_list("sbatch_args", [])
    for i, a in enumerate(args):
        if not SBATCH_OPTION.match(a):
            raise t.error(f"sbatch_args[{i}]", f"{a!r} is not one sbatch option written "
                                               "--name or --name=value (no spaces or quotes)")
    return tuple(args)


def from_hosts(path: Path) -> Cluster:
    """Slurm settings for a host-list inventory: as many nodes as hosts, the master's python
    and pinned interface, the env every host shares, one process per chosen GPU."""
    inv = load_inventory(path)
    hosts = inv.hosts
    first = hosts[0]
    shared_env = {k: v for k, v in first.env.items() if all(h.env.get(k) == v for h in hosts)}
    iface = first.interface if all(h.interface == first.interface for h in hosts) else None
    return Cluster(path=path, login=None, nodes=len(hosts), python=first.python, workdir=None,
                   interface=iface, env=shared_env,
                   gpus_per_node=str(len(first.gpus)) if first.gpus else None)


def cluster_for(path: Path) -> Cluster:
    return load_cluster(path) if is_cluster(path) else from_hosts(path)


def placed(c: Cluster, job: Job) -> Cluster:
    """The cluster's settings with the job's placement instead, where it has one: `nodes` as
    sbatch's node count, `gpus_per_node` as its --gpus-per-node (and, unless the job says
    `nproc_per_node`, one process a GPU: the job's count, over the cluster's)."""
    p = job.placement
    return dataclasses.replace(
        c, nodes=p.nodes if p.nodes is not None else c.nodes,
        gpus_per_node=str(p.gpus_per_node) if p.gpus_per_node is not None else c.gpus_per_node,
        nproc_per_node=None if p.gpus_per_node is not None else c.nproc_per_node)


def with_options(c: Cluster, **options: object) -> Cluster:
    """The cluster's settings with command-line options (those given) instead, each checked as
    the same key of a `[slurm]` table would be."""
    checks: dict[str, Callable[[Table, str], object]] = {
        "partition": _name, "account": _name, "time": _time, "gpus_per_node": _gpus,
        "nodes": _positive}
    checked: dict[str, object] = {}
    for key, value in options.items():
        if value is None:
            continue
        try:
            checked[key] = checks[key](Table(Path("command line"), {key: value}), key)
        except ConfigError as e:
            flag = "--" + key.replace("_", "-")
            raise ConfigError("command line", flag, str(e).split(f"{key}: ", 1)[-1]) from None
    return dataclasses.replace(c, **checked)  # type: ignore[arg-type]


# ---- the script ---------------------------------------------------------------------------
