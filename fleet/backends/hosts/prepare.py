"""Getting a run ready: connect to every node, probe, plan, preflight, and upload; nothing of
the job runs anywhere yet (fleet.run.runner takes it from there)."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass

from fleet.backends.checks import Status
from fleet.backends.hosts.claim import Claims
from fleet.backends.hosts.ports import Listeners, port_checks
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.console import Console
from fleet.errors import HostError, HostsBusy, host_error
from fleet.facts.gpus import GpuFacts, absent, busy, gpu_facts
from fleet.facts.probe import (
    Facts,
    literal_address,
    master_address,
    net_for,
    probe,
    python_problem,
    storage_groups,
)
from fleet.nodeside.ferry import part_name
from fleet.plan import SITE, NodePlan, Plan, make_plan
from fleet.render import render_node
from fleet.run import faults
from fleet.shell import sh
from fleet.transport import Transport, open_transport, transfer
from fleet.transport.group import all_ok, each
from fleet.transport.sync import (
    Entry,
    Scan,
    changed,
    code_entries,
    listing_script,
    parse_listing,
    scan,
)
from fleet.transport.sync import send as send_bundle


class Session:
    """Open connections to every node of a plan, closed together."""

    def __init__(self, transports: dict[str, Transport]) -> None:
        self.t = transports
        self.facts: dict[str, Facts] = {}  # what the probe learnt, once prepare_plan ran
        self.claims: Claims | None = None  # held from before the first write to the start

    def release(self) -> None:
        """Let other launches prepare these hosts (this one's nodes run, or it gave up)."""
        if self.claims is not None:
            self.claims.release()
            self.claims = None

    def close(self) -> None:
        self.release()
        each(self.t.items(), lambda t: t.close())


def connect(inventory: Inventory, console: Console) -> Session:
    """Connect to every host in parallel; if any fails, close the rest and name each failure."""

    def one(host: Host) -> Transport:
        t0 = time.monotonic()
        t = open_transport(host, hello=False)  # the probe, next, learns what a hello would
        console.phase(host.name, f"connected ({host.transport}, {time.monotonic() - t0:.2f}s)")
        return t

    results = each(((h.name, h) for h in inventory.hosts), one)
    bad = {name: r for name, r in results.items() if isinstance(r, Exception)}
    if bad:
        for r in results.values():
            if isinstance(r, Transport):
                r.close()
        raise host_error("connect", bad)
    return Session({n: r for n, r in results.items() if isinstance(r, Transport)})


def prepare_plan(session: Session, inventory: Inventory, job: Job, run_id: str,
                 console: Console, *, create: bool = True, allow_mismatch: bool = False,
                 held: bool = False) -> Plan:
    """Probe every node (one round trip each where the master's address is an IP already;
    with `held`, also the fleet runs alive there), then plan with what was learnt: homes,
    master IP, interfaces, shared storage."""
    hosts = {h.name: h for h in inventory.hosts}
    guess = master_address(inventory, None)
    hint = guess if literal_address(guess) or guess == "127.0.0.1" else None
    facts: dict[str, Facts] = all_ok("probe", each(
        session.t.items(), lambda t: probe(t, hint, create=create, held=held)))
    session.facts = facts
    own = job.python is not None  # the job's interpreter exists after its setup: checked then
    problems = {name: p for name in facts if (p := python_problem(
        hosts[name], facts[name], job.launcher, needs_torch=not own)) is not None}
    if problems:
        raise HostError("checking python", problems)
    master_ip = master_address(inventory, facts[inventory.hosts[0].name])
    if master_ip != hint:  # the route could only be asked once the master's IP was known
        facts = all_ok("finding the route to the master", each(
            session.t.items(), lambda t: probe(t, master_ip, create=False)))
    if not own:
        _versions_agree(facts, inventory.hosts[0].name, console, allow_mismatch)
    nets = all_ok("finding the route to the master", each(
        ((n, n) for n in session.t), lambda n: net_for(hosts[n], facts[n], master_ip)))
    homes = {n: t.home for n, t in session.t.items()}
    has_gpus = gpu_plan(session, inventory, job, console)
    plan = make_plan(inventory, job, run_id, master_addr=master_ip, nets=nets, homes=homes,
                     storage=storage_groups(facts), has_gpus=has_gpus)
    plan = dataclasses.replace(plan, versions={n: f.versions() for n, f in facts.items()})
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
    for name, why in mismatch.items():
        console.phase(name, f"warning: {why}")


def check_job_python(session: Session, plan: Plan, console: Console,
                     allow_mismatch: bool = False) -> Plan:
    """After setup, the job's own interpreter on every node: there, with torch (and accelerate
    where the launcher needs it), the same versions everywhere. The plan with its versions."""
    facts: dict[str, Facts] = all_ok("checking the job's python", each(
        ((n.host.name, n) for n in plan.nodes),
        lambda n: probe(session.t[n.host.name], None, create=False, python=n.python)))
    problems = {}
    for n in plan.nodes:
        why = python_problem(dataclasses.replace(n.host, python=n.python), facts[n.host.name],
                             plan.job.launcher)
        if why is not None:
            problems[n.host.name] = why + " (the job's `python`, after its setup)"
    if problems:
        raise HostError("checking the job's python", problems)
    _versions_agree(facts, plan.master.host.name, console, allow_mismatch)
    return dataclasses.replace(plan, versions={n: f.versions() for n, f in facts.items()})


def gpu_plan(session: Session, inventory: Inventory, job: Job,
               console: Console) -> dict[str, bool] | None:
    """Where GPUs matter (GPUs chosen per host, or accelerate, whose mode follows them), ask
    nvidia-smi on every node: chosen GPUs that do not exist stop the launch, busy ones and a
    node without nvidia-smi are warned about. Per node whether it has GPUs, or None when not
    asked."""
    if job.launcher != "accelerate" and not any(h.gpus for h in inventory.hosts):
        return None
    facts: dict[str, GpuFacts] = all_ok("listing GPUs", each(session.t.items(), gpu_facts))
    problems = {}
    for h in inventory.hosts:
        f = facts[h.name]
        if not h.gpus:
            continue
        chosen = ",".join(map(str, h.gpus))
        why = absent(h.gpus, f)
        if why and f.gpus:
            problems[h.name] = f"gpus = {chosen} in the inventory, but {why}"
        elif why:
            console.phase(h.name, f"warning: gpus = {chosen}, but {why}: its processes run "
                                  "without GPUs")
        for taken in busy(h.gpus, f):
            console.phase(h.name, f"warning: {taken}")
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


def refuse_held(session: Session) -> None:
    """No other run of fleet may still hold a node (what the probe listed, prepare_plan's
    `held`): its code directory would change under it."""
    busy = {name: f"held by run {f.held[0].split('/')[0]} (still running); stop it (`fleet "
                  f"stop {f.held[0].split('/')[0]}`) or pass --force"
            for name, f in session.facts.items() if f.held}
    if busy:
        raise HostsBusy("preflight", busy)


def preflight(session: Session, plan: Plan, console: Console,
              listeners: Listeners | None = None) -> None:
    """The network part of `fleet check`: the master's port is free and reachable both ways."""
    m = plan.master
    checks = port_checks(session.t, m.host, m.master_addr, m.master_port,
                         {n.host.name: n.net.address or n.host.address for n in plan.nodes},
                         listeners)
    bad = {c.host: f"{c.detail}; fix: {c.fix}" for c in checks if c.status is Status.FAIL}
    if bad:
        raise HostError("preflight (skip with --skip-checks)", bad)
    console.info(f"preflight: rendezvous port {m.master_port} free on {m.host.name}"
                 + (", reachable from every node" if len(plan.nodes) > 1 else ""))


SYNCED = ".fleet-synced"  # in a node's code directory: the run whose sync it holds


@dataclass(frozen=True)
class Sources:
    """What a launch sends, scanned on this machine before any host is touched (transport.sync.scan:
    an unreadable file stops it there), and, once sent, the sha256 of the bytes each node
    received (`sent`: node -> destination path -> hash)."""

    code: Scan
    data: Scan | None
    sent: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)


