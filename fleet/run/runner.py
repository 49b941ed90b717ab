"""A run's lifecycle as one state machine with one guard: connect, probe, preflight, upload, start
(master first), stream, and one teardown that every way out passes through.

From the moment anything may run on a node, `Guard` owns the run: success, a failing node, a
lost node, an exception, or any number of signals all end in a stop on every node that may hold
a process, and in a final state that says what really happened (torch's elastic agent does the
same with `_shutdown()` in a `finally`)."""

from __future__ import annotations

import contextlib
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from fleet import manifest
from fleet.backends.hosts import node as remote
from fleet.backends.hosts import setup
from fleet.backends.hosts.claim import claim_all
from fleet.backends.hosts.prepare import (
    Session,
    check_job_python,
    connect,
    prepare_plan,
    refuse_held,
    scan_sources,
    upload_checked,
)
from fleet.config.inventory import Inventory
from fleet.config.job import Job
from fleet.console import Console
from fleet.errors import (
    CommandTimedOut,
    FleetError,
    Interrupted,
    JobFailed,
    RunStopped,
    StartError,
    TransportError,
    host_error,
)
from fleet.facts import failure, run_state
from fleet.plan import NodePlan, Plan, new_run_id
from fleet.run import faults, hang
from fleet.run import record as state
from fleet.run.logs import AfterStop, Tagger
from fleet.run.signals import SignalGuard
from fleet.run.states import NodeStatus, RunStatus, overall
from fleet.transport import Received, Transport
from fleet.transport.group import each, failures, reason
from fleet.transport.link import RETRY_S, Link

R = TypeVar("R")


class Phase(Enum):
    """Where `fleet up` is; a fault test can strike at each boundary (see fleet.run.faults)."""

    CONNECT = "connect"
    PROBE = "probe"
    PREFLIGHT = "preflight"
    UPLOAD = "upload"
    SETUP = "setup"  # struck from the setup's first line of output (fleet.backends.hosts.setup)
    MASTER_START = "master-start"
    WORKER_START = "worker-start"
    STREAM = "stream"
    STOP = "stop"


@dataclass(frozen=True)
class NodeOutcome:
    name: str
    node_rank: int
    status: NodeStatus
    code: int | None = None
    detail: str = ""  # who stopped it, or why it could not be reached
    own_failure: str = ""  # failed although stopped: how its own part had failed before

    def describe(self) -> str:
        if self.status is NodeStatus.UNREACHABLE:
            return f"is unreachable ({self.detail})"
        words: str = self.status.value
        exit_words = ""
        if self.code is not None:
            signal_part = f", signal {self.code - 128}" if self.code > 128 else ""
            exit_words = f"exit {self.code}{signal_part}"
        if self.own_failure:
            # The stop came after the failure: its exit code may be the stop's, not the cause.
            then = f"; then {exit_words}" if exit_words else ""
            return (f"{words}: {self.own_failure} before the stop ({self.detail}) reached "
                    f"it{then}")
        if exit_words:
            words += f" ({exit_words})"
        if self.status is NodeStatus.STOPPED and self.detail:
            words += f" by {self.detail}"
        return words


