"""Pure planning: inventory + job (+ what the probe learnt) -> one plan per node. No I/O."""

from __future__ import annotations

import ipaddress
import re
import secrets
import time
from dataclasses import dataclass, field

from fleet import trackers
from fleet.config.inventory import Host, Inventory, TransportKind
from fleet.config.job import Job, Launcher, RendezvousBackend
from fleet.config.procs import Nproc
from fleet.errors import ConfigError
from fleet.facts.net import NodeNet
from fleet.facts.stacks import FR_PIPE, FR_TRACE
from fleet.nodeside.shared import nodemap

TORCHRUN = ("-m", "torch.distributed.run")


@dataclass(frozen=True)
class NodePlan:
    host: Host
    node_rank: int
    nnodes: int
    nproc: Nproc
    master_addr: str
    master_port: int
    net: NodeNet
    env: dict[str, str]
    argv: tuple[str, ...]
    run_dir: str
    code_dir: str
    data_dir: str | None = None

    python: str = ""  # the interpreter the job runs with here (the job's, else the host's)
    rank_base: int | None = None  # global rank of local rank 0, where fleet can know it
    world_size: int | None = None  # every node's processes, where fleet can know it

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
    # Per node the software its job's interpreter reported (python, torch, cuda, nccl...).
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    # Per node what that interpreter has installed (name==version, as the probe said it).
    packages: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Per node its run lease's file (a placement's: fleet.backends.hosts.placing), which its
    # run.sh and stop.sh remove once the run's processes there ended.
    leases: dict[str, str] = field(default_factory=dict)

    @property
    def master(self) -> NodePlan:
        return self.nodes[0]