def scan_sources(job: Job, console: Console) -> Sources:
    """The job's workdir and data as fleet sends them; what is skipped, and why, said once."""
    code = scan(job.workdir, job.exclude)
    data = scan(job.data, ()) if job.data else None
    for s in (code, data):
        if s is None:
            continue
        for rel, why in s.skipped[:SKIPPED_SHOWN]:
            console.info(f"not sent: {s.root / rel}: {why}")
        if len(s.skipped) > SKIPPED_SHOWN:
            console.info(f"not sent: {len(s.skipped) - SKIPPED_SHOWN} more file(s) under "
                         f"{s.root} (links outside it, special files)")
        for rel in s.sparse:
            console.info(f"note: {s.root / rel} is sparse: it is sent whole and arrives dense")
    return Sources(code, data)


SKIPPED_SHOWN = 10


@dataclass
class _Listed:
    """One node's upload after its listing: per synced directory (scan, where, what is there,
    label) and the files that changed."""

    node: NodePlan
    run_files: bool
    dirs: list[tuple[Scan, str, dict[str, tuple[int, int]], str]]
    rels: list[list[str]]
    t0: float
    streamed: dict[int, transfer.Moved] | None = None  # per directory, once streamed

    @property
    def changed_bytes(self) -> int:
        return sum(d[0].manifest[r][0] for d, rels in zip(self.dirs, self.rels, strict=True)
                   for r in rels)

    @property
    def resumes(self) -> bool:
        """A partial file of an interrupted transfer is there for a changed file."""
        return any(part_name(r) in d[2] for d, rels in zip(self.dirs, self.rels, strict=True)
                   for r in rels)


