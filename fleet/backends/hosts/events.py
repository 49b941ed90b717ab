"""A running job on hosts as a stream of events: every node's log followed (tagged by host and
rank), its end watched on a channel beside the log's, and its connection asked every heartbeat;
a node's end or loss is pushed as it happens (the runner's monitor decides what follows)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Protocol, TypeVar

from fleet.backends.base import Event, NodeEnded, Quiet
from fleet.backends.hosts import node as remote
from fleet.config.job import Launcher
from fleet.console import Console
from fleet.errors import FleetError
from fleet.facts import run_state
from fleet.plan import NodePlan, Plan
from fleet.run import faults
from fleet.run.faults import Phase
from fleet.run.logs import AfterStop, Tagger, progress
from fleet.states import NodeOutcome, NodeStatus
from fleet.transport import Received, Transport
from fleet.transport.group import each, reason
from fleet.transport.link import Link
from fleet.waits import NAMED, SLOW_S

R = TypeVar("R")
CONFIRM_TRIES = 3  # looks at a node's stop record when its log says a stop began


class Followed(Protocol):
    """What following a run's nodes needs of it (fleet.backends.hosts.run.HostsRun is one)."""

    run_id: str
    plan: Plan
    console: Console
    record_dir: Path  # where each node's log is kept
    pids: dict[str, int]
    links: dict[str, Link]
    lost: set[str]
    stopping: bool
    progressed_at: float | None  # when a rank first printed a line of its own

    def key(self, host: str) -> str: ...