class Guard(SignalGuard):
    """The one teardown of a run (see the module's docstring). Signals: the first one ends the
    run (it raises Interrupted where the main thread is); any later one is only counted, so
    that nothing can cut the teardown short."""

    def __init__(self, session: Session, plan: Plan, console: Console,
                 record_dir: Path, secret: str = "") -> None:
        super().__init__()
        self.session, self.plan, self.console = session, plan, console
        self.record_dir = record_dir  # the local record, dropped if nothing ever started
        self.secret = secret  # the run's (RunRecord.secret): what proves a stop record fleet's
        self.may_run: set[str] = set()  # nodes where a start was even attempted
        self.setting_up: set[str] = set()  # nodes where the job's setup may run
        self.ended = False  # every node's part ended by itself: nothing left to stop
        self.released = False  # detached on purpose: the run goes on without fleet
        self.hang: str | None = None  # the watchdog's verdict, where it stopped the run
        limit = plan.job.watchdog.unreachable_after
        self.links = {n.host.name: Link(session.t, n.host.name, limit) for n in plan.nodes}
        self.lost: set[str] = set()  # nodes that answered nothing for unreachable_after

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.hold()
        try:
            if self.released and exc is None:
                return
            if self.ended:
                if isinstance(exc, Interrupted):
                    raise Interrupted(exc.signame, "the run had already ended") from None
                return
            if self.may_run:
                problems = self.stop(self._why(exc))
            else:  # no run ever existed: its directories and record go
                problems = {}
                self._forget()
                shutil.rmtree(self.record_dir, ignore_errors=True)
            if isinstance(exc, Interrupted):
                raise Interrupted(exc.signame, self._summary(problems)) from None
            self.console.info(self._summary(problems))
        finally:
            self.release_signals()

    def key(self, host: str) -> str:
        """The node's stop key (state.stop_key)."""
        return state.stop_key(self.secret, self.plan.run_id, host)

    def _why(self, exc: BaseException | None) -> str:
        if isinstance(exc, Interrupted):
            return f"fleet up, interrupted ({exc.signame})"
        if exc is None:
            return "fleet up, which ended before the run"
        return f"fleet up, after an error: {reason(exc) if isinstance(exc, Exception) else exc}"

    def stop(self, by: str, skip: set[str] | None = None) -> dict[str, str]:
        """Stop the run on every node (but `skip`), saying who stops it; a node not started
        yet is marked stopped, so that it never starts and says why. Per node a problem, if
        any, where the node may hold a process."""
        faults.point(Phase.STOP.value)
        nodes = [n for n in self.plan.nodes if n.host.name not in (skip or set())]
        if not skip:
            self.console.info(f"stopping the job on {len(nodes)} node(s)")
        problems = stop_nodes(self.session, nodes, self.console, by, self.key, self.links,
                              self.lost, self.plan.job.watchdog.unreachable_after)
        return {n: why for n, why in problems.items() if n in self.may_run}

    def _forget(self) -> None:
        """Before any start, the run directories go again (best effort), after a stop of
        whatever of the run may be there (a setup still running)."""
        def forget(n: NodePlan) -> None:
            t = self.session.t[n.host.name]
            if n.host.name in self.setting_up:
                remote.stop(t, n.run_dir, "fleet up, before anything started",
                            self.key(n.host.name))
            t.run(remote.remove_script(n.run_dir), what="clean up")

        each(((n.host.name, n) for n in self.plan.nodes), forget)

    def _summary(self, problems: dict[str, str]) -> str:
        if not self.may_run:
            return "nothing had been started on any node"
        if not problems:
            return "the job was stopped on every node"
        names = ", ".join(problems)
        return (f"the job could not be stopped on {names} (it may still run there); finish the "
                f"stop with `fleet stop {self.plan.run_id}` once it answers")


def stop_nodes(session: Session, nodes: list[NodePlan], console: Console, by: str,
               key: Callable[[str], str], links: dict[str, Link] | None = None,
               lost: set[str] | None = None, retry_for: float = 0.0) -> dict[str, str]:
    """Stop the run on these nodes, every node's stop recorded before any is signalled
    (remote.stop_together). Where a node's connection fails (or it was lost), the stop is
    retried on fresh connections for `retry_for` seconds: a node that stalled for a while is
    stopped once it answers again."""
    links, lost = links or {}, lost or set()

    def target(n: NodePlan) -> remote.Target:
        @contextlib.contextmanager
        def held() -> Iterator[tuple[Transport, str, str]]:
            link = links.get(n.host.name)
            yield (link.t if link else session.t[n.host.name]), n.run_dir, key(n.host.name)
        return held

    reachable = [n for n in nodes if n.host.name not in lost]
    results = remote.stop_together([(n.host.name, target(n)) for n in reachable], by)
    why = {n.host.name: "it was lost" for n in nodes if n.host.name in lost}
    why.update({name: reason(r) for name, r in results.items()
                if isinstance(r, TransportError | CommandTimedOut)})
    again = [n for n in nodes if n.host.name in why and n.host.name in links]
    results.update(each(((n.host.name, n) for n in again), lambda n: stop_afresh(
        links[n.host.name], n, by, key(n.host.name), why[n.host.name], retry_for, console)))
    problems = failures(results)
    for name, r in results.items():
        if isinstance(r, list) and r:
            problems[name] = f"processes still alive after SIGKILL: {r}"
    for name, problem in problems.items():
        console.phase(name, f"stop failed: {problem}")
    return problems


