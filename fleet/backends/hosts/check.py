"""`fleet check` on a host list: per host and check, pass / warn / fail with the fix, before
anything runs. One deep probe per node (fleet.facts.probe) says what the checks judge; each
host's own checks run apart, so that a person can be told how many hosts are done."""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.backends.checks import Check, Status, connection_checks, ssh_failed
from fleet.backends.hosts.ports import port_checks
from fleet.config.inventory import Host, Inventory
from fleet.config.job import DEFAULT_EXCLUDE, Job
from fleet.config.procs import Nproc, Procs
from fleet.errors import FleetError
from fleet.facts.gpus import GpuFacts, absent, busy, gpu_facts
from fleet.facts.net import NodeNet
from fleet.facts.probe import Facts, Health, master_address, net_for, probe, storage_groups
from fleet.gpuview import lease_blockers
from fleet.plan import node_nproc
from fleet.shell import sh
from fleet.transport import Transport, open_transport
from fleet.transport.group import each, reason
from fleet.waits import Pending, Words

CLOCK_SKEW_WARN_S = 2.0
DISK_WARN_BYTES = 10 << 30
DISK_FAIL_BYTES = 1 << 30
REVERSE_DNS_WARN_S = 1.0


def _quiet(_: Words) -> None:
    """No one watches the checks' progress."""


@dataclass
class _Own:
    """One host's own checks (those that need no other host's answer), and what later ones
    need of it."""

    conn: list[Check] = field(default_factory=list)
    probe: list[Check] = field(default_factory=list)
    python: list[Check] = field(default_factory=list)
    rest: list[Check] = field(default_factory=list)
    facts: Facts | None = None
    net: NodeNet | Exception | None = None


class _MasterIP:
    """The master's address, found by the master's own checks; the others wait for it (None:
    it could not be found, and their checks end with their connection)."""

    def __init__(self) -> None:
        self._set = threading.Event()
        self.value: str | None = None

    def give(self, value: str | None) -> None:
        if not self._set.is_set():
            self.value = value
            self._set.set()

    def wait(self) -> str | None:
        self._set.wait()
        return self.value


def run_checks(inventory: Inventory, job: Job, progress: Callable[[Words], None] = _quiet,
               trust: str = "fleet trust INVENTORY") -> list[Check]:
    """Every check of every host. Each host's own checks run apart, all at once (`progress`
    is given words that say, each time they are drawn, how many hosts are done and, once it
    is slow, which host is on which check); then what compares or connects the hosts. `trust`
    is the command that trusts the user's own file, for the advice on an unknown key."""
    hosts = {h.name: h for h in inventory.every_host}  # spares too: a spare must be fit
    master = inventory.hosts[0]
    session: dict[str, Transport] = {}
    master_ip = _MasterIP()
    tally = Pending("check", hosts)
    tally.changed = lambda: progress(tally.words)  # drawn at once, not at the next redraw
    progress(tally.words)

    def own(h: Host) -> _Own:
        try:
            return _own_checks(h, inventory, master_ip, session, job, trust,
                               functools.partial(tally.start, h.name))
        finally:
            if h is master:
                master_ip.give(None)  # the others never wait for good
            tally.finish(h.name)

    try:
        found = each(((h.name, h) for h in inventory.every_host), own)
        ours = {n: r for n, r in found.items() if isinstance(r, _Own)}
        checks = [c for o in ours.values() for c in o.conn + o.probe]
        checks += [Check(n, "checks", Status.FAIL, reason(r))
                   for n, r in found.items() if isinstance(r, Exception)]
        ip = master_ip.value
        if ip is None:
            return marked(inventory, checks)
        facts = {n: o.facts for n, o in ours.items() if o.facts is not None}
        checks += _storage_checks(facts)
        checks += [c for o in ours.values() for c in o.python]
        checks += _version_checks({n: (f, f.health) for n, f in facts.items()
                                   if f.health is not None}, master.name)
        checks += [c for o in ours.values() for c in o.rest]
        if all(n in session for n in hosts):
            progress(f"checking port {job.rendezvous.port} between the hosts")

            def own_ip(name: str) -> str:
                net = ours[name].net if name in ours else None
                return (net.address if isinstance(net, NodeNet) else None) or hosts[name].address

            checks += port_checks(session, master, ip, job.rendezvous.port,
                                  {n: own_ip(n) for n in session})
    finally:
        for t in list(session.values()):
            t.close()
    return marked(inventory, checks)


def marked(inventory: Inventory, checks: list[Check]) -> list[Check]:
    """A spare's rows say so by its name (`node3 (spare)`)."""
    spares = {h.name for h in inventory.spares}
    return [dataclasses.replace(c, host=f"{c.host} (spare)") if c.host in spares else c
            for c in checks]