def follow_events(run: Followed) -> Generator[Event, None, None]:
    """Until every node has ended and every log is read. A stream whose connection broke goes
    on from where it was on a fresh one; a node lost, then reached again, also says how it
    ended (a second NodeEnded)."""
    plan, console, pids, logdir = run.plan, run.console, run.pids, run.record_dir
    ranked = plan.job.launcher != Launcher.COMMAND  # a worker's lines carry its (local) rank
    events: queue.Queue[tuple[str, str, object]] = queue.Queue()
    finished = threading.Event()
    index = {n.host.name: i for i, n in enumerate(plan.nodes)}
    nodes = {n.host.name: n for n in plan.nodes}
    received = {n.host.name: Received() for n in plan.nodes}
    outcomes: dict[str, NodeOutcome] = {}
    drained: set[str] = set()  # nodes whose log was read to its end (or can no more be)
    ends: set[str] = set()  # nodes whose end watcher has said what it knows
    # Nodes whose log ended before their end watcher spoke: the watcher's answer (the state,
    # in the same round trip as the end) is waited for rather than asked again.
    pending: dict[str, int] = {}
    joining = Joining(console, {n.host.name: n.nproc for n in plan.nodes}) \
        if ranked and console.live else None

    def follow(node: NodePlan) -> None:
        name = node.host.name
        link = run.links[name]
        local_log = open(logdir / f"{name}.log", "w", buffering=1)  # noqa: SIM115
        tag = Tagger(name, node.rank_base, lambda: run_state.ranks(link.t, node.run_dir))
        quiet = after_stop(run, node, link)

        def on_lines(lines: list[str]) -> None:
            local_log.write("".join(line + "\n" for line in lines))
            tagged = [tag(line) for line in quiet(lines)]
            console.lines(index[name], [(tg.tag, tg.text) for tg in tagged], name,
                          [tg.rank for tg in tagged])
            quiet.tell()
            if run.progressed_at is None and any(
                    (tg.tag != name or not ranked) and progress(tg.text) for tg in tagged):
                run.progressed_at = time.time()
                if joining is not None:
                    joining.end()  # the job's own first line says the rest

        try:
            events.put(("drained", name, on_link(link, finished, lambda t: remote.follow(
                t, node.run_dir, pids.get(name), on_lines, finished, received[name]))))
        except Exception as e:
            events.put(("drained", name, e))
        finally:
            local_log.close()

    def watch(node: NodePlan) -> None:
        name = node.host.name
        pid = pids.get(name)
        if pid is None:  # no wrapper to wait for: its log's end says it all
            events.put(("end", name, None))
            return
        try:
            events.put(("end", name, on_link(run.links[name], finished, lambda t: remote.wait_end(
                t, node.run_dir, pid, run.key(name), finished))))
        except Exception as e:
            events.put(("end", name, e))

    def keep(node: NodePlan) -> None:
        name = node.host.name
        run.links[name].keep(finished, lambda: name in outcomes,
                             lambda why: events.put(("lost", name, why)))

    def count() -> None:
        """Until every worker has joined or the job says something: how many have."""
        assert joining is not None
        while not finished.wait(JOIN_POLL_S):
            if run.progressed_at is not None or run.stopping or outcomes:
                break
            found = each(((n.host.name, n) for n in plan.nodes if not joining.full(n.host.name)),
                         lambda n: len(run_state.ranks(run.links[n.host.name].t, n.run_dir)))
            joining.show({name: r for name, r in found.items() if isinstance(r, int)})
        joining.end()

    threads = [threading.Thread(target=fn, args=(n,), daemon=True)
               for n in plan.nodes for fn in (follow, watch, keep)]
    if joining is not None:
        threads.append(threading.Thread(target=count, daemon=True, name="fleet-joining"))
    try:
        for th in threads:
            th.start()
        faults.point(Phase.STREAM.value)
        # A node lost, then reached again, also says how it ended; one given up is waited for
        # no more (its streams may still be trying a silent address: they end on their own).
        while not all(n in outcomes and (run.links[n].given_up or n in drained and (
                n not in run.lost or n in ends)) for n in nodes):
            try:
                kind, name, result = events.get(timeout=1.0)
            except queue.Empty:
                yield Quiet(time.monotonic() - max(r.arrived for r in received.values()))
                continue
            node = nodes[name]
            outcome = None
            if kind == "end":
                ends.add(name)
            if kind == "drained":
                drained.add(name)
                if (name not in outcomes and isinstance(result, int) and name not in ends
                        and pids.get(name) is not None):
                    pending[name] = result
                    # the watcher says the end in the same round trip; a stream that ended
                    # while the job goes on (its tail killed) is asked about soon all the same
                    late = threading.Timer(PENDING_S, events.put, (("late", name, None),))
                    late.daemon = True
                    late.start()
                elif name not in outcomes and isinstance(result, int | Exception):
                    outcome = _outcome(run, node, result)
                elif isinstance(result, Exception):
                    console.phase(name, f"the rest of its log could not be read: "
                                        f"{reason(result)} (`fleet logs {plan.run_id} --node "
                                        f"{name}` reads it from the node)")
            elif kind == "end" and isinstance(result, run_state.NodeState) and result.done:
                known = outcomes.get(name)
                outcome = result.outcome(name, node.node_rank)
                if known is not None:
                    if known.status is NodeStatus.UNREACHABLE:
                        # Lost, then reached by the stop: what it says now is what happened.
                        console.phase(name, f"answered again: {outcome.describe()}")
                        outcomes[name] = outcome
                        yield NodeEnded(outcome)
                    continue  # its loss already set off the fail-fast
            elif kind in ("end", "late") and name in pending and name not in outcomes:
                # The watcher could not say (its link broke, or the run's state is not an end):
                # the state is asked once more, as for a log that ended with no watcher.
                outcome = _outcome(run, node, pending.pop(name))
            elif kind == "end" and isinstance(result, Exception) and name not in outcomes:
                outcome = _outcome(run, node, result)
            elif kind == "lost" and name not in outcomes:
                run.lost.add(name)
                run.links[name].t.close()  # its streams go on from a fresh connection
                outcome = NodeOutcome(name, node.node_rank, NodeStatus.UNREACHABLE, None,
                                      str(result))
                if run.stopping:
                    run.links[name].give_up()  # the stop already under way missed it
            if outcome is not None:
                outcomes[name] = outcome
                yield NodeEnded(outcome)
    finally:
        finished.set()
        if joining is not None:
            joining.end()


PENDING_S = 3.0  # how long a node's ended log waits for its end watcher's word, at most
JOIN_POLL_S = 1.0  # how often the nodes are asked how many of their workers have started