def stop_afresh(link: Link, node: NodePlan, by: str, key: str, why: str, retry_for: float,
                console: Console) -> list[int]:
    """The stop on a fresh connection, tried until one answers or `retry_for` has passed (the
    link is given up then)."""
    name = node.host.name
    console.phase(name, f"no stop on its connection ({why}); trying fresh connections for up "
                        f"to {retry_for:g}s (watchdog.unreachable_after)")
    deadline = time.monotonic() + retry_for
    while True:
        try:
            t = link.fresh(max(deadline - time.monotonic(), 1.0), link.generation)
            break
        except FleetError as e:
            if time.monotonic() + RETRY_S >= deadline:
                link.give_up()
                raise TransportError(f"no fresh connection answered within {retry_for:g}s: "
                                     f"{e}") from e
            time.sleep(RETRY_S)
    try:
        left = remote.stop(t, node.run_dir, by, key)
    except FleetError:
        link.give_up()
        raise
    console.phase(name, "answered on a fresh connection: the stop reached it")
    return left


def start_all(guard: Guard, wait_port: bool = False) -> dict[str, int]:
    """Start the master, then the others in parallel at once: their torchrun waits for the
    master's store itself, and meanwhile imports torch as the master's does. With `wait_port`
    (a detached run, which fleet will not watch), then wait until the master's rendezvous
    port is open. Each node counts as possibly running from the moment its start is
    attempted."""
    plan, session, console = guard.plan, guard.session, guard.console
    m = plan.master
    tm = session.t[m.host.name]
    state.mark_launched(guard.record_dir)
    guard.may_run.add(m.host.name)
    pids = {m.host.name: remote.start(tm, m.run_dir, plan.run_id)}
    console.phase(m.host.name, f"started master (pid {pids[m.host.name]})")
    faults.point(Phase.MASTER_START.value)
    others = plan.nodes[1:]
    guard.may_run.update(n.host.name for n in others)
    results = each(((n.host.name, n) for n in others), lambda n: remote.start(
        session.t[n.host.name], n.run_dir, plan.run_id))
    bad = {name: r for name, r in results.items() if isinstance(r, Exception)}
    if bad:
        raise host_error("starting the job", bad, StartError)
    started = {name: pid for name, pid in results.items() if isinstance(pid, int)}
    for name, pid in started.items():
        console.phase(name, f"started (pid {pid})")
    faults.point(Phase.WORKER_START.value)
    pids.update(started)
    if wait_port:
        remote.wait_port(tm, m.run_dir, m.master_addr, m.master_port, plan.job.start_timeout,
                         guard.key(m.host.name))
        console.phase(m.host.name, f"rendezvous {m.master_addr}:{m.master_port} is open")
    return pids


