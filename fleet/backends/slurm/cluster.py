"""Slurm clusters: the `[slurm]` inventory table, and the job as a standalone sbatch script.

Pure: from a job and a cluster's settings to the text of one sbatch script, which fleet submits
itself (`fleet up` on a `[slurm]` inventory) and which `fleet export slurm` prints for users to
submit with plain `sbatch`, fleet not installed. Every string of the job reaches that script as
one shell word built by fleet.shell.quote; the places where a node fills a value in ($SLURM_NODEID
for the node rank, the master's address) are variables, never text spliced into quotes."""

from __future__ import annotations

import dataclasses
import re
import string
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.config.inventory import (
    ADDRESS,
    IFACE,
    LOCAL_ADDRESSES,
    Host,
    load_inventory,
    take_host_key,
)
from fleet.config.job import Job, Launcher, RendezvousBackend, nproc_value
from fleet.config.schema import Table, load_toml
from fleet.errors import ConfigError
from fleet.plan import DEBUG_ENV, SECRET_NAME, node_nproc, node_python, socket_env
from fleet.render import environment
from fleet.shell import quote

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
    nproc_per_node: int | str | None = None  # processes per node (default: the job's)
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
    transport = t.take("transport", str, "local" if login_at in LOCAL_ADDRESSES else "ssh")
    if transport not in ("ssh", "local"):
        raise t.error("transport", f'must be "ssh" or "local", not {transport!r}')
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
                 workdir=workdir, python=sys.executable if transport == "local" else python)
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
class Word(str):
    """One shell word, already safe: literal parts quoted, node-filled parts as variables."""


def word(*parts: str | tuple[str]) -> Word:
    """A shell word from literal strings (quoted) and 1-tuples naming a shell expression such
    as ("$SLURM_NODEID",) (double-quoted, so it stays one word)."""
    merged: list[str | tuple[str]] = []
    for p in parts:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    out = [f'"{p[0]}"' if isinstance(p, tuple) else quote(p) for p in merged if p]
    return Word("".join(out) or "''")


def path_word(path: str) -> Word:
    """A node path; a leading ~ is the home of whoever runs the job there."""
    if path == "~":
        return word(("$HOME",))
    if path.startswith("~/"):
        return word(("$HOME",), path[1:])
    return word(path)


@dataclass(frozen=True)
class Script:
    """What a rendered sbatch script needs beside the job and the cluster."""

    code_dir: str  # the job's directory on the shared filesystem
    data_dir: str | None = None
    run_dir: str | None = None  # fleet up: per-node logs and exit codes go under it
    run_id: str | None = None  # fleet up: the run's id (FLEET_RUN_ID on every process)
    env_file: str | None = None  # fleet up: the env (secrets too), sourced; else inline


def nproc(job: Job, cluster: Cluster) -> int | str:
    """Processes per node: the cluster's count, else the job's (on a host list, the master's
    own, which check_job made sure every host shares)."""
    if cluster.nproc_per_node is not None:
        return cluster.nproc_per_node
    if cluster.login is None:
        return node_nproc(job, load_inventory(cluster.path).hosts[0])
    return job.nproc_per_node


def check_job(job: Job, cluster: Cluster) -> None:
    """What a Slurm task cannot run as the job says, refused naming the file and key."""
    if job.launcher not in LAUNCHERS:
        raise ConfigError(job.path, "launcher", f'launcher = "{job.launcher.value}" is not '
                          'supported on Slurm yet: only "torchrun" (the task starts torchrun with '
                          "the node rank from SLURM_NODEID); run it on a host list instead")
    if job.watchdog.nccl_flight_recorder:
        raise ConfigError(job.path, "watchdog.nccl_flight_recorder", "the NCCL flight recorder "
                          "is not wired on Slurm yet (its dump files are per node there); "
                          "leave it out, or run the job on a host list")
    if cluster.login is None:
        inv = load_inventory(cluster.path)
        counts = {h.name: node_nproc(job, h) for h in inv.hosts}
        if len(set(counts.values())) > 1:
            runs = ", ".join(f"{n} {c}" for n, c in counts.items())
            raise ConfigError(cluster.path, "nproc_per_node", "Slurm starts the same number of "
                              f"processes on every node; here: {runs}")


def env_of(job: Job, cluster: Cluster, run_id: str | None = None,
           data_dir: str | None = None) -> dict[str, str]:
    """The env every task gets, in the order fleet merges it: fleet's, the job's, the
    cluster's, the debug env; FLEET_RUN_ID (fleet up) last, so nothing overrides it."""
    env = {"PYTHONUNBUFFERED": "1"}
    if data_dir:
        env["FLEET_DATA_DIR"] = data_dir
    env.update(socket_env(cluster.interface))
    env.update(job.env)
    env.update(cluster.env)
    if job.debug:
        env.update(DEBUG_ENV)
    if run_id:
        env["FLEET_RUN_ID"] = run_id
    return env


def secret(job: Job, name: str) -> bool:
    return name in job.secret_env or bool(SECRET_NAME.search(name))