def joined(found: dict[str, int], nprocs: dict[str, int | str]) -> tuple[int, int, str]:
    """How many of the run's workers have joined, of how many, from how many ranks each node's
    workers recorded (fleet's sitecustomize, as each worker starts: torchrun starts them only
    once the rendezvous is complete). Where a node's process count is decided there ("auto"),
    what can be counted is the nodes whose workers have started."""
    counts = [n for n in nprocs.values() if isinstance(n, int)]
    if len(counts) == len(nprocs):
        return (sum(min(max(found.get(name, 0), 0), n) for name, n in nprocs.items()
                    if isinstance(n, int)), sum(counts), "workers")
    return sum(1 for name in nprocs if found.get(name, 0) > 0), len(nprocs), "nodes"


def joining_words(count: int, total: int, unit: str, missing: list[str] | None = None,
                  elapsed: float = 0.0) -> str:
    """The rendezvous' words: the count; once it is slow (waits.SLOW_S), the nodes whose
    workers have not all been seen starting (`missing`, in the plan's order), at most
    waits.NAMED of them."""
    if count >= total:
        return f"{unit} joined: {count}/{total}; waiting for the job's first line"
    head = f"{unit} joining: {count}/{total}"
    if elapsed < SLOW_S or not missing:
        return head
    if not count:
        return f"{head}; no node's workers have started yet ({int(elapsed)} s)"
    more = f" and {len(missing) - NAMED} more" if len(missing) > NAMED else ""
    return f"{head}; {', '.join(missing[:NAMED])}{more} not yet ({int(elapsed)} s)"


class Joining:
    """The wait between the start and the job's first line, on a terminal: how many workers
    have joined, and after a second the nodes that have not; ended (from any thread, once) by
    that line, a node's end, or the run's."""

    def __init__(self, console: Console, nprocs: dict[str, int | str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nprocs, self.clock = nprocs, clock
        self.t0 = clock()
        self.found: dict[str, int] = {}
        self.lock = threading.Lock()
        self.stack = contextlib.ExitStack()
        self.wait = self.stack.enter_context(console.waiting(self.words))

    def words(self) -> str:
        """Said anew at each redraw: the seconds go on between two counts."""
        count, total, unit = joined(self.found, self.nprocs)
        missing = [name for name in self.nprocs if (self.found.get(name, 0) <= 0
                                                    if unit == "nodes" else not self.full(name))]
        return joining_words(count, total, unit, missing, self.clock() - self.t0)

    def full(self, name: str) -> bool:
        """Whether every worker of this node has joined (it need not be asked again)."""
        nproc, got = self.nprocs[name], self.found.get(name, 0)
        return got >= nproc if isinstance(nproc, int) else got > 0

    def show(self, found: dict[str, int]) -> None:
        with self.lock:
            self.found.update(found)
            self.wait.update(self.words)

    def end(self) -> None:
        with self.lock:
            self.stack.close()


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


def after_stop(run: Followed, node: NodePlan, link: Link) -> AfterStop:
    """The attached stream's filter for one node: from the line where fleet's stop of it began
    (the node confirms its stop record), what it prints is hidden here, once said so."""
    name = node.host.name

    def confirm() -> str:
        # A few tries: the mark can come while this connection is busy with fleet's own stop of
        # the node (its sessions all taken, or the link being renewed), and one failed look
        # would show the whole stop's noise.
        for attempt in range(CONFIRM_TRIES):
            with contextlib.suppress(FleetError):
                return run_state.state(link.t, node.run_dir, run.key(name)).stopped_by
            if attempt + 1 < CONFIRM_TRIES:
                time.sleep(0.3)
        return ""

    def announce(by: str) -> None:
        run.console.phase(name, f"what it prints while it is stopped ({by}) is not shown "
                                f"here: `fleet logs {run.run_id} --node {name}` has it")

    return AfterStop(confirm, announce)


def _outcome(run: Followed, node: NodePlan, result: int | Exception) -> NodeOutcome:
    name = node.host.name
    if not isinstance(result, Exception):
        try:
            st = run_state.state(run.links[name].t, node.run_dir, run.key(name))
        except FleetError as e:
            result = e
        else:
            if st.done:
                return st.outcome(name, node.node_rank)
            # Its log stream ended while it still ran: fleet lost sight of it, and says so.
            return NodeOutcome(name, node.node_rank, NodeStatus.UNREACHABLE, None,
                               f"its log stream ended while it was still {st.status.value}")
    run.links[name].give_up()
    return NodeOutcome(name, node.node_rank, NodeStatus.UNREACHABLE, None, reason(result))