def stream(guard: Guard, pids: dict[str, int], logdir: Path | None = None) -> list[NodeOutcome]:
    """Follow every node's log until all have ended and every log is read. A node's end is an
    event of its own (remote.wait_end, on a channel beside the log's): the first node to fail,
    or to answer nothing for unreachable_after, stops the run on every other node at once,
    while the rest of its log still comes; so does silence from every node for the job's
    hang_timeout, after every rank's stack was taken. A stream whose connection broke goes on
    from where it was on a fresh one."""
    plan, console = guard.plan, guard.console
    hang_timeout = plan.job.watchdog.hang_timeout
    events: queue.Queue[tuple[str, str, object]] = queue.Queue()
    finished = threading.Event()
    index = {n.host.name: i for i, n in enumerate(plan.nodes)}
    nodes = {n.host.name: n for n in plan.nodes}
    received = {n.host.name: Received() for n in plan.nodes}
    outcomes: dict[str, NodeOutcome] = {}
    drained: set[str] = set()  # nodes whose log was read to its end (or can no more be)
    ends: set[str] = set()  # nodes whose end watcher has said what it knows

    def follow(node: NodePlan) -> None:
        name = node.host.name
        link = guard.links[name]
        local_log = (open(logdir / f"{name}.log", "w", buffering=1)  # noqa: SIM115
                     if logdir else None)
        tag = Tagger(name, node.rank_base, lambda: run_state.ranks(link.t, node.run_dir))
        quiet = after_stop(guard, node, link)

        def on_lines(lines: list[str]) -> None:
            if local_log:
                local_log.write("".join(line + "\n" for line in lines))
            console.lines(index[name], [(tg.tag, tg.text) for tg in map(tag, quiet(lines))])
            quiet.tell()

        try:
            events.put(("drained", name, on_link(link, finished, lambda t: remote.follow(
                t, node.run_dir, pids.get(name), on_lines, finished, received[name]))))
        except Exception as e:
            events.put(("drained", name, e))
        finally:
            if local_log:
                local_log.close()

    def watch(node: NodePlan) -> None:
        name = node.host.name
        pid = pids.get(name)
        if pid is None:  # no wrapper to wait for: its log's end says it all
            events.put(("end", name, None))
            return
        try:
            events.put(("end", name, on_link(guard.links[name], finished,
                                              lambda t: remote.wait_end(
                                                  t, node.run_dir, pid, guard.key(name),
                                                  finished))))
        except Exception as e:
            events.put(("end", name, e))

    def keep(node: NodePlan) -> None:
        name = node.host.name
        guard.links[name].keep(finished, lambda: name in outcomes,
                               lambda why: events.put(("lost", name, why)))

    threads = [threading.Thread(target=fn, args=(n,), daemon=True)
               for n in plan.nodes for fn in (follow, watch, keep)]
    for th in threads:
        th.start()
    faults.point(Phase.STREAM.value)
    stopping = False
    try:
        # A node lost, then reached again, also says how it ended.
        while not all(n in outcomes and n in drained and (n not in guard.lost or n in ends)
                      for n in nodes):
            try:
                kind, name, result = events.get(timeout=1.0 if hang_timeout else None)
            except queue.Empty:
                silent = time.monotonic() - max(r.arrived for r in received.values())
                if hang_timeout and not stopping and silent > hang_timeout:
                    stopping = True
                    on_hang(guard, silent, skip={n for n, o in outcomes.items()
                                                 if o.status.is_terminal})
                continue
            node = nodes[name]
            outcome = None
            if kind == "end":
                ends.add(name)
            if kind == "drained":
                drained.add(name)
                if name not in outcomes and isinstance(result, int | Exception):
                    outcome = _outcome(guard, node, result)
                elif isinstance(result, Exception):
                    console.phase(name, f"the rest of its log could not be read: "
                                        f"{reason(result)} (`fleet logs {plan.run_id} --node "
                                        f"{name}` reads it from the node)")
            elif kind == "end" and isinstance(result, run_state.NodeState) and result.done:
                known = outcomes.get(name)
                outcome = NodeOutcome(name, node.node_rank, result.status, result.code,
                                      result.stopped_by, result.own_failure)
                if known is not None:
                    if known.status is NodeStatus.UNREACHABLE:
                        # Lost, then reached by the stop: what it says now is what happened.
                        console.phase(name, f"answered again: {outcome.describe()}")
                        outcomes[name] = outcome
                    continue  # its loss already set off the fail-fast
            elif kind == "end" and isinstance(result, Exception) and name not in outcomes:
                outcome = _outcome(guard, node, result)
            elif kind == "lost" and name not in outcomes:
                guard.lost.add(name)
                guard.links[name].t.close()  # its streams go on from a fresh connection
                outcome = NodeOutcome(name, node.node_rank, NodeStatus.UNREACHABLE, None,
                                      str(result))
                if stopping:
                    guard.links[name].give_up()  # the stop already under way missed it
            if outcome is None:
                continue
            outcomes[name] = outcome
            if outcome.status is not NodeStatus.SUCCEEDED and not stopping:
                stopping = True
                if outcome.status is NodeStatus.STOPPED:
                    by = outcome.detail or "a stop"
                    console.info(f"{name} (node rank {node.node_rank}) was stopped by {by}; "
                                 "stopping the job on every other node")
                else:
                    by = f"fail-fast: {name} {outcome.status.value}"
                    console.info(f"{name} (node rank {node.node_rank}) {outcome.describe()}; "
                                 "stopping the job on every other node")
                # Every node not known to have ended, the unreachable ones too (retried on
                # fresh connections while unreachable_after allows).
                guard.stop(by, skip={n for n, o in outcomes.items() if o.status.is_terminal})
    finally:
        finished.set()
    return [outcomes[n.host.name] for n in plan.nodes]


