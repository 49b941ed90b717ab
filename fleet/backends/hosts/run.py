"""A run on SSH hosts behind the backend seam: prepare (connect, claim, probe, plan, preflight,
record), schedule (upload, setup, start: the master first), stop, and the report of how each
node ended."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Generator
from pathlib import Path

from fleet import events, manifest
from fleet.backends.answers import NodeLook
from fleet.backends.base import Event, Final, Options, Run
from fleet.backends.hosts import heal, placing, setup, top, tracker, watchers
from fleet.backends.hosts import node as remote
from fleet.backends.hosts.events import follow_events
from fleet.backends.hosts.notifier import start_watch
from fleet.backends.hosts.prepare import (
    Session,
    check_job_python,
    claim_and_probe,
    prepare_plan,
    refuse_held,
)
from fleet.backends.hosts.stop import stop_nodes
from fleet.backends.hosts.upload import Sources, scan_sources, upload_checked
from fleet.config.inventory import Inventory
from fleet.config.job import Job, Launcher
from fleet.config.notify import Notify
from fleet.config.select import load_selected
from fleet.console import Console, Meaning
from fleet.errors import StartError, host_error
from fleet.facts import failure
from fleet.plan import NodePlan, Plan, new_run_id
from fleet.reports import Detached, Forgotten, Stopped
from fleet.run import faults, hang, watched
from fleet.run import record as state
from fleet.run.faults import Phase
from fleet.run.stopping import StopProgress
from fleet.states import NodeOutcome, NodeStatus, RunStatus, by_fail_fast, overall
from fleet.transport import Transport
from fleet.transport.forward import Tunnel
from fleet.transport.group import each
from fleet.transport.link import Link
from fleet.waits import named


def prepare(job: Job, console: Console, options: Options) -> HostsRun:
    """Everything before the first write a run owns: an unreadable file, an unreachable or busy
    host, a bad python stop it here, with nothing left anywhere."""
    inventory = with_spares(load_selected(job.inventory, job.selection), dict(options.replace))
    run_id = options.run_id or new_run_id(job.name)
    console.hosts([h.name for h in inventory.hosts])
    console.info(f"run {run_id}: {job.name} on {placing.needs(job.placement, inventory)}")
    sources = scan_sources(job, console)  # an unreadable file stops it before any connection
    faults.point(Phase.CONNECT.value)
    session, inventory = placing.connect_and_gate(inventory, job, run_id, options, console)
    try:
        # Before anything is written: another launch preparing these hosts stops this one.
        # The probe runs in the claim's round trip, once it holds each host.
        held = options.checks and not options.force
        claim_and_probe(session, inventory, run_id, console, held)
        faults.point(Phase.PROBE.value)
        plan = prepare_plan(session, inventory, job, run_id, console,
                            allow_mismatch=options.allow_mismatch, held=held,
                            run=options.parent)
        faults.point(Phase.PREFLIGHT.value)
        if held:
            refuse_held(session, job.name if job.placement.partial else "")
        # Before anything is on a node: `fleet stop RUN` finds it.
        record = state.save(plan, parent=options.parent)
    except BaseException:
        session.close()
        raise
    return HostsRun(session, plan, console, record.dir, record.secret, sources)


def with_spares(inventory: Inventory, replace: dict[str, str]) -> Inventory:
    """The inventory with spares in the places of the hosts they replace (so with their node
    ranks); the hosts replaced go out of it."""
    if not replace:
        return inventory
    spares = {h.name: h for h in inventory.spares}
    hosts = tuple(spares[replace[h.name]] if h.name in replace else h for h in inventory.hosts)
    used = set(replace.values())
    return dataclasses.replace(inventory, hosts=hosts,
                               spares=tuple(h for h in inventory.spares if h.name not in used))


class HostsRun(Run):
    def __init__(self, session: Session, plan: Plan, console: Console, record_dir: Path,
                 secret: str = "", sources: Sources | None = None) -> None:
        self.session, self.plan, self.console = session, plan, console
        self.run_id, self.job, self.record_dir = plan.run_id, plan.job, record_dir
        self.secret = secret  # the run's (RunRecord.secret): what proves a stop record fleet's
        self.sources = sources
        self.may_run: set[str] = set()  # nodes where a start was even attempted
        self.setting_up: set[str] = set()  # nodes where the job's setup may run
        self.pids: dict[str, int] = {}
        limit = plan.job.watchdog.unreachable_after
        self.links = {n.host.name: Link(session.transports, n.host.name, limit) for n in plan.nodes}
        self.lost: set[str] = set()  # nodes that answered nothing for unreachable_after
        self.stopping = False  # a stop of every node is under way
        self.progressed_at: float | None = None  # a rank's first line of its own
        self.problems: dict[str, str] = {}  # where the last stop may have left a process
        self.watch_port = 0  # where the master's watcher listens (a detached run)

    def key(self, host: str) -> str:
        """The node's stop key (record.stop_key)."""
        return state.stop_key(self.secret, self.run_id, host)

    # ---- schedule -------------------------------------------------------------------------
    def schedule(self, options: Options) -> None:
        session, plan, console = self.session, self.plan, self.console
        faults.point(Phase.UPLOAD.value)
        assert self.sources is not None
        console.event(events.Phase(events.Step.UPLOADING, self.run_id))
        sent = upload_checked(session, plan, console, options.checks, self.sources)
        if self.job.setup is not None:
            self.setting_up.update(n.host.name for n in plan.nodes)
            console.event(events.Phase(events.Step.SETUP, self.run_id))
        hashes = setup.run(session.transports, plan, console, options.force_setup)
        if self.job.python is not None:
            plan = self.plan = check_job_python(session, plan, console, options.allow_mismatch)
        plan = self.plan = tracker.ensure_run(session, plan, console, self.record_dir)
        m = manifest.record(plan, hashes, self.record_dir, sent)
        session.transports[plan.master.host.name].write(f"{plan.master.run_dir}/manifest.json",
                                                manifest.dumps(m).encode(), 0o600)
        # A detached run is confirmed by the master's open port, where fleet knows torchrun
        # opens one (a `command` may not).
        staged = heal.stage(session, plan, self.job, console, self.sources, self.record_dir,
                            options.detach)
        console.event(events.Phase(events.Step.STARTING, self.run_id))
        self.pids = self.start_all(
            wait_port=options.detach and self.job.launcher != Launcher.COMMAND,
            watch=options.detach, staged=staged)
        if staged is not None:
            heal.arm(session, plan, staged, self.secret, self.watch_port, console)
        session.release()  # its nodes run: the next launch sees them (refuse_held)

    def start_all(self, wait_port: bool = False, watch: bool = False,
                  staged: heal.Staged | None = None) -> dict[str, int]:
        """Start the master, then the others in parallel at once: their torchrun waits for
        the master's store itself, and meanwhile imports torch as the master's does. With
        `wait_port` (a detached run, which fleet will not watch), then wait until the master's
        rendezvous port is open. With `watch` (a detached run), the nodes' own watchers start
        with their parts, the master's first (fleet.backends.hosts.watchers). Each node counts
        as possibly running from the moment its start is attempted."""
        plan, session, console = self.plan, self.session, self.console
        m = plan.master
        tm = session.transports[m.host.name]
        if watch:
            watchers.write_config(tm, m, watchers.config(
                plan, m, self.secret, self.key(m.host.name), 0,
                staged.heal_for(m.host.name) if staged else None))
        state.mark_launched(self.record_dir)
        self.may_run.add(m.host.name)
        with console.hosts_waiting("start", [m.host.name]):
            pids = {m.host.name: self.start_one(tm, m)}
        console.event(started_event(m, pids[m.host.name], True))
        faults.point(Phase.MASTER_START.value)
        others = plan.nodes[1:]
        if watch:
            port = self.watch_port = watchers.master_port(tm, m.run_dir)
            wrote = each(((n.host.name, n) for n in others), lambda n: watchers.write_config(
                session.transports[n.host.name], n,
                watchers.config(plan, n, self.secret, self.key(n.host.name), port,
                                staged.heal_for(n.host.name) if staged else None)))
            if bad := {name: r for name, r in wrote.items() if isinstance(r, Exception)}:
                raise host_error("starting the nodes' watchers", bad, StartError)
            watched.mark(self.record_dir)
        self.may_run.update(n.host.name for n in others)
        with console.hosts_waiting("start", (n.host.name for n in others)) as wait:
            results = each(named((n.host.name, n) for n in others), wait.tracked(
                lambda n: self.start_one(session.transports[n.host.name], n)))
        bad = {name: r for name, r in results.items() if isinstance(r, Exception)}
        if bad:
            raise host_error("starting the job", bad, StartError)
        started = {name: pid for name, pid in results.items() if isinstance(pid, int)}
        for n in others:
            if n.host.name in started:
                console.event(started_event(n, started[n.host.name]))
        faults.point(Phase.WORKER_START.value)
        pids.update(started)
        if wait_port:
            with console.waiting(f"waiting for the rendezvous {m.master_addr}:{m.master_port} "
                                 f"to open on {m.host.name}"):
                remote.wait_port(tm, m.run_dir, m.master_addr, m.master_port,
                                 plan.job.start_timeout, self.key(m.host.name))
            console.phase(m.host.name, f"rendezvous {m.master_addr}:{m.master_port} is open")
        return pids

    def start_one(self, t: Transport, n: NodePlan) -> int:
        """Start the node's wrapper; what start.sh saw of it (pid, start time) is kept in the
        run's record at once: the stops to come take the run's start and session from there,
        not from the run directory, which the job can write."""
        pid, wrapper = remote.start(t, n.run_dir, self.run_id)
        if wrapper is not None:
            state.note_wrapper(self.record_dir, n.host.name, wrapper)
        return pid

    def started(self) -> bool:
        return bool(self.may_run)

    def progressed(self) -> float | None:
        return self.progressed_at

    def detached(self) -> Detached:
        self.session.leases = {}  # they go with the run (its nodes' run.sh and stop.sh)
        return Detached(self.run_id, len(self.pids), len(self.plan.nodes))

    def watch_end(self, notify: Notify) -> str:
        m = self.plan.master
        return start_watch(self.session.transports[m.host.name], notify, m.run_dir,
                           self.pids[m.host.name], self.run_id, self.job.name,
                           self.key(m.host.name))

    def events(self) -> Generator[Event, None, None]:
        return follow_events(self)

    # ---- stop -----------------------------------------------------------------------------
    def stop(self, by: str, skip: set[str] | None = None) -> dict[str, str]:
        """A node not started yet is marked stopped too, so that it never starts and says
        why."""
        self.stopping = True
        faults.point(Phase.STOP.value)
        nodes = [n for n in self.plan.nodes if n.host.name not in (skip or set())]
        # A node whose part has ended is stopped too (it answers, so it costs one command):
        # what its part started may outlive it, and the run's stop ends that as well.
        ended = [n for n in self.plan.nodes if n.host.name in (skip or set())
                 and n.host.name in self.may_run and n.host.name not in self.lost]
        if not skip:
            self.console.info(f"stopping the job on {len(nodes)} node(s)")
        # With [restart], a lost node's stop goes on in the background (attempts.Left): the
        # next attempt does not wait for it.
        retry = 0.0 if self.job.restart.max else self.job.watchdog.unreachable_after
        progress = StopProgress([n.host.name for n in nodes], self.console.event)
        with self.console.waiting(f"stopping the job on {len(nodes)} node(s)"), progress:
            problems = stop_nodes(self.session, nodes + ended, self.console, by, self.key,
                                  lambda host: state.wrapper(self.record_dir, host),
                                  self.links, self.lost, retry, progress.heard)
        self.problems = {n: why for n, why in problems.items() if n in self.may_run}
        return self.problems

    def forget(self) -> Forgotten:
        """Before any start, the run directories go again (best effort), after a stop of
        whatever of the run may be there (a setup still running); and the local record."""
        def forget(n: NodePlan) -> None:
            t = self.session.transports[n.host.name]
            if n.host.name in self.setting_up:
                remote.stop(t, n.run_dir, "fleet up, before anything started",
                            self.key(n.host.name))
            t.run(remote.remove_script(n.run_dir), what="clean up")

        each(((n.host.name, n) for n in self.plan.nodes), forget)
        shutil.rmtree(self.record_dir, ignore_errors=True)
        return Forgotten()

    def stopped(self, problems: dict[str, str]) -> Stopped:
        return Stopped(self.run_id, tuple(problems.items()))

    def halted(self) -> Stopped:
        return self.stopped(self.problems)

    def _live(self, skip: set[str]) -> dict[str, tuple[Transport, str]]:
        return {n.host.name: (self.session.transports[n.host.name], n.run_dir)
                for n in self.plan.nodes if n.host.name not in skip}

    def stacks(self, hung: bool, skip: set[str]) -> tuple[list[str], list[str]]:
        return hang.take(self._live(skip), self.run_id, self.record_dir, hung=hung)

    def ranks(self) -> dict[str, NodeLook | Exception]:
        return top.look(self._live(set()))

    def report(self, outcomes: dict[str, NodeOutcome]) -> Final:
        """Per node how it ended; for a failure, the first failing rank and its traceback;
        what was stopped, by whom, and what may still run."""
        ordered = [outcomes[n.host.name] for n in self.plan.nodes]
        final, first, cause = report(self.session, self.plan, ordered, self.console)
        if final is RunStatus.SUCCEEDED:
            return Final(final, f"on all {len(ordered)} node(s)")
        if final is RunStatus.STOPPED:
            by = next((o.detail for o in ordered if o.status is NodeStatus.STOPPED), "")
            return Final(final, f" by {by}" if by else "")
        return Final(final, failure=tuple(first), cause=cause)

    def tunnel(self) -> Tunnel:
        return Tunnel(self.session.transports[m := self.plan.master.host.name], m)

    def close(self) -> None:
        self.session.close()


