"""Getting a run ready on hosts: connect to every node, probe, plan, preflight (the upload is
fleet.backends.hosts.upload); nothing of the job runs anywhere yet."""

from __future__ import annotations

import dataclasses
import time

from fleet.backends.checks import Status
from fleet.backends.hosts.claim import Claims, claim_all
from fleet.backends.hosts.gpus import lease_on
from fleet.backends.hosts.ports import Listeners, port_checks
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job, Launcher
from fleet.console import Console
from fleet.errors import HostError, HostsBusy, host_error
from fleet.facts.gpus import GpuFacts, absent, gpu_facts
from fleet.facts.leases import LeaseOrder
from fleet.facts.probe import (
    Facts,
    literal_address,
    master_address,
    net_for,
    parse_probe,
    probe,
    probe_script,
    python_problem,
    storage_groups,
)
from fleet.plan import Plan, make_plan
from fleet.transport import Transport, open_transport
from fleet.transport.group import all_ok, each
from fleet.waits import named


class Session:
    """Open connections to every node of a plan, closed together."""

    def __init__(self, transports: dict[str, Transport]) -> None:
        self.transports = transports
        self.facts: dict[str, Facts] = {}  # what the probe learnt, once prepare_plan ran
        self.claims: Claims | None = None  # held from before the first write to the start
        self.gpus: dict[str, GpuFacts] = {}  # what the GPU gate learnt (fleet.backends.hosts.gpus)
        self.unreachable: dict[str, str] = {}  # a placement's hosts that did not answer, why
        # Per host the run lease's file a placement took (fleet.backends.hosts.placing): given
        # back when the session closes, unless emptied first (a run that goes on detached).
        self.leases: dict[str, str] = {}

    def release(self) -> None:
        """Let other launches prepare these hosts (this one's nodes run, or it gave up)."""
        if self.claims is not None:
            self.claims.release()
            self.claims = None

    def give_back(self) -> None:
        """Drop the run leases taken (best effort: one not dropped ends by its time)."""
        leases, self.leases = dict(self.leases), {}
        each(((n, n) for n in leases if n in self.transports), lambda n: lease_on(
            self.transports[n], self.transports[n].host, LeaseOrder.drop((leases[n],))))

    def close(self) -> None:
        self.release()
        self.give_back()
        each(self.transports.items(), lambda t: t.close())


def connect(inventory: Inventory, console: Console) -> Session:
    """Connect to every host in parallel; if any fails, close the rest and name each failure."""
    def one(host: Host) -> Transport:
        t0 = time.monotonic()
        t = open_transport(host, hello=False)  # the probe, next, learns what a hello would
        console.phase(host.name, f"connected ({host.transport}, {time.monotonic() - t0:.2f}s)")
        return t

    with console.hosts_waiting("connect", (h.name for h in inventory.hosts)) as wait:
        results = each(named((h.name, h) for h in inventory.hosts), wait.tracked(one))
    bad = {name: r for name, r in results.items() if isinstance(r, Exception)}
    if bad:
        for r in results.values():
            if isinstance(r, Transport):
                r.close()
        raise host_error("connect", bad)
    return Session({n: r for n, r in results.items() if isinstance(r, Transport)})


def claim_and_probe(session: Session, inventory: Inventory, run_id: str, console: Console,
                    held: bool = False) -> None:
    """Claim every host (fleet.backends.hosts.claim) and, in the same round trip, probe it as
    prepare_plan would (the probe runs once the claim holds the host, so nothing is written
    before it does): session.claims and session.facts."""
    hint = _hint(inventory)
    scripts = {h.name: probe_script(h.python, h.workdir, hint, True, held)
               for h in inventory.hosts}
    with console.hosts_waiting("claim and probe", (h.name for h in inventory.hosts)) as wait:
        session.claims = claim_all(session.transports, inventory.hosts, run_id, console,
                                   scripts, wait.finish)
    for name, said in session.claims.said.items():
        f = session.facts[name] = parse_probe(said.text)
        if f.home:
            session.transports[name].learnt(f.home, f.shell, "", f.node_time, said.sent,
                                            said.received)