def on_link(link: Link, stop: threading.Event, fn: Callable[[Transport], R]) -> R:
    """fn(the node's connection), again on a fresh one each time the connection breaks, until
    the link is given up (then the last error) or `stop` is set."""
    while True:
        generation = link.generation
        try:
            return fn(link.t)
        except FleetError:
            if stop.is_set() or not link.recover(generation, stop):
                raise


def on_hang(guard: Guard, silent: float, skip: set[str]) -> None:
    """No node printed for hang_timeout: take every rank's stack, say which rank is different
    (or, before any rank started, which node has not joined), keep it, stop the run."""
    plan, session, console = guard.plan, guard.session, guard.console
    limit = plan.job.watchdog.hang_timeout
    console.info(f"hang: no node has printed anything for {silent:.0f}s (hang_timeout = "
                 f"{limit:g}s); taking every rank's stack")
    live = {n.host.name: (session.t[n.host.name], n.run_dir) for n in plan.nodes
            if n.host.name not in skip}
    lines, problems = hang.take(live, plan.run_id, guard.record_dir, hung=True)
    for line in lines + problems:
        console.info(f"  {line}")
    saved = hang.save(guard.record_dir, f"hang of run {plan.run_id}: no output for "
                      f"{silent:.0f}s", lines + problems)
    guard.hang = f"{lines[0]} (stacks kept in {saved})"
    guard.stop(f"watchdog: no output for {limit:g}s (a hang)", skip=skip)


def after_stop(guard: Guard, node: NodePlan, link: Link) -> AfterStop:
    """The attached stream's filter for one node: from the line where fleet's stop of it began
    (the node confirms its stop record), what it prints is hidden here, once said so."""
    name = node.host.name

    def confirm() -> str:
        with contextlib.suppress(FleetError):
            return run_state.state(link.t, node.run_dir, guard.key(name)).stopped_by
        return ""

    def announce(by: str) -> None:
        guard.console.phase(name, f"what it prints while it is stopped ({by}) is not shown "
                                  f"here: `fleet logs {guard.plan.run_id} --node {name}` has it")

    return AfterStop(confirm, announce)


def _outcome(guard: Guard, node: NodePlan, result: int | Exception) -> NodeOutcome:
    name = node.host.name
    if not isinstance(result, Exception):
        try:
            st = run_state.state(guard.links[name].t, node.run_dir, guard.key(name))
        except FleetError as e:
            result = e
        else:
            if st.done:
                return NodeOutcome(name, node.node_rank, st.status, st.code, st.stopped_by,
                                   st.own_failure)
            # Its log stream ended while it still ran: fleet lost sight of it, and says so.
            return NodeOutcome(name, node.node_rank, NodeStatus.UNREACHABLE, None,
                               f"its log stream ended while it was still {st.status.value}")
    guard.links[name].give_up()
    return NodeOutcome(name, node.node_rank, NodeStatus.UNREACHABLE, None, reason(result))


def report(session: Session, plan: Plan, outcomes: list[NodeOutcome],
           console: Console) -> RunStatus:
    """Per node how it ended; for a failure, the first failing rank and its traceback; what
    was stopped, by whom, and what may still run. Returns the run's final state."""
    for o in outcomes:
        console.phase(o.name, o.describe())
    failed = [o for o in outcomes if o.status is NodeStatus.FAILED]
    found = each(((o.name, o) for o in failed), lambda o: failure.explain(
        session.t[o.name], o.name, o.node_rank, plan.nodes[o.node_rank].run_dir,
        kernel_log=True))
    causes = [r for o in failed if isinstance(r := found[o.name], failure.RankFailure)]
    root = failure.first(causes)
    lost = [o for o in outcomes if o.status is NodeStatus.UNREACHABLE]
    lost_first = {o.name for o in outcomes if o.detail.startswith(f"fail-fast: {o.name} ")}
    if root is not None:
        for line in failure.summary(root):
            console.info(line)
    elif lost:
        console.info(f"first failure: {lost[0].name} is unreachable: {lost[0].detail}")
    elif failed:
        console.info(f"first failure: {failed[0].name} (node rank {failed[0].node_rank}), no "
                     f"error report found there: see `fleet logs {plan.run_id} --node "
                     f"{failed[0].name}`")
    first_name = root.node if root else (lost[0].name if lost else
                                         failed[0].name if failed else None)
    others = [o for o in failed if o.name != first_name]
    if others:
        console.info("also failed: " + ", ".join(o.name for o in others))
    # Not a node lost, then stopped once it answered: the fail-fast was its own.
    collateral = [o.name for o in outcomes if o.status is NodeStatus.STOPPED
                  and o.detail.startswith("fail-fast") and o.name not in lost_first]
    if collateral:
        console.info("stopped as a consequence: " + ", ".join(collateral))
    for o in lost:
        console.info(f"{o.name} could not be reached: its part of the run may still be running; "
                     f"stop it with `fleet stop {plan.run_id}` once it answers")
    return overall(o.status for o in outcomes)