def argv(job: Job, cluster: Cluster, s: Script) -> list[tuple[Word, ...]]:
    """torchrun's command line on one node, its node rank and master filled in there; in groups
    (an option and its value) that the script shows one to a line."""
    n = nproc(job, cluster)
    code = s.code_dir
    python = node_python(job, Host("slurm", "slurm", python=cluster.python), code)
    rdzv = job.rendezvous
    values: dict[str, str | tuple[str]] = {
        "node_rank": ("$SLURM_NODEID",), "nnodes": ("$SLURM_NNODES",),
        "nproc_per_node": str(n), "master_addr": ("$MASTER_ADDR",),
        "master_port": str(rdzv.port), "run_id": s.run_id or ("$SLURM_JOB_ID",),
        "code_dir": code, "data_dir": s.data_dir or "", "host": ("$SLURMD_NODENAME",),
        "python": python,
        "world_size": (f"$((SLURM_NNODES * {n}))",) if isinstance(n, int) else "",
        "first_rank": (f"$((SLURM_NODEID * {n}))",) if isinstance(n, int) else ""}
    out: list[tuple[Word, ...]] = [
        (path_word(python), word("-m"), word("torch.distributed.run")),
        (word("--nnodes"), word(("$SLURM_NNODES",)), word("--nproc-per-node"), word(str(n)))]
    if rdzv.backend == RendezvousBackend.STATIC:
        out += [(word("--node-rank"), word(("$SLURM_NODEID",))),
                (word("--master-addr"), word(("$MASTER_ADDR",)),
                 word("--master-port"), word(str(rdzv.port))),
                (word("--rdzv-conf"), word(f"timeout={rdzv.timeout}"))]
    else:  # c10d numbers nodes as they join; the first node of the allocation hosts the store
        out += [(word("--rdzv-backend"), word(RendezvousBackend.C10D.value),
                 word("--rdzv-endpoint"), word(("$MASTER_ADDR",), f":{rdzv.port}"),
                 word("--rdzv-id"), word(("$SLURM_JOB_ID",))),
                (word("--rdzv-conf"), word(f"join_timeout={rdzv.timeout},is_host=",
                                           ("$is_host",)))]
    # The address this node advertises: its own on the master's network (the name it would
    # send instead may resolve to 127.0.x.x on the others). Nothing where it was not found.
    out.append((Word('${local_addr:+"--local-addr=$local_addr"}'),))
    logs = (word("--log-dir"), word(("$node_dir",), "/torchrun")) if s.run_dir else ()
    out.append((*logs, word("--tee"), word("3"), *(word(a) for a in job.launcher_args)))
    out.append((word("--module"), word(job.module)) if job.module else
               (path_word(f"{code}/{job.script}"),))
    if job.args:
        out.append(tuple(_filled(a, values) for a in job.args))
    return out


def _filled(arg: str, values: dict[str, str | tuple[str]]) -> Word:
    """A job argument with its {placeholders} as the node's values ({{ is a brace)."""
    parts: list[str | tuple[str]] = []
    for literal, name, _, _ in string.Formatter().parse(arg):
        parts.append(literal)
        if name is not None:
            parts.append(values[name])
    return word(*parts)


def render(job: Job, cluster: Cluster, s: Script) -> str:
    """The sbatch script for the job on this cluster."""
    check_job(job, cluster)
    env = env_of(job, cluster, s.run_id, s.data_dir)
    pinned = cluster.interface is not None or "NCCL_SOCKET_IFNAME" in env \
        or "GLOO_SOCKET_IFNAME" in env
    n = nproc(job, cluster)
    ctx = {
        "job": job, "cluster": cluster, "s": s, "nproc": n,
        "inline_env": {k: v for k, v in env.items() if not secret(job, k)},
        "secret_names": [k for k in env if secret(job, k)],
        "pinned": pinned, "argv": " \\\n    ".join(" ".join(g) for g in argv(job, cluster, s)),
        "code_dir": path_word(s.code_dir),
        "run_dir": path_word(s.run_dir) if s.run_dir else None,
        "env_file": path_word(s.env_file) if s.env_file else None,
        "python": path_word(node_python(job, Host("slurm", "slurm", python=cluster.python),
                                        s.code_dir)),
        "world": n * cluster.nodes if isinstance(n, int) else None,
    }
    jinja = environment(job.templates)
    jinja.trim_blocks = jinja.lstrip_blocks = True  # this template's {% %} lines print nothing
    return jinja.get_template("sbatch.sh.j2").render(ctx)


def env_file_text(job: Job, cluster: Cluster, s: Script) -> str:
    """fleet up: the tasks' env as a file (mode 0600: it may hold secrets)."""
    env = env_of(job, cluster, s.run_id, s.data_dir)
    return "".join(f"export {k}={quote(v)}\n" for k, v in env.items())


def export_script(job: Job, cluster: Cluster) -> str:
    """`fleet export slurm`: the script for a user to submit; the code is expected on the
    shared filesystem where `fleet up` would put it (a [slurm] inventory), else at the job's own
    directory (a shared home, or a checkout at the same path)."""
    if cluster.workdir is None:
        code_dir = str(job.workdir)
        data_dir = str(job.data) if job.data else None
    else:
        wd = cluster.workdir.rstrip("/") or "/"
        code_dir = f"{wd}/code/{job.slot}"
        data_dir = f"{wd}/data/{job.data_slot}" if job.data_slot else None
    return render(job, cluster, Script(code_dir=code_dir, data_dir=data_dir))