def _hint(inventory: Inventory) -> str | None:
    """The master's address where the inventory gives it as an IP: the probe can ask the route
    to it at once."""
    guess = master_address(inventory, None)
    return guess if literal_address(guess) or guess == "127.0.0.1" else None


def prepare_plan(session: Session, inventory: Inventory, job: Job, run_id: str,
                 console: Console, *, create: bool = True, allow_mismatch: bool = False,
                 held: bool = False, run: str = "") -> Plan:
    """Probe every node (one round trip each where the master's address is an IP already;
    with `held`, also the fleet runs alive there), then plan with what was learnt: homes,
    master IP, interfaces, shared storage."""
    hosts = {h.name: h for h in inventory.hosts}
    hint = _hint(inventory)
    facts: dict[str, Facts] = dict(session.facts)  # claim_and_probe's, where it ran
    if set(facts) != set(session.transports):
        with console.hosts_waiting("probe", session.transports) as wait:
            facts = all_ok("probe", each(
                named(session.transports.items()),
                wait.tracked(lambda t: probe(t, hint, create=create, held=held))))
    session.facts = facts
    own = job.python is not None  # the job's interpreter exists after its setup: checked then
    problems = {name: p for name in facts if (p := python_problem(
        hosts[name], facts[name], job.launcher, needs_torch=not own)) is not None}
    if problems:
        raise HostError("checking python", problems)
    master_ip = master_address(inventory, facts[inventory.hosts[0].name])
    with console.hosts_waiting(f"the route to the master ({master_ip})",
                               session.transports) as wait:
        if master_ip != hint:  # the route could only be asked once the master's IP was known
            facts = all_ok("finding the route to the master", each(
                named(session.transports.items()),
                wait.tracked(lambda t: probe(t, master_ip, create=False))))
        if not own:
            _versions_agree(facts, inventory.hosts[0].name, console, allow_mismatch)
        nets = all_ok("finding the route to the master", each(
            ((n, n) for n in session.transports),
            lambda n: net_for(hosts[n], facts[n], master_ip)))
    homes = {n: t.home for n, t in session.transports.items()}
    has_gpus = gpu_plan(session, inventory, job, console)
    plan = make_plan(inventory, job, run_id, master_addr=master_ip, nets=nets, homes=homes,
                     storage=storage_groups(facts), has_gpus=has_gpus, run=run)
    plan = dataclasses.replace(plan, versions={n: f.versions() for n, f in facts.items()},
                               packages={n: f.packages for n, f in facts.items()},
                               leases=dict(session.leases))
    for node in plan.nodes:
        console.phase(node.host.name, f"node rank {node.node_rank}, interface "
                      f"{node.net.interface or '-'} ({node.net.reason})")
    for group in plan.storage:
        if len(group) > 1:
            console.info(f"{', '.join(group)} share one filesystem under their workdir: code "
                         "and data are synced once, through " + group[0])
    return plan


def _versions_agree(facts: dict[str, Facts], master: str, console: Console,
                    allow_mismatch: bool) -> None:
    mismatch = version_problems(facts, master)
    if mismatch and not allow_mismatch:
        raise HostError("version check (--allow-version-mismatch starts anyway)", mismatch)
    console.phases({name: f"warning: {why}" for name, why in mismatch.items()})


def check_job_python(session: Session, plan: Plan, console: Console,
                     allow_mismatch: bool = False) -> Plan:
    """After setup, the job's own interpreter on every node: there, with torch (and accelerate
    where the launcher needs it), the same versions everywhere. The plan with its versions."""
    with console.hosts_waiting("the job's python", (n.host.name for n in plan.nodes)) as wait:
        facts: dict[str, Facts] = all_ok("checking the job's python", each(
            named((n.host.name, n) for n in plan.nodes),
            wait.tracked(lambda n: probe(session.transports[n.host.name], None, create=False,
                                         python=n.python))))
    problems = {}
    for n in plan.nodes:
        why = python_problem(dataclasses.replace(n.host, python=n.python), facts[n.host.name],
                             plan.job.launcher)
        if why is not None:
            problems[n.host.name] = why + " (the job's `python`, after its setup)"
    if problems:
        raise HostError("checking the job's python", problems)
    _versions_agree(facts, plan.master.host.name, console, allow_mismatch)
    return dataclasses.replace(plan, versions={n: f.versions() for n, f in facts.items()},
                               packages={n: f.packages for n, f in facts.items()})


