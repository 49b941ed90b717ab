"""Pure planning: inventory + job (+ what the probe learnt) -> one plan per node. No I/O."""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass, field

from fleet.inventory import Host, Inventory
from fleet.job import Job

TORCHRUN = ("-m", "torch.distributed.run")
LEGACY_LAUNCH = ("-m", "torch.distributed.launch")


@dataclass(frozen=True)
class NodeNet:
    """How one node reaches the master, as detected on the node (or pinned in the inventory)."""

    interface: str | None = None
    address: str | None = None  # this node's own IP (v4 or v6) on that interface
    reason: str = "not detected"


@dataclass(frozen=True)
class NodePlan:
    host: Host
    node_rank: int
    nnodes: int
    nproc: int | str
    master_addr: str
    master_port: int
    net: NodeNet
    env: dict[str, str]
    argv: tuple[str, ...]
    run_dir: str
    code_dir: str
    data_dir: str | None = None

    rank_base: int | None = None  # global rank of local rank 0, where fleet can know it

    def global_rank(self, local_rank: int) -> int | None:
        return None if self.rank_base is None else self.rank_base + local_rank


SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.I)


def masked(env: dict[str, str], secret: tuple[str, ...] = ()) -> dict[str, str]:
    """The env as fleet may print it: values of secret-looking or declared names as ***."""
    return {k: "***" if k in secret or SECRET_NAME.search(k) else v for k, v in env.items()}


@dataclass(frozen=True)
class Plan:
    run_id: str
    job: Job
    inventory: Inventory
    nodes: tuple[NodePlan, ...]
    notes: tuple[str, ...] = field(default=())
    # Nodes grouped by the filesystem under their workdir (from the probe; unknown: one each).
    storage: tuple[tuple[str, ...], ...] = field(default=())

    @property
    def master(self) -> NodePlan:
        return self.nodes[0]


def new_run_id(job_name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{job_name}-{stamp}-{secrets.token_hex(2)}"


def make_plan(inventory: Inventory, job: Job, run_id: str, *, master_addr: str | None = None,
              nets: dict[str, NodeNet] | None = None,
              homes: dict[str, str] | None = None,
              storage: list[list[str]] | None = None) -> Plan:
    """The plan for every node. Without probe facts (a dry run) addresses and interfaces are the
    inventory's own and paths keep their ~."""
    hosts = inventory.hosts
    nets = nets or {}
    homes = homes or {}
    master = hosts[0]
    addr = master_addr or master.address
    if master.transport == "local" and len(hosts) == 1:
        addr = "127.0.0.1"
    notes = []
    if job.rendezvous.backend == "c10d":
        notes.append("c10d rendezvous assigns global ranks itself: logs are tagged by local rank")
    nodes = []
    for rank, host in enumerate(hosts):
        net = nets.get(host.name) or NodeNet(host.interface, None,
                                             "pinned in the inventory" if host.interface
                                             else "detected at launch")
        workdir = _expand(host.workdir, homes.get(host.name))
        # One directory per node, even in one run: nodes may share the workdir (an NFS home).
        run_dir = f"{workdir}/runs/{run_id}/{host.name}"
        code_dir = f"{workdir}/code/{job.name}"
        data_dir = f"{workdir}/data/{job.name}" if job.data else None
        env = _env(job, host, run_id, rank, net, data_dir)
        argv = _argv(job, host, rank, len(hosts), addr, net, run_id, run_dir, code_dir,
                     data_dir)
        nodes.append(NodePlan(host=host, node_rank=rank, nnodes=len(hosts),
                              nproc=job.nproc_per_node, master_addr=addr,
                              master_port=job.rendezvous.port, net=net, env=env, argv=argv,
                              run_dir=run_dir, code_dir=code_dir, data_dir=data_dir,
                              rank_base=_rank_base(job, rank)))
    groups = storage or [[h.name] for h in hosts]
    return Plan(run_id=run_id, job=job, inventory=inventory, nodes=tuple(nodes),
                notes=tuple(notes), storage=tuple(tuple(g) for g in groups))


def _rank_base(job: Job, node_rank: int) -> int | None:
    """Static rendezvous numbers ranks node by node; c10d numbers nodes in the order they join."""
    nproc = job.nproc_per_node
    if job.rendezvous.backend != "static" or not isinstance(nproc, int):
        return None
    return node_rank * nproc


def _expand(path: str, home: str | None) -> str:
    path = path.rstrip("/") or "/"
    if home and (path == "~" or path.startswith("~/")):
        return home.rstrip("/") + path[1:]
    return path


def _env(job: Job, host: Host, run_id: str, rank: int, net: NodeNet,
         data_dir: str | None) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    if data_dir:
        env["FLEET_DATA_DIR"] = data_dir
    if net.interface:
        # '=' asks NCCL for this exact interface, not every name starting with it.
        env["NCCL_SOCKET_IFNAME"] = f"={net.interface}"
        env["GLOO_SOCKET_IFNAME"] = net.interface
    env.update(job.env)
    env.update(host.env)
    # fleet finds and stops a run's processes by these; a job cannot override them.
    env.update(FLEET_RUN_ID=run_id, FLEET_NODE=host.name, FLEET_NODE_RANK=str(rank))
    return env


def _argv(job: Job, host: Host, rank: int, nnodes: int, master_addr: str, net: NodeNet,
          run_id: str, run_dir: str, code_dir: str, data_dir: str | None) -> tuple[str, ...]:
    rdzv = job.rendezvous
    nproc = job.nproc_per_node
    values = {"node_rank": rank, "nnodes": nnodes, "nproc_per_node": nproc,
              "world_size": nnodes * nproc if isinstance(nproc, int) else "",
              "master_addr": master_addr, "master_port": rdzv.port, "run_id": run_id,
              "code_dir": code_dir, "data_dir": data_dir or "", "host": host.name,
              "python": host.python}
    args = [a.format_map(values) for a in job.args]
    if job.launcher == "command":
        return tuple(a.format_map(values) for a in job.command) + tuple(args)
    script = f"{code_dir}/{job.script}"
    if job.launcher == "accelerate":
        return (host.python, "-m", "accelerate.commands.launch", "--num_machines", str(nnodes),
                "--machine_rank", str(rank), "--main_process_ip", master_addr,
                "--main_process_port", str(rdzv.port),
                "--num_processes", str(values["world_size"]), script, *args)
    module = TORCHRUN if job.launcher == "torchrun" else LEGACY_LAUNCH
    argv = [host.python, *module, "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--node-rank", str(rank)]
    if rdzv.backend == "static":
        argv += ["--master-addr", master_addr, "--master-port", str(rdzv.port),
                 "--rdzv-conf", f"timeout={rdzv.timeout}"]
    else:
        host_part = f"[{master_addr}]" if ":" in master_addr else master_addr
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host_part}:{rdzv.port}",
                 "--rdzv-id", run_id,
                 # Say which node hosts the store: torchrun's own guess compares the endpoint
                 # with what the hostname resolves to, which is wrong where it maps to 127.0.x.x.
                 "--rdzv-conf", f"join_timeout={rdzv.timeout},is_host={int(rank == 0)}"]
    if net.address:
        argv += ["--local-addr", net.address]
    argv += ["--log-dir", f"{run_dir}/torchrun", "--tee", "3", script, *args]
    return tuple(argv)
