"""`fleet up` on SSH hosts up to the first write: connect and pass the GPU gate (a job that
runs on every host), or, for a job with a placement (`nodes`, `gpus_per_node`), connect to
every host it may use, choose the first that have enough free GPUs (fleet.placing), and take a
run lease on each chosen host's GPUs (all hosts or none): the session then holds those hosts
alone, and gives the leases back when it closes, unless the run goes on detached (its nodes'
run.sh and stop.sh remove them once its processes ended)."""

from __future__ import annotations

import dataclasses
import math
import time

from fleet.backends.base import Options
from fleet.backends.hosts.gpus import POLL_S, gate, lease_on
from fleet.backends.hosts.prepare import Session, connect
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.config.placement import Placement
from fleet.console import Console, Meaning
from fleet.errors import ConfigError, GpusTaken, Interrupted, Unsupported
from fleet.facts.gpus import GpuFacts, gpu_facts
from fleet.facts.leases import MAX_LEASE_S, LeaseOrder, Taken
from fleet.gpuview import span
from fleet.placing import Choice, choose
from fleet.placing import needs as wanted
from fleet.transport import Transport, open_transport
from fleet.transport.group import each, reason
from fleet.waits import named

RACES = 3  # run leases refused (another launch took those GPUs since the look): looks again


def needs(placement: Placement, inventory: Inventory) -> str:
    """What `fleet up` says it runs on: `2 host(s)`, or `1 host with 2 free GPUs, chosen now
    among 2 host(s)`."""
    n = len(inventory.hosts)
    return f"{wanted(placement, n)}, chosen now among {n} host(s)" if placement.partial \
        else f"{n} host(s)"


def planned(job: Job, inventory: Inventory) -> tuple[Inventory, tuple[str, ...]]:
    """What `fleet plan` shows of a placement, which it cannot choose (that is `fleet up`'s, at
    launch): the inventory's first hosts, and a note saying so."""
    if not job.placement.partial:
        return inventory, ()
    check(job, inventory)
    n = job.placement.nodes or len(inventory.hosts)
    return dataclasses.replace(inventory, hosts=inventory.hosts[:n]), (
        f"the hosts and GPUs are chosen at launch: fleet up takes "
        f"{wanted(job.placement, len(inventory.hosts))} (the first that have them, in the "
        f"inventory's order); shown here: the inventory's first {n}",)


def connect_and_gate(inventory: Inventory, job: Job, run_id: str, options: Options,
                     console: Console) -> tuple[Session, Inventory]:
    """The session and the hosts the run uses (each with its GPUs, for a placement)."""
    if not job.placement.partial:
        session = connect(inventory, console)
        try:
            # Before any claim: a launch waiting for GPUs keeps no other launch off these hosts.
            session.gpus = gate(session.transports, list(inventory.hosts), options.wait,
                                options.ignore_leases, console, options.force)
        except BaseException:
            session.close()
            raise
        return session, inventory
    check(job, inventory)
    session = connect_some(inventory, console)
    try:
        chosen = place(session, inventory, job, run_id, options, console)
    except BaseException:
        session.close()
        raise
    return session, chosen


def check(job: Job, inventory: Inventory) -> None:
    """What a placement cannot ask: more hosts than the inventory lets it use; a restart."""
    n, have = job.placement.nodes, len(inventory.hosts)
    if n is not None and n > have:
        raise ConfigError(job.path, "nodes", f"asks for {n} hosts, but the inventory "
                          f"{inventory.path} has {have}"
                          f"{' left by --node/--exclude' if job.selection else ''}: ask for "
                          f"{have} or fewer")
    if job.restart.max:
        raise Unsupported("hosts", "[restart] with `nodes` or `gpus_per_node`",
                          "leave one of them out of the job")


def connect_some(inventory: Inventory, console: Console) -> Session:
    """Connect to every host in parallel; one that cannot be reached is left out, its reason
    kept (session.unreachable): a placement takes the hosts that answer."""
    def one(host: Host) -> Transport:
        t0 = time.monotonic()
        t = open_transport(host, hello=False)
        console.phase(host.name, f"connected ({host.transport}, {time.monotonic() - t0:.2f}s)")
        return t

    with console.hosts_waiting("connect", (h.name for h in inventory.hosts)) as wait:
        results = each(named((h.name, h) for h in inventory.hosts), wait.tracked(one))
    session = Session({n: r for n, r in results.items() if isinstance(r, Transport)})
    session.unreachable = {n: reason(r) for n, r in results.items() if isinstance(r, Exception)}
    return session