def new_run_id(job_name: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{job_name}-{stamp}-{secrets.token_hex(2)}"


def node_nproc(job: Job, host: Host) -> Nproc:
    """How many processes a node runs: the host's own count, else one per GPU chosen for it,
    else the job's."""
    if host.nproc_per_node is not None:
        return host.nproc_per_node
    if host.gpus:
        return len(host.gpus)
    return job.nproc_per_node


def rank_span(base: int | None, nproc: Nproc | None) -> str:
    """The global ranks of a node's processes, "rank 2" or "ranks 2-3"; "" where not known
    before launch."""
    if base is None or not isinstance(nproc, int) or nproc < 1:
        return ""
    return f"rank {base}" if nproc == 1 else f"ranks {base}-{base + nproc - 1}"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def make_plan(inventory: Inventory, job: Job, run_id: str, *, master_addr: str | None = None,
              nets: dict[str, NodeNet] | None = None,
              homes: dict[str, str] | None = None,
              storage: list[list[str]] | None = None,
              has_gpus: dict[str, bool] | None = None, run: str = "") -> Plan:
    """The plan for every node. Without probe facts (a dry run) addresses and interfaces are the
    inventory's own and paths keep their ~. `has_gpus` (from nvidia-smi) decides accelerate's
    mode per node. `run`: the run's id where this is a later attempt of it (run_id the
    attempt's own)."""
    hosts = inventory.hosts
    nets = nets or {}
    homes = homes or {}
    master = hosts[0]
    addr = master_addr or master.address
    if master.transport is TransportKind.LOCAL and len(hosts) == 1:
        addr = "127.0.0.1"
    unknown_master = master_addr is None and addr != "127.0.0.1" and not _is_ip(addr)
    if unknown_master:
        # A dry run must not show a name as the nodes' master address: an ssh alias means
        # nothing to them, and a hostname may resolve to 127.0.x.x there. fleet uses the IP the
        # master is reached at, which only a connection tells.
        addr = f"<IP of {master.name}>"
    counts = [node_nproc(job, h) for h in hosts]
    _check_launcher(inventory, job, counts, has_gpus)
    sizes = [c for c in counts if isinstance(c, int)]
    world = sum(sizes) if len(sizes) == len(counts) else None
    firsts = _first_ranks(counts)
    static = (job.launcher is not Launcher.COMMAND
              and job.rendezvous.backend is RendezvousBackend.STATIC)
    # The ranks a launcher gives: a static rendezvous numbers nodes in inventory order (c10d in
    # the order they join); a command's script numbers them itself.
    bases = firsts if static else [None] * len(hosts)
    notes = []
    if unknown_master:
        notes.append(f"the master address is {addr}: {master.address!r} is a name, and fleet "
                     f"hands the nodes the IP {master.name} is reached at, found when it "
                     "connects (`fleet plan --probe` shows it)")
    if any(b is None for b in bases):
        notes.append("global ranks are known only at launch (c10d numbers nodes as they join; "
                     "a count like \"gpu\" is resolved on the node; a command's script numbers "
                     "its own): fleet reads each worker's RANK to tag its lines")
    if job.launcher is Launcher.ACCELERATE and has_gpus is None:
        notes.append("accelerate runs in GPU mode on nodes with GPUs, CPU mode elsewhere "
                     "(decided at launch from nvidia-smi)")
    nodes = []
    for rank, host in enumerate(hosts):
        net = nets.get(host.name) or NodeNet(host.interface, None,
                                             "pinned in the inventory" if host.interface
                                             else "detected at launch")
        workdir = _expand(host.workdir, homes.get(host.name))
        # One directory per node, even in one run: nodes may share the workdir (an NFS home).
        run_dir = nodemap.run_dir(workdir, run_id, host.name)
        code_dir = nodemap.code_dir(workdir, job.slot)
        data_dir = nodemap.data_dir(workdir, job.data_slot)
        cpu_only = has_gpus is not None and not has_gpus.get(host.name, False)
        python = node_python(job, host, code_dir)
        env = _env(job, host, (run_id, run or run_id), rank, net, run_dir, data_dir, cpu_only)
        values: dict[str, object] = {
            "node_rank": rank, "nnodes": len(hosts), "nproc_per_node": counts[rank],
            "world_size": "" if world is None else world,
            "first_rank": "" if firsts[rank] is None else firsts[rank],
            "master_addr": addr, "master_port": job.rendezvous.port, "run_id": run_id,
            "code_dir": code_dir, "data_dir": data_dir or "", "host": host.name,
            "python": python}
        argv = _argv(job, python, values, net, run_dir, code_dir)
        nodes.append(NodePlan(host=host, node_rank=rank, nnodes=len(hosts), nproc=counts[rank],
                              master_addr=addr, master_port=job.rendezvous.port, net=net,
                              env=env, argv=argv, run_dir=run_dir, code_dir=code_dir,
                              data_dir=data_dir, python=python, rank_base=bases[rank],
                              world_size=world))
    groups = storage or [[h.name] for h in hosts]
    return Plan(run_id=run_id, job=job, inventory=inventory, nodes=tuple(nodes),
                notes=tuple(notes), storage=tuple(tuple(g) for g in groups))


def _check_launcher(inventory: Inventory, job: Job, counts: list[Nproc],
                    has_gpus: dict[str, bool] | None) -> None:
    """What accelerate cannot do, said before anything starts: `accelerate launch` divides
    --num_processes evenly among machines and runs one mode (GPU or CPU) everywhere."""
    if job.launcher is not Launcher.ACCELERATE:
        return
    if job.rendezvous.backend is not RendezvousBackend.STATIC:
        raise ConfigError(job.path, "rendezvous.backend", 'launcher = "accelerate" starts '
                          "with a static rendezvous (machine ranks in inventory order); remove "
                          "the c10d backend")
    words = [f"{h.name} {str(c)!r}" for h, c in zip(inventory.hosts, counts, strict=True)
             if not isinstance(c, int)]
    if words:
        raise ConfigError(inventory.path, "nproc_per_node", 'launcher = "accelerate" needs a '
                          f"number of processes, not a word: {', '.join(words)}")
    if len(set(counts)) > 1:
        runs = ", ".join(f"{h.name} {c}" for h, c in zip(inventory.hosts, counts, strict=True))
        raise ConfigError(inventory.path, "nproc_per_node", 'launcher = "accelerate" needs '
                          "the same number of processes on every node (accelerate launch "
                          f"divides --num_processes evenly); here: {runs}. Use launcher = "
                          '"torchrun", whose nodes may differ')
    if has_gpus and len(set(has_gpus.values())) > 1:
        gpu = sorted(n for n, g in has_gpus.items() if g)
        cpu = sorted(n for n, g in has_gpus.items() if not g)
        raise ConfigError(inventory.path, None, 'launcher = "accelerate" runs one mode '
                          f"everywhere, but {', '.join(gpu)} have GPUs and {', '.join(cpu)} "
                          "have none; run on nodes of one kind")


def _first_ranks(counts: list[Nproc]) -> list[int | None]:
    """The global rank of each node's local rank 0 where the nodes are numbered in inventory
    order: the processes of the nodes before it (torchrun's cumulative sum, so node sizes may
    differ). Unknown where a node's count is a word (gpu, auto) torchrun resolves there."""
    if not all(isinstance(c, int) for c in counts):
        return [None] * len(counts)
    out: list[int | None] = []
    total = 0
    for c in counts:
        out.append(total)
        total += int(c)
    return out


def _expand(path: str, home: str | None) -> str:
    path = path.rstrip("/") or "/"
    if home and (path == "~" or path.startswith("~/")):
        return home.rstrip("/") + path[1:]
    return path


SITE = nodemap.SITE  # in the run directory: fleet's sitecustomize (and the legacy shim)
# `fleet up --debug`: what the seed guides have users export by hand on every node. INIT,NET
# is where multi-node NCCL goes wrong (interfaces, transports, connections); LOGLEVEL=INFO
# makes torchrun print the rendezvous and the ranks it assigned.
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
             "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO",
             "LOGLEVEL": "INFO"}


