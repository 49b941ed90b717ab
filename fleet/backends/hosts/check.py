"""`fleet check` on a host list: per host and check, pass / warn / fail with the fix, before
anything runs. One deep probe per node (fleet.facts.probe) says what the checks judge."""

from __future__ import annotations

from pathlib import Path

from fleet.backends.checks import Check, Status, connection_checks
from fleet.backends.hosts.ports import port_checks
from fleet.config.inventory import Host, Inventory
from fleet.config.job import DEFAULT_EXCLUDE, Job
from fleet.errors import FleetError
from fleet.facts.gpus import GpuFacts, absent, busy, gpu_facts
from fleet.facts.probe import Facts, Health, master_address, net_for, probe, storage_groups
from fleet.plan import NodeNet, node_nproc
from fleet.shell import sh
from fleet.transport import Transport, open_transport
from fleet.transport.group import each, reason

CLOCK_SKEW_WARN_S = 2.0
DISK_WARN_BYTES = 10 << 30
DISK_FAIL_BYTES = 1 << 30
REVERSE_DNS_WARN_S = 1.0


def run_checks(inventory: Inventory, job: Job) -> list[Check]:
    hosts = {h.name: h for h in inventory.hosts}
    checks: list[Check] = []
    conn = each(((h.name, h) for h in inventory.hosts), open_transport)
    session = {n: t for n, t in conn.items() if isinstance(t, Transport)}
    try:
        for name, r in conn.items():
            if isinstance(r, Exception):
                checks.append(Check(name, "ssh", Status.FAIL, reason(r), _ssh_fix(hosts[name])))
            else:
                checks += connection_checks(r)
        master = inventory.hosts[0]
        if master.name not in session:
            return checks
        try:
            master_ip = master_address(inventory, probe(session[master.name], None))
        except FleetError as e:
            checks.append(Check(master.name, "probe", Status.FAIL, str(e)))
            return checks
        found = each(session.items(), lambda t: probe(t, master_ip, deep=True))
        facts = {n: f for n, f in found.items() if isinstance(f, Facts)}
        for name, fr in found.items():
            if isinstance(fr, Exception):
                checks.append(Check(name, "probe", Status.FAIL, reason(fr)))
        nets: dict[str, NodeNet | Exception] = {}
        for name, f in facts.items():
            try:
                nets[name] = net_for(hosts[name], f, master_ip)
            except RuntimeError as e:
                nets[name] = e
        checks += _storage_checks(facts)

        def own_ip(name: str) -> str:
            net = nets.get(name)
            return (net.address if isinstance(net, NodeNet) else None) or hosts[name].address

        good: dict[str, tuple[Facts, Health]] = {}
        for name, f in facts.items():
            if f.health is not None:
                good[name] = (f, f.health)
                continue
            said = f.detail.strip().splitlines()
            checks.append(Check(name, "python", Status.FAIL,
                                said[-1] if said else f"{hosts[name].python} said nothing",
                                f"set `python` for {name} in the inventory to an interpreter "
                                "with torch (the venv's full path)"))
        checks += _version_checks(good, master.name)
        chosen = {n: t for n, t in session.items() if hosts[n].gpus}
        for name, g in each(chosen.items(), gpu_facts).items():
            checks.append(_chosen_gpu_check(hosts[name], g))
        for name, (f, health) in good.items():
            checks += _node_checks(name, f.hostname, health, session[name].clock_offset,
                                   node_nproc(job, hosts[name]), alone=len(hosts) == 1,
                                   chosen=name in chosen)
            checks.append(_write_check(session[name]))
            net = nets.get(name)
            if isinstance(net, NodeNet):
                checks.append(Check(name, "interface", Status.PASS if net.interface or
                                    len(inventory.hosts) == 1 else Status.WARN,
                                    f"{net.interface or '-'} ({net.reason})"))
            elif net is not None:
                checks.append(Check(name, "interface", Status.FAIL, reason(net),
                                    "the node has no route to the master's address"))
        if all(n in session for n in hosts):
            checks += port_checks(session, master, master_ip, job.rendezvous.port,
                                  {n: own_ip(n) for n in session})
    finally:
        for t in session.values():
            t.close()
    return checks


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


def _ssh_fix(h: Host) -> str:
    if h.transport == "local":
        return ""
    port = h.port or 22
    return (f"check that sshd runs on {h.address}:{port} and that `ssh -p {port} "
            f"{h.user + '@' if h.user else ''}{h.address}` works with the same key")


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


def _chosen_gpu_check(host: Host, g: GpuFacts | Exception) -> Check:
    """The GPUs the inventory chose for this node: there, and not busy with another user's
    work (a warning: sharing may be agreed; torch would fail or crawl otherwise)."""
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
                     "agree with that user, or choose free GPUs (nvidia-smi shows which)")
    return Check(host.name, "chosen gpus", Status.PASS,
                 f"gpus = {chosen}: present, no other user's process on them")


def _node_checks(name: str, hostname: str, h: Health, skew: float, nproc: int | str,
                 alone: bool, chosen: bool = False) -> list[Check]:
    """GPUs, name resolution, reverse lookup, clock (`skew`: the node's clock minus this
    machine's) and disk, as the node's deep probe said them."""
    out = []
    gpus = h.gpus
    if nproc == "gpu" and gpus == 0:
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
               rendezvous=job.rendezvous, exclude=DEFAULT_EXCLUDE)