def started_event(n: NodePlan, pid: int, master: bool = False) -> events.NodeStarted:
    """A node's start, with its global ranks where the plan knows them."""
    ranks = tuple(range(n.rank_base, n.rank_base + n.nproc)) \
        if n.rank_base is not None and isinstance(n.nproc, int) else ()
    return events.NodeStarted(n.host.name, n.node_rank, ranks, pid, master)


MEANINGS = {NodeStatus.SUCCEEDED: Meaning.OK, NodeStatus.FAILED: Meaning.FAIL,
            NodeStatus.UNREACHABLE: Meaning.FAIL, NodeStatus.STOPPED: Meaning.WARN}


def report(session: Session, plan: Plan, outcomes: list[NodeOutcome],
           console: Console) -> tuple[RunStatus, list[str], str]:
    """Says how each node ended and the first failure; returns the run's state, the first
    failure's lines (for `[notify]`) and its cause in a few words (for `[restart]`)."""
    for o in outcomes:
        console.phase(o.name, o.describe(), MEANINGS.get(o.status, Meaning.PLAIN))
    failed = [o for o in outcomes if o.status is NodeStatus.FAILED]
    with console.hosts_waiting("the failure's report", (o.name for o in failed)) as wait:
        found = each(named((o.name, o) for o in failed), wait.tracked(lambda o: failure.explain(
            session.transports[o.name], o.name, o.node_rank, plan.nodes[o.node_rank].run_dir,
            kernel_log=True)))
    causes = [r for o in failed if isinstance(r := found[o.name], failure.RankFailure)]
    root = failure.first(causes)
    lost = [o for o in outcomes if o.status is NodeStatus.UNREACHABLE]
    lost_first = {o.name for o in outcomes if by_fail_fast(o.detail, o.name)}
    first: list[str] = []
    if root is not None:
        first = failure.summary(root)
    elif lost:
        first = [f"first failure: {lost[0].name} is unreachable: {lost[0].detail}"]
    elif failed:
        first = [f"first failure: {failed[0].name} (node rank {failed[0].node_rank}), no error "
                 f"report found there: see `fleet logs {plan.run_id} --node {failed[0].name}`"]
    for line in first:
        console.info(line)
    first_name = root.node if root else (lost[0].name if lost else
                                         failed[0].name if failed else None)
    others = [o for o in failed if o.name != first_name]
    if others:
        console.info("also failed: " + ", ".join(o.name for o in others))
    # Not a node lost, then stopped once it answered: the fail-fast was its own.
    collateral = [o.name for o in outcomes if o.status is NodeStatus.STOPPED
                  and by_fail_fast(o.detail) and o.name not in lost_first]
    if collateral:
        console.info("stopped as a consequence: " + ", ".join(collateral))
    if lost:
        names = ", ".join(o.name for o in lost)
        console.info(f"{names} could not be reached: {'its' if len(lost) == 1 else 'their'} part "
                     f"of the run may still be running; stop it with `fleet stop {plan.run_id}` "
                     "once it answers")
    return overall(o.status for o in outcomes), first, failure.cause(root) if root else ""
