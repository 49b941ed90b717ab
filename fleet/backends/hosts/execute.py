"""`fleet exec` on the hosts backend: a command on every host of an inventory (or the ones
named) at once, each over its own connection; with a job, in the job's directory there and with
its env. Per host an answer, or why none came: data, never a lost host."""

from __future__ import annotations

import secrets
import shlex

from fleet import waits
from fleet.config import select
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.errors import FleetError
from fleet.facts.command import Outcome, command_script, parse_answer
from fleet.nodeside.shared import nodemap
from fleet.transport import open_transport
from fleet.transport.group import each
from fleet.waits import Pending, named


def chosen(inventory: Inventory, nodes: list[str]) -> list[Host]:
    """Every host of the inventory (spares too: they are hosts a job may come to use), or those
    named, in the inventory's order; a name it does not hold is a UsageError listing them."""
    return select.hosts(inventory, select.Selection(node=tuple(nodes)))


def job_directory(job: Job, host: Host) -> str:
    """The job's directory on the host, as `fleet up` names it (fleet.plan: code/<slot>)."""
    return nodemap.code_dir(host.workdir, job.slot)


def job_env(job: Job, host: Host) -> tuple[dict[str, str], frozenset[str]]:
    """What the job's processes find in their environment on this host that is not of one run
    (fleet.plan's env less the rendezvous, the run's own names and fleet up --debug's): its
    data directory, the GPUs chosen for it, the job's [env], the host's env. Also the names
    whose value is a node path (its ~ the node's home)."""
    env: dict[str, str] = {}
    if job.data_slot:
        env[nodemap.DATA_DIR_VAR] = str(nodemap.data_dir(host.workdir, job.data_slot))
    if host.gpus:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, host.gpus))
    env.update(job.env)
    env.update(host.env)
    ours = job.data_slot and nodemap.DATA_DIR_VAR not in job.env | host.env
    return env, frozenset({nodemap.DATA_DIR_VAR} if ours else ())


def run_on(host: Host, argv: list[str], job: Job | None, timeout: float | None,
           wait: Pending | None = None) -> Outcome:
    """argv on one host: its answer, or Absent where the job's directory is not there (`wait`
    hears its connection, then its command)."""
    directory = job_directory(job, host) if job is not None else "~"
    env, paths = job_env(job, host) if job is not None else ({}, frozenset[str]())
    mark = f"FLEET-EXEC-{secrets.token_hex(8)}"
    wait = wait or Pending("", ())
    wait.start(host.name, "its connection")
    with open_transport(host, hello=False) as t:
        wait.start(host.name, doing(argv))
        r = t.run(command_script(argv, directory, env, mark, paths), timeout=timeout,
                  what=shlex.join(argv))
    answer = parse_answer(r.out, r.err, mark, directory,
                          "`fleet up` of this job puts it there" if job is not None else "")
    if answer is None:
        # The node answered, but its shell ended before the command did (killed, say).
        raise FleetError(f"the command's exit status never came back (the shell running it "
                         f"exited {r.code}: {(r.err or r.out).strip()[-200:] or 'no output'})")
    return answer


def doing(argv: list[str], room: int = 40) -> str:
    """The command as a wait names it, cut to `room` characters (made printable where drawn)."""
    text = shlex.join(argv)
    return f"`{text if len(text) <= room else text[:room - 3] + '...'}`"


def execute(inventory: Inventory, job: Job | None, argv: list[str], nodes: select.Selection,
            timeout: float | None) -> dict[str, Outcome]:
    """argv on the chosen hosts at once; the wait (fleet.waits.over) names the hosts whose
    command has not ended, and what they run."""
    hosts = select.hosts(inventory, nodes)
    with waits.over("the command", (h.name for h in hosts)) as wait:
        return each(named((h.name, h) for h in hosts),
                    wait.tracked(lambda h: run_on(h, argv, job, timeout, wait)))
