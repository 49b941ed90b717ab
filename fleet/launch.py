"""`fleet up`: connect, probe, plan, prepare, start (master first), stream, and tear down."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fleet import failure, remote, state
from fleet.check import FAIL, port_checks
from fleet.console import Console
from fleet.diagnose import diagnose, format_diagnoses
from fleet.errors import HostError, JobFailed, TransportError
from fleet.group import all_ok, each, failures, reason
from fleet.inventory import Host, Inventory
from fleet.job import Job
from fleet.logs import tag_line
from fleet.plan import NodePlan, Plan, make_plan, new_run_id
from fleet.probe import (
    Facts,
    literal_address,
    master_address,
    net_for,
    probe,
    python_problem,
    storage_groups,
)
from fleet.render import render_node
from fleet.shell import sh
from fleet.sync import local_manifest, sync_dir
from fleet.transport import Transport, open_transport


@dataclass(frozen=True)
class NodeOutcome:
    name: str
    node_rank: int
    state: str  # succeeded, failed, stopped, lost
    code: int | None
    detail: str = ""


class Session:
    """Open connections to every node of a plan, closed together."""

    def __init__(self, transports: dict[str, Transport]) -> None:
        self.t = transports

    def close(self) -> None:
        each(self.t.items(), lambda t: t.close())


def connect(inventory: Inventory, console: Console) -> Session:
    """Connect to every host in parallel; if any fails, close the rest and name each failure."""

    def one(host: Host) -> Transport:
        t0 = time.monotonic()
        t = open_transport(host)
        console.phase(host.name, f"connected ({host.transport}, {time.monotonic() - t0:.2f}s)")
        return t

    results = each(((h.name, h) for h in inventory.hosts), one)
    bad = failures(results)
    if bad:
        for r in results.values():
            if isinstance(r, Transport):
                r.close()
        raise HostError("connect", bad)
    return Session({n: r for n, r in results.items() if isinstance(r, Transport)})


def prepare_plan(session: Session, inventory: Inventory, job: Job, run_id: str,
                 console: Console, *, create: bool = True,
                 allow_mismatch: bool = False) -> Plan:
    """Probe every node (one round trip each where the master's address is an IP already),
    then plan with what was learnt: homes, master IP, interfaces, shared storage."""
    hosts = {h.name: h for h in inventory.hosts}
    guess = master_address(inventory, None)
    hint = guess if literal_address(guess) or guess == "127.0.0.1" else None
    facts: dict[str, Facts] = all_ok("probe", each(
        session.t.items(), lambda t: probe(t, hint, create=create)))
    problems = {name: p for name in facts
                if (p := python_problem(hosts[name], facts[name])) is not None}
    if problems:
        raise HostError("checking python", problems)
    master_ip = master_address(inventory, facts[inventory.hosts[0].name])
    if master_ip != hint:  # the route could only be asked once the master's IP was known
        facts = all_ok("finding the route to the master", each(
            session.t.items(), lambda t: probe(t, master_ip, create=False)))
    mismatch = version_problems(facts, inventory.hosts[0].name)
    if mismatch and not allow_mismatch:
        raise HostError("version check (--allow-version-mismatch starts anyway)", mismatch)
    for name, why in mismatch.items():
        console.phase(name, f"warning: {why}")
    nets = all_ok("finding the route to the master", each(
        ((n, n) for n in session.t), lambda n: net_for(hosts[n], facts[n], master_ip)))
    homes = {n: t.home for n, t in session.t.items()}
    plan = make_plan(inventory, job, run_id, master_addr=master_ip, nets=nets, homes=homes,
                     storage=storage_groups(facts))
    for node in plan.nodes:
        console.phase(node.host.name, f"node rank {node.node_rank}, interface "
                      f"{node.net.interface or '-'} ({node.net.reason})")
    for group in plan.storage:
        if len(group) > 1:
            console.info(f"{', '.join(group)} share one filesystem under their workdir: code "
                         "and data are synced once, through " + group[0])
    return plan


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


def preflight(session: Session, plan: Plan, console: Console, force: bool = False) -> None:
    """The fast part of `fleet check`: no other run holds the hosts (unless forced), and the
    master's port is free and reachable both ways."""
    if not force:
        held = each(((n.host.name, n) for n in plan.nodes), lambda n: remote.held_by(
            session.t[n.host.name], n.run_dir.rsplit("/", 2)[0]))
        busy = {name: f"held by run {r[0].split('/')[0]} (still running); stop it (`fleet stop "
                      f"{r[0].split('/')[0]}`) or pass --force"
                for name, r in held.items() if isinstance(r, list) and r}
        if busy:
            raise HostError("preflight", busy)
    m = plan.master
    checks = port_checks(session.t, m.host, m.master_addr, m.master_port,
                         {n.host.name: n.net.address or n.host.address for n in plan.nodes})
    bad = {c.host: f"{c.detail}; fix: {c.fix}" for c in checks if c.status == FAIL}
    if bad:
        raise HostError("preflight (skip with --skip-checks)", bad)
    console.info(f"preflight: rendezvous port {m.master_port} free on {m.host.name}"
                 + (", reachable from every node" if len(plan.nodes) > 1 else ""))


SYNCED = ".fleet-synced"  # in a node's code directory: the run whose sync it holds


def upload(session: Session, plan: Plan, console: Console) -> None:
    """Sync the code and data (once per shared filesystem) and write the rendered scripts on
    every node; on any failure remove what was written everywhere and raise (nothing has
    started yet)."""
    manifest = local_manifest(plan.job.workdir, plan.job.exclude)
    data_manifest = local_manifest(plan.job.data, ()) if plan.job.data else None
    leader = {name: group[0] for group in plan.storage for name in group}
    nodes = {n.host.name: n for n in plan.nodes}

    def sync(node: NodePlan) -> None:
        t = session.t[node.host.name]
        t0 = time.monotonic()
        stats = sync_dir(t, plan.job.workdir, node.code_dir, plan.job.exclude, manifest)
        console.phase(node.host.name, f"code: sent {stats.files} file(s), {stats.bytes} bytes "
                      f"({stats.unchanged} unchanged, {time.monotonic() - t0:.2f}s)")
        if plan.job.data and node.data_dir:
            t0 = time.monotonic()
            d = sync_dir(t, plan.job.data, node.data_dir, (), data_manifest)
            console.phase(node.host.name, f"data: sent {d.files} file(s), {d.bytes} bytes "
                          f"({d.unchanged} unchanged, {time.monotonic() - t0:.2f}s)")
        t.write(f"{node.code_dir}/{SYNCED}", plan.run_id.encode(), 0o644)

    def prepare(node: NodePlan) -> None:
        t = session.t[node.host.name]
        t.run(sh("mkdir", "-p", "-m", "700", node.run_dir) + " && " + sh("mkdir", "-p",
              node.code_dir), what=f"create {node.run_dir}").check(node.host.name)
        if leader[node.host.name] == node.host.name:
            sync(node)
        for name, (text, mode) in render_node(plan, node).files.items():
            t.write(f"{node.run_dir}/{name}", text.encode(), mode)

    def confirm(node: NodePlan) -> None:
        """A node that shares its leader's storage sees the leader's sync; if it does not (a
        copied workdir, say), it gets its own."""
        t = session.t[node.host.name]
        seen = t.run(sh("cat", f"{node.code_dir}/{SYNCED}") + " 2>/dev/null",
                     what="read the sync marker").out.strip()
        if seen == plan.run_id:
            console.phase(node.host.name, f"code: shared with {leader[node.host.name]}")
        else:
            console.phase(node.host.name, "code: its storage is not shared after all; syncing")
            sync(node)

    results = each(nodes.items(), prepare)
    if not failures(results):
        results = each(((n, nodes[n]) for n in nodes if leader[n] != n), confirm)
    if failures(results):
        each(nodes.items(), lambda n: session.t[n.host.name].run(
            remote.remove_script(n.run_dir), what="clean up"))
        all_ok("prepare", results)


def start_all(session: Session, plan: Plan, console: Console) -> dict[str, int]:
    """Start the master, wait for its rendezvous port, then start the others in parallel."""
    m = plan.master
    tm = session.t[m.host.name]
    pids = {m.host.name: remote.start(tm, m.run_dir, plan.run_id)}
    console.phase(m.host.name, f"started master (pid {pids[m.host.name]})")
    try:
        remote.wait_port(tm, m.run_dir, m.master_addr, m.master_port, plan.job.start_timeout)
        console.phase(m.host.name, f"rendezvous {m.master_addr}:{m.master_port} is open")
        others = plan.nodes[1:]
        started = all_ok("start", each(((n.host.name, n) for n in others),
                                       lambda n: remote.start(session.t[n.host.name], n.run_dir,
                                                              plan.run_id)))
    except Exception:
        stop_all(session, plan, console)
        raise
    for name, pid in started.items():
        console.phase(name, f"started (pid {pid})")
    pids.update(started)
    return pids


def stop_all(session: Session, plan: Plan, console: Console,
             skip: set[str] | None = None) -> dict[str, str]:
    """Stop the run on every node (but `skip`); returns per host a problem, if any."""
    nodes = [n for n in plan.nodes if n.host.name not in (skip or set())]
    results = each(((n.host.name, n) for n in nodes),
                   lambda n: remote.stop(session.t[n.host.name], n.run_dir))
    problems = failures(results)
    for name, r in results.items():
        if isinstance(r, list) and r:
            problems[name] = f"processes still alive after SIGKILL: {r}"
    for name, why in problems.items():
        console.phase(name, f"stop: {why}")
    return problems


HEARTBEAT_S = 2.0  # how often every running node is asked to answer
HEARTBEAT_TIMEOUT_S = 10.0  # a node silent this long is declared lost


def stream(session: Session, plan: Plan, pids: dict[str, int], console: Console,
           logdir: Path | None = None) -> list[NodeOutcome]:
    """Follow every node's log until all have ended. The first node to fail or stop answering
    stops the run on every other node."""
    events: queue.Queue[tuple[str, int | Exception]] = queue.Queue()
    finished = threading.Event()
    index = {n.host.name: i for i, n in enumerate(plan.nodes)}
    nodes = {n.host.name: n for n in plan.nodes}
    outcomes: dict[str, NodeOutcome] = {}

    def follow(node: NodePlan) -> None:
        t = session.t[node.host.name]
        local_log = (open(logdir / f"{node.host.name}.log", "w", buffering=1)  # noqa: SIM115
                     if logdir else None)
        try:
            def on_line(line: str) -> None:
                if local_log:
                    local_log.write(line + "\n")
                tagged = tag_line(node.host.name, node.rank_base, line)
                console.line(tagged.tag, index[node.host.name], tagged.text)
            code = remote.follow(t, node.run_dir, pids.get(node.host.name), on_line, finished)
            events.put((node.host.name, code))
        except Exception as e:
            events.put((node.host.name, e))
        finally:
            if local_log:
                local_log.close()

    def heartbeat() -> None:
        # A cut link does not end a TCP stream for many minutes; a command that gets no answer
        # in HEARTBEAT_TIMEOUT_S does.
        while not finished.wait(HEARTBEAT_S):
            alive = [(n, t) for n, t in session.t.items() if n not in outcomes]
            answers = each(alive, lambda t: t.run("true", timeout=HEARTBEAT_TIMEOUT_S))
            for name, r in answers.items():
                if isinstance(r, Exception) and name not in outcomes:
                    events.put((name, TransportError(f"stopped answering: {reason(r)}")))

    threads = [threading.Thread(target=follow, args=(n,), daemon=True) for n in plan.nodes]
    threads.append(threading.Thread(target=heartbeat, daemon=True))
    for th in threads:
        th.start()
    first_failure: str | None = None
    try:
        while len(outcomes) < len(plan.nodes):
            name, result = events.get()
            if name in outcomes:
                continue
            node = nodes[name]
            if isinstance(result, Exception):
                outcome = NodeOutcome(name, node.node_rank, "lost", None, reason(result))
                session.t[name].close()
            else:
                st = remote.state(session.t[name], node.run_dir)
                outcome = NodeOutcome(name, node.node_rank, st.state, st.code)
            outcomes[name] = outcome
            if outcome.state != "succeeded" and first_failure is None:
                first_failure = name
                console.info(f"{name} (node rank {node.node_rank}) {_describe(outcome)}; "
                             "stopping the job on every other node")
                stop_all(session, plan, console, skip=set(outcomes))
    finally:
        finished.set()
    return [outcomes[n.host.name] for n in plan.nodes]


def _describe(o: NodeOutcome) -> str:
    if o.state == "lost":
        return f"is unreachable ({o.detail})"
    if o.code is None:
        return o.state
    if o.code > 128:
        return f"{o.state} (exit {o.code}, signal {o.code - 128})"
    return f"{o.state} (exit {o.code})"


def report(session: Session, plan: Plan, outcomes: list[NodeOutcome], console: Console) -> None:
    """Per node how it ended; for a failure, the first failing rank and its traceback."""
    for o in outcomes:
        console.phase(o.name, _describe(o))
    failed = [o for o in outcomes if o.state == "failed"]
    found = each(((o.name, o) for o in failed), lambda o: failure.explain(
        session.t[o.name], o.name, o.node_rank, plan.nodes[o.node_rank].run_dir))
    causes = [r for o in failed if isinstance(r := found[o.name], failure.RankFailure)]
    root = failure.first(causes)
    lost = [o for o in outcomes if o.state == "lost"]
    if root is not None:
        rank = f"rank {root.rank}" if root.rank is not None else "a rank"
        local = f" (local rank {root.local_rank})" if root.local_rank is not None else ""
        code = f", exit code {root.exitcode}" if root.exitcode is not None else ""
        console.info(f"first failure: {root.node} (node rank {root.node_rank}), {rank}{local}"
                     f"{code}:")
        for line in root.traceback.splitlines():
            console.info(f"    {line}")
        for line in format_diagnoses(diagnose(root.traceback + "\n" + root.log)):
            console.info(line)
    elif lost:
        console.info(f"first failure: {lost[0].name} is unreachable: {lost[0].detail}")
    first_name = root.node if root else (lost[0].name if lost else None)
    collateral = [o.name for o in outcomes if o.state != "succeeded" and o.name != first_name]
    if first_name and collateral:
        console.info("stopped as a consequence: " + ", ".join(collateral))


def up(inventory: Inventory, job: Job, console: Console, detach: bool = False,
       checks: bool = True, force: bool = False, allow_mismatch: bool = False) -> str:
    """Run the job on every host of the inventory; returns the run id, raises JobFailed."""
    run_id = new_run_id(job.name)
    console.hosts([h.name for h in inventory.hosts])
    console.info(f"run {run_id}: {job.name} on {len(inventory.hosts)} host(s)")
    session = connect(inventory, console)
    try:
        plan = prepare_plan(session, inventory, job, run_id, console,
                            allow_mismatch=allow_mismatch)
        if checks:
            preflight(session, plan, console, force)
        upload(session, plan, console)
        record = state.save(plan)
        try:
            pids = start_all(session, plan, console)
            if detach:
                console.info(f"run {run_id} started; follow it with `fleet logs -f {run_id}`")
                return run_id
            outcomes = stream(session, plan, pids, console, record.dir)
        except KeyboardInterrupt:
            console.info("interrupted: stopping the job on every node")
            stop_all(session, plan, console)
            raise
        report(session, plan, outcomes, console)
    finally:
        session.close()
    if any(o.state != "succeeded" for o in outcomes):
        raise JobFailed(f"run {run_id} failed (logs: `fleet logs {run_id}`)")
    console.info(f"run {run_id} succeeded on all {len(outcomes)} node(s)")
    return run_id