def upload(session: Session, plan: Plan, console: Console,
           sources: Sources | None = None) -> Sources:
    """Sync the code and data (once per shared filesystem) and write the rendered scripts on
    every node: one listing each (which also creates the directories); large changes, or
    ones resuming an interrupted transfer (transport.transfer.streams), streamed to every node
    at once by transport.transfer (relayed node to node); the rest, with the run's files, in
    one verified bundle each. Raises HostError naming each node that failed
    (nothing has started yet).
    Returns the sources with what each node received."""
    sources = sources or scan_sources(plan.job, console)
    leader = {name: group[0] for group in plan.storage for name in group}
    nodes = {n.host.name: n for n in plan.nodes}
    _sync(session, plan, console, sources,
          [(n, leader[name] == name, True) for name, n in nodes.items()])

    def confirm(node: NodePlan) -> bool:
        """A node that shares its leader's storage sees the leader's sync; if it does not (a
        copied workdir, say), it gets its own."""
        t = session.t[node.host.name]
        seen = t.run(sh("cat", f"{node.code_dir}/{SYNCED}") + " 2>/dev/null",
                     what="read the sync marker").out.strip()
        if seen == plan.run_id:
            console.phase(node.host.name, f"code: shared with {leader[node.host.name]}")
            return True
        console.phase(node.host.name, "code: its storage is not shared after all; syncing")
        return False

    seen = all_ok("prepare", each(((n, nodes[n]) for n in nodes if leader[n] != n), confirm))
    unshared = [(nodes[n], True, False) for n, shared in seen.items() if not shared]
    if unshared:
        _sync(session, plan, console, sources, unshared)
    return sources