def up(inventory: Inventory, job: Job, console: Console, detach: bool = False,
       checks: bool = True, force: bool = False, allow_mismatch: bool = False,
       force_setup: bool = False) -> str:
    """Run the job on every host of the inventory; returns the run id. Raises JobFailed,
    RunStopped or Interrupted, each saying what was left where."""
    run_id = new_run_id(job.name)
    console.hosts([h.name for h in inventory.hosts])
    console.info(f"run {run_id}: {job.name} on {len(inventory.hosts)} host(s)")
    sources = scan_sources(job, console)  # an unreadable file stops it before any connection
    try:
        faults.point(Phase.CONNECT.value)
        session = connect(inventory, console)
    except Interrupted as e:
        raise Interrupted(e.signame, "nothing had been started on any node") from None
    try:
        try:
            # Before anything is written: another launch preparing these hosts stops this one.
            session.claims = claim_all(session.t, inventory.hosts, run_id, console)
            faults.point(Phase.PROBE.value)
            plan = prepare_plan(session, inventory, job, run_id, console,
                                allow_mismatch=allow_mismatch, held=checks and not force)
            faults.point(Phase.PREFLIGHT.value)
            if checks and not force:
                refuse_held(session)
            record = state.save(plan)  # before anything is on a node: `fleet stop RUN` finds it
        except Interrupted as e:
            raise Interrupted(e.signame, "nothing had been started on any node") from None
        with Guard(session, plan, console, record.dir, record.secret) as guard:
            faults.point(Phase.UPLOAD.value)
            sent = upload_checked(session, plan, console, checks, sources)  # port checks beside
            if job.setup is not None:
                guard.setting_up.update(n.host.name for n in plan.nodes)
            hashes = setup.run(session.t, plan, console, force_setup)
            if job.python is not None:
                plan = guard.plan = check_job_python(session, plan, console, allow_mismatch)
            m = manifest.record(plan, hashes, record.dir, sent)
            session.t[plan.master.host.name].write(f"{plan.master.run_dir}/manifest.json",
                                                    manifest.dumps(m).encode(), 0o600)
            # A detached run is confirmed by the master's open port, where fleet knows torchrun
            # opens one (a `command` may not).
            pids = start_all(guard, wait_port=detach and job.launcher != "command")
            session.release()  # its nodes run: the next launch sees them (refuse_held)
            if detach:
                guard.released = True
                console.info(f"run {run_id} started; follow it with `fleet logs -f {run_id}`")
                return run_id
            outcomes = stream(guard, pids, record.dir)
            guard.ended = True
            final = report(session, plan, outcomes, console)
    finally:
        session.close()
    if guard.hang is not None:
        raise JobFailed(f"run {run_id} hung: {guard.hang}; it was stopped on every node "
                        f"(logs: `fleet logs {run_id}`)")
    if final is RunStatus.SUCCEEDED:
        console.info(f"run {run_id} succeeded on all {len(outcomes)} node(s)")
        return run_id
    if final is RunStatus.STOPPED:
        by = next((o.detail for o in outcomes if o.status is NodeStatus.STOPPED), "")
        raise RunStopped(f"run {run_id} was stopped{' by ' + by if by else ''}")
    if final is RunStatus.FAILED:
        raise JobFailed(f"run {run_id} failed (logs: `fleet logs {run_id}`)")
    raise JobFailed(f"run {run_id} ended in an unknown state: fleet lost sight of a node "
                    f"(logs: `fleet logs {run_id}`)", exit_code=final.exit_code)