def look(session: Session, hosts: list[Host]) -> dict[str, GpuFacts | str]:
    """Per host its GPUs and leases, or why they are not known (unreachable, not answering)."""
    results = each(session.transports.items(), gpu_facts)
    out: dict[str, GpuFacts | str] = {}
    for h in hosts:
        r = results.get(h.name)
        out[h.name] = r if isinstance(r, GpuFacts) else \
            f"unreachable: {session.unreachable.get(h.name, '')}" if r is None else reason(r)
    return out


def refusal(choice: Choice) -> dict[str, str]:
    return dict(choice.why_not) or {"(no host)": "none to choose from"}


def place(session: Session, inventory: Inventory, job: Job, run_id: str, options: Options,
          console: Console) -> Inventory:
    """Choose the hosts and GPUs, waiting for them with --wait, and take their run leases;
    the inventory of the hosts chosen, each with its GPUs and the job's process count."""
    hosts = list(inventory.hosts)
    wait = options.wait
    deadline = time.monotonic() + (wait or 0)
    races = 0
    said, what = "", wanted(job.placement, len(hosts))
    try:
        with console.waiting("choosing hosts and GPUs") as w:
            while True:
                facts = look(session, hosts)
                choice = choose(job.placement, hosts, facts)
                if choice.enough:
                    refused = take(session, inventory, choice, run_id, job)
                    if not refused:
                        break
                    races += 1
                    if races < RACES:
                        continue  # another launch took them since the look: look again
                    races, action, why = 0, f"taking run leases for {choice.needs}", refused
                else:
                    action, why = f"choosing {choice.needs}", refusal(choice)
                if wait is None:
                    raise GpusTaken(f"{action} (fleet up --wait waits for them)", why)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GpusTaken(f"waiting {span(wait)} for {choice.needs}", why)
                words = "; ".join(f"{h}: {x}" for h, x in why.items())
                if words != said:
                    limit = "" if math.isinf(wait) else f" (at most {span(wait)})"
                    console.info(f"waiting for {choice.needs}{limit}: {words}", Meaning.WARN)
                    said = words
                w.update(f"waiting for {choice.needs}")
                time.sleep(min(POLL_S, left))
    except Interrupted as e:
        raise Interrupted(e.signame, f"stopped waiting for {what}") from None
    for host, gpus in choice.chosen:
        console.phase(host, "chosen, " + (f"GPUs {','.join(map(str, gpus))} (run lease taken)"
                                          if gpus else "no GPUs"), Meaning.OK)
    for t in [t for n, t in session.transports.items() if n not in choice.gpus]:
        t.close()
    session.transports = {n: t for n, t in session.transports.items() if n in choice.gpus}
    session.gpus = {n: f for n, f in facts.items()
                    if n in choice.gpus and isinstance(f, GpuFacts)}
    by_name = {h.name: h for h in hosts}
    g = job.placement.gpus_per_node
    placed = tuple(dataclasses.replace(by_name[n], gpus=gpus, nproc_per_node=job.nproc_per_node)
                   if g is not None and gpus else by_name[n] for n, gpus in choice.chosen)
    return dataclasses.replace(inventory, hosts=placed)


def take(session: Session, inventory: Inventory, choice: Choice, run_id: str,
         job: Job) -> dict[str, str]:
    """A run lease on each chosen host's GPUs (hosts without GPUs need none), all or none:
    where one is refused, those taken are dropped. Per host refused, why (none: all taken,
    in session.leases)."""
    by_name = {h.name: h for h in inventory.hosts}
    order = {n: LeaseOrder.take(gpus, MAX_LEASE_S, f"fleet up {job.name}", run_id)
             for n, gpus in choice.chosen if gpus}
    said = each(named(order.items()), lambda o: _take(session, by_name, o))
    taken = {n: r.name for n, r in said.items() if isinstance(r, Taken) and r.ok and r.name}
    session.leases.update(taken)
    refused = {n: _why(r) for n, r in said.items() if n not in taken}
    if refused:
        session.give_back()
    return refused


def _take(session: Session, hosts: dict[str, Host], pair: tuple[str, LeaseOrder]) -> Taken:
    name, order = pair
    return lease_on(session.transports[name], hosts[name], order)


def _why(r: Taken | Exception) -> str:
    if isinstance(r, Exception):
        return reason(r)
    if r.conflicts:
        return "run lease refused: " + "; ".join(
            f"{x.what()} leased by {x.owner}" + (f" for run {x.run}" if x.run else "")
            for x in r.conflicts)
    return f"run lease refused: {r.error or 'no reason given'}"