def gpu_plan(session: Session, inventory: Inventory, job: Job,
               console: Console) -> dict[str, bool] | None:
    """Where GPUs matter (GPUs chosen per host, or accelerate, whose mode follows them), ask
    nvidia-smi on every node: chosen GPUs that do not exist stop the launch, a node without
    nvidia-smi is warned about (another user's process on them was the gate's: refused, or said
    once under --force). Per node whether it has GPUs, or None when not asked."""
    if job.launcher != Launcher.ACCELERATE and not any(h.gpus for h in inventory.hosts):
        return None
    facts = session.gpus
    if not facts:
        with console.hosts_waiting("the GPU list", session.transports) as wait:
            facts = all_ok("listing GPUs", each(named(session.transports.items()),
                                                wait.tracked(gpu_facts)))
    problems: dict[str, str] = {}
    warned: dict[str, list[str]] = {}
    for h in inventory.hosts:
        f = facts[h.name]
        if not h.gpus:
            continue
        chosen = ",".join(map(str, h.gpus))
        why = absent(h.gpus, f)
        if why and f.gpus:
            problems[h.name] = f"gpus = {chosen} in the inventory, but {why}"
        elif why:
            warned[h.name] = [f"gpus = {chosen}, but {why}: its processes run without GPUs"]
    console.phases({name: "warning: " + "; ".join(w) for name, w in warned.items()})
    if problems:
        raise HostError("choosing GPUs", problems)
    return {name: bool(f.gpus) for name, f in facts.items()}


def version_problems(facts: dict[str, Facts], master: str) -> dict[str, str]:
    """Nodes whose python (major.minor) or torch differ from the master's."""
    ref = facts[master]
    out = {}
    for name, f in facts.items():
        py, ref_py = f.python_version.rsplit(".", 1)[0], ref.python_version.rsplit(".", 1)[0]
        diffs = [f"{what} {mine or '?'} here, {theirs or '?'} on {master}"
                 for what, mine, theirs in (("python", py, ref_py),
                                            ("torch", f.torch_version, ref.torch_version))
                 if mine != theirs]
        if diffs:
            out[name] = "; ".join(diffs) + " (install the same versions on every node)"
    return out


def refuse_held(session: Session, placed: str = "") -> None:
    """No other run of fleet may still hold a node (what the probe listed, prepare_plan's
    `held`): its code directory would change under it. A placed run (`placed`: its job's
    name) shares a host with another job's run, whose GPUs its run lease keeps apart: only
    runs of a job of that name (its code directory's) refuse it."""
    def ids(f: Facts) -> list[str]:
        runs = [h.split("/")[0] for h in f.held]
        return [r for r in runs if r.startswith(f"{placed}-")] if placed else runs

    busy = {name: f"held by run {held[0]} (still running); stop it (`fleet stop {held[0]}`) "
                  "or pass --force"
            for name, f in session.facts.items() if (held := ids(f))}
    if busy:
        raise HostsBusy("preflight", busy)


def preflight(session: Session, plan: Plan, console: Console,
              listeners: Listeners | None = None) -> None:
    """The network part of `fleet check`: the master's port is free and reachable both ways."""
    m = plan.master
    checks = port_checks(session.transports, m.host, m.master_addr, m.master_port,
                         {n.host.name: n.net.address or n.host.address for n in plan.nodes},
                         listeners)
    bad = {c.host: f"{c.detail}; fix: {c.fix}" for c in checks if c.status is Status.FAIL}
    if bad:
        raise HostError("preflight (skip with --skip-checks)", bad)
    console.info(f"preflight: rendezvous port {m.master_port} free on {m.host.name}"
                 + (", reachable from every node" if len(plan.nodes) > 1 else ""))