def _sync(session: Session, plan: Plan, console: Console, sources: Sources,
          todo: list[tuple[NodePlan, bool, bool]]) -> None:
    """For each (node, syncs its directories, writes the run's files): list, stream what is
    large, bundle the rest; the caller's guard removes what was written on a failure."""
    code, data = sources.code, sources.data
    lock = threading.Lock()

    def listed(item: tuple[NodePlan, bool, bool]) -> _Listed:
        node, syncs, run_files = item
        t = session.t[node.host.name]
        dirs = [(code, node.code_dir, code.manifest, "code")] if syncs else []
        if syncs and node.data_dir and data is not None:
            dirs.append((data, node.data_dir, data.manifest, "data"))
        private = (node.run_dir, f"{node.run_dir}/{SITE}") if run_files else ()
        t0 = time.monotonic()
        r = t.run(listing_script([d[1] for d in dirs], private, (node.code_dir,)),
                  what=f"create {node.run_dir}")
        r.check(node.host.name)
        faults.point("upload-listed")
        theres = parse_listing(r.out, len(dirs))
        dirs = [(src, dest, there, label) for (src, dest, _, label), there
                in zip(dirs, theres, strict=True)]
        rels = [changed(src.manifest, there) for src, _, there, _ in dirs]
        return _Listed(node, run_files, dirs, rels, t0)

    lists = all_ok("prepare", each(((n.host.name, (n, s, r)) for n, s, r in todo), listed))
    big = [ls for ls in lists.values() if transfer.streams(ls.changed_bytes, ls.resumes)]
    if big:
        _stream(session, console, sources, big)

    def finish(ls: _Listed) -> None:
        node = ls.node
        t = session.t[node.host.name]
        entries: list[Entry] = []
        if ls.streamed is None:
            for (src, dest, _, _), rels in zip(ls.dirs, ls.rels, strict=True):
                entries += code_entries(src, dest, rels)
        if ls.dirs:
            entries.append(Entry(f"{node.code_dir}/{SYNCED}", 0o644, data=plan.run_id.encode()))
        if ls.run_files:
            entries += [Entry(f"{node.run_dir}/{name}", mode, data=text.encode())
                        for name, (text, mode) in render_node(plan, node).files.items()]
        if entries:
            got = send_bundle(t, entries, plan.run_id)
            with lock:
                sources.sent.setdefault(node.host.name, {}).update(got)
        took = time.monotonic() - ls.t0
        for k, ((src, _, _, label), rels) in enumerate(zip(ls.dirs, ls.rels, strict=True)):
            if ls.streamed is None:
                files, size, kept, touched = len(rels), sum(src.manifest[r][0] for r in rels), 0, 0
            else:
                m = ls.streamed.get(k, transfer.Moved())
                files, size, kept, touched = m.files, m.sent, m.kept, m.touched
            console.phase(node.host.name, f"{label}: sent {files} file(s), {size} bytes "
                          f"({len(src.manifest) - files} unchanged, {took:.2f}s)")
            if kept:
                console.phase(node.host.name, f"{label}: {transfer.human(kept)} of the files "
                              "sent were there already (a partial or older copy): verified "
                              "and kept, not sent again")
            if touched:
                console.phase(node.host.name, f"{label}: {touched} file(s) with a new time "
                              "but the same content: only their times were set")

    all_ok("prepare", each(lists.items(), finish))


def _stream(session: Session, console: Console, sources: Sources, big: list[_Listed]) -> None:
    """The changes of these nodes, streamed to all of them at once (fleet.transport.transfer)."""
    count = max(len(ls.dirs) for ls in big)
    scans = [next(ls.dirs[k][0] for ls in big if len(ls.dirs) > k) for k in range(count)]
    targets, dirs = [], [transfer.Dir(scans[k], {}, {}, {}) for k in range(count)]
    for ls in big:
        t = session.t[ls.node.host.name]
        name = ls.node.host.name
        for k, (_, dest, there, _) in enumerate(ls.dirs):
            dirs[k].roots[name] = t.path(dest)
            dirs[k].there[name] = there
            dirs[k].rels[name] = ls.rels[k]
        targets.append(transfer.Target(
            name, t, ls.node.host.python, ls.node.net.address or ls.node.host.address,
            tuple(t.path(d[1]) for d in ls.dirs) + ("",) * (count - len(ls.dirs))))
    outcome, _ = transfer.move(targets, dirs, console)
    for ls in big:
        name = ls.node.host.name
        ls.streamed = outcome.moved.get(name, {})
        got = {f"{ls.dirs[k][1]}/{rel}": sha
               for (k, rel), sha in outcome.placed.get(name, {}).items() if k < len(ls.dirs)}
        sources.sent.setdefault(name, {}).update(got)


def upload_checked(session: Session, plan: Plan, console: Console, checks: bool,
                   sources: Sources | None = None) -> Sources:
    """upload(), with the preflight's port checks (`checks`) beside it: they touch only the
    master's port and test listeners, and each costs a few round trips that would otherwise
    come first. Either one's error is raised, the upload's first."""
    if not checks:
        return upload(session, plan, console, sources)
    problem: list[BaseException] = []
    listeners = Listeners()

    def check() -> None:
        try:
            preflight(session, plan, console, listeners)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            problem.append(e)
            listeners.stop_all()  # a check that failed half-way leaves no listener behind

    th = threading.Thread(target=check, daemon=True)
    th.start()
    try:
        sent = upload(session, plan, console, sources)
    except BaseException:
        # Nothing may outlive a failed launch on a node: no new test listener starts, a
        # round trip under way may finish, and every listener started ends now instead of
        # waiting 20 s for connections that will never come.
        listeners.cancelled.set()
        try:
            th.join(CHECKS_GIVE_UP_S)
        finally:
            listeners.stop_all()
        raise
    th.join()
    if problem:
        raise problem[0]
    return sent


CHECKS_GIVE_UP_S = 5.0  # how long a failed upload waits for a port check's round trip under way
