"""A queued run made ready on every host that may run it, before the queue knows where it
will: the code and data synced as `fleet up` syncs them, and per run and host the run's
directory with its rendered scripts (one node of one: torchrun's own rendezvous on the host,
a free port, the GPUs left to the queue's agent) and the start it will be given
(queue-start.sh, fleet/nodeside/start.sh with its arguments). Nothing starts here."""

from __future__ import annotations

import dataclasses

from fleet.backends.hosts.node import start_script
from fleet.backends.hosts.prepare import Session, prepare_plan
from fleet.backends.hosts.upload import upload
from fleet.backends.queueing import Queued
from fleet.config.inventory import Inventory
from fleet.config.job import Job, Launcher, Rendezvous, RendezvousBackend
from fleet.console import Console
from fleet.errors import ConfigError
from fleet.facts.net import NodeNet
from fleet.nodeside.shared.nodemap import RUNS
from fleet.plan import NodePlan, Plan, make_plan
from fleet.render import render_node
from fleet.transport.sync import Entry

START = "queue-start.sh"  # in a staged run's directory: what the agent runs to start it
QUEUED_LAUNCHERS = (Launcher.TORCHRUN, Launcher.LEGACY, Launcher.COMMAND)


def queue_job(job: Job) -> Job:
    """The job as the queue runs it: torchrun's own rendezvous on one host, on a free port
    (two queued runs share a host), whatever the job's [rendezvous] says; refused where it
    cannot run so."""
    if job.placement.nodes not in (None, 1):
        raise ConfigError(job.path, "nodes", "a queued run takes one host (nodes = 1): a run "
                          "across hosts needs every host at once, which only `fleet up` "
                          "arranges; run it with `fleet up`")
    if job.launcher not in QUEUED_LAUNCHERS:
        raise ConfigError(job.path, "launcher", f'launcher = "{job.launcher.value}" is not '
                          "queued yet (torchrun, legacy or command are)")
    if any("{master_port}" in w for w in (*job.command, *job.args)):
        raise ConfigError(job.path, "command", "a queued run shares its host with others: it "
                          "cannot have a fixed port ({master_port}); let the job pick a free "
                          "one (port 0)")
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        if name in job.env:
            raise ConfigError(job.path, f"env.{name}", "the queue chooses a run's GPUs: "
                              "leave it out (set gpus_per_node)")
    return dataclasses.replace(job, rendezvous=Rendezvous(
        RendezvousBackend.C10D, 0, job.rendezvous.timeout))


def host_nodes(plan: Plan, inventory: Inventory, job: Job, run_id: str,
               homes: dict[str, str]) -> tuple[NodePlan, ...]:
    """Each host's node of a run of one node: it is its own master (127.0.0.1), with its
    workdir under its home and no GPUs chosen (the agent names them when it starts)."""
    out = []
    for full in plan.nodes:
        host = dataclasses.replace(full.host, gpus=())
        one = make_plan(dataclasses.replace(inventory, hosts=(host,), spares=()), job, run_id,
                        master_addr="127.0.0.1",
                        nets={host.name: NodeNet(None, None, "one host: loopback")},
                        homes=homes)
        out.append(one.nodes[0])
    return tuple(out)


def stage(session: Session, inventory: Inventory, runs: list[Queued], console: Console
          ) -> tuple[dict[str, list[Entry]], dict[str, str]]:
    """Probe, sync the code and data, write the first run's files; per host, the entries of
    every run's files and start (sent by the caller with the queue's own), and its workdir."""
    first = runs[0]
    plan = prepare_plan(session, inventory, first.job, first.run_id, console)
    homes = {n: t.home for n, t in session.transports.items()}
    staged = dataclasses.replace(plan, nodes=host_nodes(plan, inventory, first.job,
                                                        first.run_id, homes))
    upload(session, staged, console)
    entries: dict[str, list[Entry]] = {n.host.name: [] for n in staged.nodes}
    for q in runs:
        p = dataclasses.replace(staged, run_id=q.run_id, job=q.job,
                                nodes=host_nodes(plan, inventory, q.job, q.run_id, homes))
        for node in p.nodes:
            t = session.transports[node.host.name]
            files = render_node(p, node).files if q is not first else {}
            entries[node.host.name] += [Entry(f"{node.run_dir}/{name}", mode, data=text.encode())
                                        for name, (text, mode) in files.items()]
            start = start_script(node.run_dir, q.run_id, t.path(node.host.python))
            entries[node.host.name].append(Entry(f"{node.run_dir}/{START}", 0o600,
                                                 data=(start + "\n").encode()))
    workdirs = {n.host.name: n.run_dir.rsplit("/" + RUNS + "/", 1)[0] for n in staged.nodes}
    return entries, workdirs

