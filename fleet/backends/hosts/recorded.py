"""A recorded run's nodes, each connected afresh from its run record: a function on every node,
and the stop of them all (the commands that outlive the `fleet up` that started the run)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from fleet.backends.hosts.node import Stopped, stop_together
from fleet.errors import CommandTimedOut
from fleet.facts.stopping import StopStep
from fleet.run import outcomes
from fleet.run.record import NodeRecord, RunRecord, Wrapper, wrapper
from fleet.transport import Transport, open_transport
from fleet.transport.group import each
from fleet.waits import Pending, named, over

R = TypeVar("R")
ASK_S = 8.0  # what `status` and `ps` wait for a live run's nodes, all asked at once


def ask(record: RunRecord, fn: Callable[[Transport, str], R], only: set[str] | None = None,
        within: float | None = None) -> dict[str, R | Exception]:
    """on_nodes, bounded: every node asked at once, each given `within` seconds in all (its
    connection too, whose own timeout is longer); a node that has not answered by then is
    CommandTimedOut (unreachable, as status says), and its thread is left to end by itself
    (a daemon: it never holds the process)."""
    within = ASK_S if within is None else within
    names = [n.host.name for n in record.nodes if only is None or n.host.name in only]
    if not names:
        return {}
    out: dict[str, R | Exception] = {}

    def one(name: str, wait: Pending) -> None:
        try:
            r = on_nodes(record, fn, {name}, wait)[name]
        except Exception as e:  # noqa: BLE001 - a node's failure is its answer
            r = e
        out[name] = r

    with over(f"the state of {record.run_id}", names) as wait:
        threads = [threading.Thread(target=one, args=(name, wait), daemon=True,
                                    name=f"fleet-ask-{name}") for name in names]
        for th in threads:
            th.start()
        deadline = time.monotonic() + within
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
    got = dict(out)  # a snapshot: a late answer changes nothing said from here
    return {name: got[name] if name in got else
            CommandTimedOut(name, "fleet's question (connection and run state)", within)
            for name in names}


def on_nodes(record: RunRecord, fn: Callable[[Transport, str], R],
             only: set[str] | None = None,
             wait: Pending | None = None) -> dict[str, R | Exception]:
    """fn(transport, run dir) on every node of a recorded run (or those named in `only`),
    connected afresh, in parallel (`wait` hears each node's connection, its call and its
    end)."""
    wait = wait or Pending("", ())

    def one(node: NodeRecord) -> R:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        wait.start(node.host.name, "its connection")
        with open_transport(node.host, hello=not absolute) as t:
            wait.start(node.host.name, "")
            return fn(t, t.path(node.run_dir))

    return each(named((n.host.name, n) for n in record.nodes
                      if only is None or n.host.name in only), wait.tracked(one))


def stop_recorded(record: RunRecord, by: str, only: set[str] | None = None,
                  heard: Callable[[str, StopStep | None], None] | None = None
                  ) -> dict[str, Stopped | Exception]:
    """Stop a recorded run on every node (or those named in `only`), connected afresh (see
    node.stop_together; `heard`: what each node says is still ending as it waits). Each node's
    state once its stop is done is history from then: kept in the run's record
    (fleet.run.outcomes)."""

    @contextlib.contextmanager
    def connect(node: NodeRecord) -> Iterator[tuple[Transport, str, str, Wrapper | None]]:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        name = node.host.name
        with open_transport(node.host, hello=not absolute) as t:
            run_dir, key = t.path(node.run_dir), record.stop_key(name)
            yield t, run_dir, key, wrapper(record.dir, name)

    ranks = {n.host.name: n.node_rank for n in record.nodes}

    def keep(name: str, r: Stopped) -> None:
        """Only after a stop that went through (an error says no state): its state in the same
        round trip as the stop, kept as each node's is done."""
        if r.state is not None and r.state.done:
            outcomes.note(record.dir, r.state.outcome(name, ranks[name]), by)

    return stop_together([(n.host.name, lambda n=n: connect(n))  # type: ignore[misc]
                          for n in record.nodes if only is None or n.host.name in only], by,
                         heard, with_state=True, stopped=keep)