def _own_checks(h: Host, inventory: Inventory, master_ip: _MasterIP,
                session: dict[str, Transport], job: Job, trust: str,
                on: Callable[[str], None] = _quiet) -> _Own:
    """Connection, probe, python, GPUs, names, clock, disk, write and interface of one host
    (`on` hears which of them it is on)."""
    out, count = _Own(), len(inventory.hosts)
    on("the ssh connection")
    try:
        t = open_transport(h)
    except Exception as e:  # noqa: BLE001 - a host fleet cannot reach is a row, not a crash
        out.conn.append(ssh_failed(h, e, trust))
        return out
    session[h.name] = t
    out.conn = connection_checks(t)
    if h is inventory.hosts[0]:
        on("the probe for the master's address")
        try:
            master_ip.give(master_address(inventory, probe(t, None)))
        except FleetError as e:
            out.probe.append(Check(h.name, "probe", Status.FAIL, str(e)))
            return out
    on(f"the master's address (from {inventory.hosts[0].name})")
    ip = master_ip.wait()
    if ip is None:
        return out
    on("the probe")
    try:
        out.facts = probe(t, ip, deep=True)
    except Exception as e:  # noqa: BLE001 - the probe's failure is this host's row
        out.probe.append(Check(h.name, "probe", Status.FAIL, reason(e)))
    on("the GPU query")
    try:
        g: GpuFacts | Exception = gpu_facts(t)
    except Exception as e:  # noqa: BLE001 - said as a warning by the check
        g = e
    if h.gpus:
        out.rest.append(_chosen_gpu_check(h, g))
    if isinstance(g, GpuFacts):
        out.rest.append(_lease_check(h, g))
    f = out.facts
    if f is None:
        return out
    on("the route to the master")
    try:
        out.net = net_for(h, f, ip)
    except RuntimeError as e:
        out.net = e
    if f.health is None:
        said = f.detail.strip().splitlines()
        out.python.append(Check(h.name, "python", Status.FAIL,
                                said[-1] if said else f"{h.python} said nothing",
                                f"set `python` for {h.name} in the inventory to an interpreter "
                                "with torch (the venv's full path)"))
        return out
    out.rest += _node_checks(h.name, f.hostname, f.health, t.clock_offset, node_nproc(job, h),
                             alone=count == 1, chosen=bool(h.gpus))
    on("the write test")
    out.rest.append(_write_check(t))
    if isinstance(out.net, NodeNet):
        out.rest.append(Check(h.name, "interface", Status.PASS if out.net.interface or count == 1
                              else Status.WARN, f"{out.net.interface or '-'} ({out.net.reason})"))
    elif out.net is not None:
        out.rest.append(Check(h.name, "interface", Status.FAIL, reason(out.net),
                              "the node has no route to the master's address"))
    return out


def _storage_checks(facts: dict[str, Facts]) -> list[Check]:
    out = []
    for group in storage_groups(facts):
        for name in group:
            others = [n for n in group if n != name]
            out.append(Check(name, "storage", Status.PASS,
                             f"workdir shared with {', '.join(others)}: synced once, run "
                             "directories apart" if others else "workdir on its own storage"))
    return out


def _write_check(t: Transport) -> Check:
    """Write (verified) and remove a 1 MiB file in the workdir: a full disk or quota fails."""
    path = f"{t.path(t.host.workdir)}/.fleet-write-test"
    try:
        t.write(path, b"\0" * (1 << 20), 0o600)
    except FleetError as e:
        return Check(t.host.name, "write", Status.FAIL, str(e),
                     "free space or quota there, or set `workdir` for this host elsewhere")
    finally:
        t.run(sh("rm", "-f", path), what="remove the write test")
    return Check(t.host.name, "write", Status.PASS,
                 f"1 MiB written and read back in {t.host.workdir}")


def _version_checks(facts: dict[str, tuple[Facts, Health]], master: str) -> list[Check]:
    out = []
    said = {n: {"python": f.python_version, "torch": h.torch, "torchvision": h.torchvision,
                "cuda": h.cuda, "nccl": h.nccl, "driver": h.driver}
            for n, (f, h) in facts.items()}
    for key in ("python", "torch", "torchvision", "cuda", "nccl", "driver"):
        values = {n: versions[key] for n, versions in said.items()}
        if not any(values.values()):
            continue
        ref = values.get(master) or next(v for v in values.values() if v)
        for name, v in values.items():
            if v == ref:
                out.append(Check(name, key, Status.PASS, v))
            else:
                out.append(Check(name, key, Status.FAIL,
                                 f"{v or 'missing'} here, {ref} on {master}",
                                 f"install the same {key} version on every node"))
    for name, (_, h) in facts.items():
        if h.torch_error:
            out.append(Check(name, "torch", Status.FAIL, h.torch_error,
                             "install torch in the node's python, or point `python` at a venv "
                             "that has it"))
    return out


def _lease_check(host: Host, g: GpuFacts) -> Check:
    """Other users' leases (fleet reserve) on what the job would use here: `fleet up` refuses
    them."""
    found = lease_blockers(host.name, host.gpus, g, time.time())
    if not found:
        return Check(host.name, "gpu leases", Status.PASS, "no other user's lease on what the "
                     "job uses" if g.active_leases() else "none")
    return Check(host.name, "gpu leases", Status.WARN, "; ".join(b.line() for b in found),
                 "fleet up refuses leased GPUs: wait (fleet up --wait) or --ignore-leases")


