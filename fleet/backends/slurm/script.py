"""The batch script a Slurm run submits (and `fleet export slurm` prints): one torchrun per node
with the node rank from Slurm, its env and its argv, rendered from templates/sbatch.sh.j2.

Pure: from a job and a cluster's settings to the text of one sbatch script, which fleet submits
itself (`fleet up` on a `[slurm]` inventory) and which `fleet export slurm` prints for users to
submit with plain `sbatch`, fleet not installed. Every string of the job reaches that script as
one shell word built by fleet.shell.quote; the places where a node fills a value in ($SLURM_NODEID
for the node rank, the master's address) are variables, never text spliced into quotes."""

from __future__ import annotations

import string
from dataclasses import dataclass

from fleet.backends.slurm.cluster import LAUNCHERS, Cluster
from fleet.config.inventory import (
    Host,
    load_inventory,
)
from fleet.config.job import Job, RendezvousBackend
from fleet.config.procs import Nproc
from fleet.errors import ConfigError
from fleet.nodeside.shared import nodemap
from fleet.plan import DEBUG_ENV, SECRET_NAME, node_nproc, node_python, socket_env
from fleet.render import environment
from fleet.shell import quote

# What sbatch accepts, kept to what cannot be read as anything else on an #SBATCH line.

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


def nproc(job: Job, cluster: Cluster) -> Nproc:
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
    if job.watchdog.straggler is not None:
        raise ConfigError(job.path, "watchdog.straggler", "the straggler watch is not wired on "
                          "Slurm yet (fleet does not read the ranks' sampling there); leave it "
                          "out, or run the job on a host list")
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
        env[nodemap.DATA_DIR_VAR] = data_dir
    env.update(socket_env(cluster.interface))
    env.update(job.env)
    env.update(cluster.env)
    if job.debug:
        env.update(DEBUG_ENV)
    if run_id:
        env[nodemap.RUN_ID_VAR] = run_id
    if not job.watchdog.sampling:
        env[nodemap.SAMPLING_VAR] = "0"
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
        "map": nodemap,  # where things live on a node, and its variables' names
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
        code_dir = nodemap.code_dir(cluster.workdir, job.slot)
        data_dir = nodemap.data_dir(cluster.workdir, job.data_slot)
    return render(job, cluster, Script(code_dir=code_dir, data_dir=data_dir))