def flight_recorder_env(run_dir: str) -> dict[str, str]:
    """PyTorch's NCCL flight recorder: a ring of the last collectives per rank, dumped when the
    NCCL watchdog times out and whenever fleet asks through the rank's pipe. Both the current
    names (TORCH_FR_*) and the older ones, for nodes with an older torch."""
    return {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": f"{run_dir}/{FR_TRACE}",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{run_dir}/{FR_TRACE}",
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{run_dir}/{FR_PIPE}"}


def socket_env(interface: str | None) -> dict[str, str]:
    """NCCL's and Gloo's interface, where one is chosen; '=' asks NCCL for this exact interface,
    not every name starting with it."""
    if not interface:
        return {}
    return {"NCCL_SOCKET_IFNAME": f"={interface}", "GLOO_SOCKET_IFNAME": interface}


def _env(job: Job, host: Host, ids: tuple[str, str], rank: int, net: NodeNet, run_dir: str,
         data_dir: str | None, cpu_only: bool) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1"}
    if data_dir:
        env[nodemap.DATA_DIR_VAR] = data_dir
    env.update(socket_env(net.interface))
    if host.gpus:
        # nvidia-smi's numbering, which is the one users see; CUDA's default order differs.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.gpus))
    if job.launcher is Launcher.ACCELERATE and cpu_only:
        env["ACCELERATE_USE_CPU"] = "true"  # --multi_gpu's workers, as MULTI_CPU over Gloo
    if job.watchdog.nccl_flight_recorder:
        env.update(flight_recorder_env(run_dir))
    env.update(trackers.plan_vars(job.restart.tracker, ids[1]))  # a job's own value wins
    env.update(job.env)
    env.update(host.env)
    if job.debug:  # asked for on the command line: wins over the files
        env.update(DEBUG_ENV)
    # fleet finds and stops a run's processes by these; a job cannot override them.
    env.update(nodemap.run_vars(*ids, host.name, rank, run_dir))
    if not job.watchdog.sampling:  # set only where off: a rank samples unless told
        env[nodemap.SAMPLING_VAR] = "0"
    return env


def node_python(job: Job, host: Host, code_dir: str) -> str:
    """The job's interpreter (one its setup makes, say), relative to its directory on the node;
    else the inventory's for the host."""
    if job.python is None:
        return host.python
    return job.python if job.python.startswith(("/", "~")) else f"{code_dir}/{job.python}"


def _argv(job: Job, python: str, values: dict[str, object], net: NodeNet, run_dir: str,
          code_dir: str) -> tuple[str, ...]:
    rdzv = job.rendezvous
    args = [a.format_map(values) for a in job.args]
    if job.launcher is Launcher.COMMAND:
        return tuple(a.format_map(values) for a in job.command) + tuple(args)
    target = ["-m", job.module] if job.module else [f"{code_dir}/{job.script}"]
    logs = [f"{run_dir}/torchrun", "3"]
    if job.launcher is Launcher.ACCELERATE:
        # --multi_gpu is accelerate's torchrun launcher; on a CPU node ACCELERATE_USE_CPU turns
        # its workers into MULTI_CPU ones (without either, each node runs one lone process).
        return (python, "-m", "accelerate.commands.launch", "--multi_gpu",
                "--num_machines", str(values["nnodes"]), "--machine_rank", str(values["node_rank"]),
                "--num_processes", str(values["world_size"]), "--same_network",
                "--main_process_ip", str(values["master_addr"]),
                "--main_process_port", str(rdzv.port), "--rdzv_conf", f"timeout={rdzv.timeout}",
                "--mixed_precision", "no", "--dynamo_backend", "no",
                "--log_dir", logs[0], "--tee", logs[1], *job.launcher_args,
                *(["--module", job.module] if job.module else target), *args)
    argv = [python, *TORCHRUN, "--nnodes", str(values["nnodes"]),
            "--nproc-per-node", str(values["nproc_per_node"])]
    if rdzv.backend is RendezvousBackend.STATIC:
        argv += ["--node-rank", str(values["node_rank"]),
                 "--master-addr", str(values["master_addr"]), "--master-port", str(rdzv.port),
                 "--rdzv-conf", f"timeout={rdzv.timeout}"]
    else:  # c10d numbers nodes as they join: torchrun ignores --node-rank (and says so)
        addr, master = str(values["master_addr"]), int(values["node_rank"] == 0)
        host_part = f"[{addr}]" if ":" in addr else addr
        argv += ["--rdzv-backend", RendezvousBackend.C10D.value,
                 "--rdzv-endpoint", f"{host_part}:{rdzv.port}",
                 "--rdzv-id", str(values["run_id"]),
                 # Say which node hosts the store: torchrun's own guess compares the endpoint
                 # with what the hostname resolves to, which is wrong where it maps to 127.0.x.x.
                 "--rdzv-conf", f"join_timeout={rdzv.timeout},is_host={master}"]
    if net.address:
        argv += ["--local-addr", net.address]
    argv += ["--log-dir", logs[0], "--tee", logs[1], *job.launcher_args]
    if job.launcher is Launcher.LEGACY:
        # torch.distributed.launch (deprecated) is torchrun plus the local rank as an argument;
        # fleet's shim adds that argument from LOCAL_RANK, spelt as the script wants it.
        return (*argv, f"{run_dir}/{SITE}/fleet_local_rank.py", job.local_rank_flag, *target,
                *args)
    return (*argv, *(["--module", job.module] if job.module else target), *args)