def _chosen_gpu_check(host: Host, g: GpuFacts | Exception) -> Check:
    """The GPUs the inventory chose for this node: there, and not busy with another user's
    work (a warning: `fleet up` refuses them unless --force, sharing may be agreed)."""
    chosen = ",".join(map(str, host.gpus or ()))
    if isinstance(g, Exception):
        return Check(host.name, "chosen gpus", Status.WARN, f"could not list GPUs: {reason(g)}")
    why = absent(host.gpus or (), g)
    if why:
        return Check(host.name, "chosen gpus", Status.WARN, f"gpus = {chosen}: {why}",
                     f"fix `gpus` for {host.name} in the inventory (nvidia-smi -L lists them)")
    taken = busy(host.gpus or (), g)
    if taken:
        return Check(host.name, "chosen gpus", Status.WARN,
                     f"gpus = {chosen}: " + "; ".join(taken),
                     "fleet up refuses them: wait (fleet up --wait), choose free GPUs "
                     "(fleet gpus shows which), or agree with that user and start anyway "
                     "(--force)")
    return Check(host.name, "chosen gpus", Status.PASS,
                 f"gpus = {chosen}: present, no other user's process on them")


def _node_checks(name: str, hostname: str, h: Health, skew: float, nproc: Nproc,
                 alone: bool, chosen: bool = False) -> list[Check]:
    """GPUs, name resolution, reverse lookup, clock (`skew`: the node's clock minus this
    machine's) and disk, as the node's deep probe said them."""
    out = []
    gpus = h.gpus
    if nproc is Procs.GPU and gpus == 0:
        out.append(Check(name, "gpus", Status.FAIL,
                         "nproc_per_node = \"gpu\" but no GPU is visible",
                         "use a number (CPU processes) or check the driver (nvidia-smi)"))
    elif isinstance(nproc, int) and gpus and nproc > gpus:
        out.append(Check(name, "gpus", Status.FAIL, f"{nproc} processes for {gpus} GPU(s)",
                         "set nproc_per_node to the GPU count (or \"gpu\")"))
    else:
        out.append(Check(name, "gpus", Status.PASS,
                         f"{gpus} GPU(s)" if gpus else "none (Gloo on CPU)"))
    running = h.gpu_processes
    if running and not chosen:  # with chosen GPUs, "chosen gpus" says whose are on them
        out.append(Check(name, "gpu processes", Status.WARN,
                         f"{len(running)} running: {running[0]}",
                         "another job is using the GPUs; `nvidia-smi` shows which (or choose "
                         "free ones with `gpus` in the inventory)"))
    resolved = h.resolves
    if not resolved:
        out.append(Check(name, "hostname", Status.WARN, f"{hostname} does not resolve: "
                         f"{h.resolve_error}",
                         "add the hostname to /etc/hosts with the node's real IP"))
    elif all(a.startswith("127.") or a == "::1" for a in resolved) and not alone:
        out.append(Check(name, "hostname", Status.WARN,
                         f"{hostname} resolves to {', '.join(resolved)} (loopback)",
                         "fleet sets the interface and addresses itself, but tools that use "
                         "the hostname will not reach this node: map it to its real IP in "
                         "/etc/hosts"))
    else:
        out.append(Check(name, "hostname", Status.PASS, f"{hostname} -> {resolved[0]}"))
    slow = h.reverse_dns_s > REVERSE_DNS_WARN_S
    out.append(Check(name, "reverse dns", Status.WARN if slow else Status.PASS,
                     f"reverse lookup took {h.reverse_dns_s:.2f}s",
                     "a slow resolver delays every connection torch makes (the seeds saw a "
                     "44 s start): fix /etc/resolv.conf or list the nodes in /etc/hosts"
                     if slow else ""))
    skewed = abs(skew) > CLOCK_SKEW_WARN_S
    out.append(Check(name, "clock", Status.WARN if skewed else Status.PASS,
                     f"{skew:+.1f}s from this machine",
                     "run NTP (chrony/systemd-timesyncd) on every node" if skewed else ""))
    free = h.disk_free
    status = (Status.FAIL if free < DISK_FAIL_BYTES else Status.WARN if free < DISK_WARN_BYTES
              else Status.PASS)
    out.append(Check(name, "disk", status, f"{free / 2**30:.1f} GiB free in {h.disk_path}",
                     "free space or point `workdir` at a larger disk"
                     if status is not Status.PASS else ""))
    return out


def collective_job(job: Job) -> Job:
    """The bandwidth test as a job on the same inventory, processes and port as `job`."""
    import fleet.nodejobs
    workdir = Path(fleet.nodejobs.__file__).parent
    return Job(path=job.path, name="fleet-collective", inventory=job.inventory, workdir=workdir,
               script="collective.py", nproc_per_node=job.nproc_per_node, env=job.env,
               rendezvous=job.rendezvous, exclude=DEFAULT_EXCLUDE, selection=job.selection)
