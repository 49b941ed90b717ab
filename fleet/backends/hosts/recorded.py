"""A recorded run's nodes, each connected afresh from its run record: a function on every node,
and the stop of them all (the commands that outlive the `fleet up` that started the run)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from fleet.backends.hosts.node import Stopped, stop_together
from fleet.errors import FleetError
from fleet.facts import run_state
from fleet.run import outcomes
from fleet.run.record import NodeRecord, RunRecord, Wrapper, wrapper
from fleet.transport import Transport, open_transport
from fleet.transport.group import each

R = TypeVar("R")


def on_nodes(record: RunRecord, fn: Callable[[Transport, str], R],
             only: set[str] | None = None) -> dict[str, R | Exception]:
    """fn(transport, run dir) on every node of a recorded run (or those named in `only`),
    connected afresh, in parallel."""

    def one(node: NodeRecord) -> R:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        with open_transport(node.host, hello=not absolute) as t:
            return fn(t, t.path(node.run_dir))

    return each(((n.host.name, n) for n in record.nodes
                 if only is None or n.host.name in only), one)


def stop_recorded(record: RunRecord, by: str, only: set[str] | None = None
                  ) -> dict[str, Stopped | Exception]:
    """Stop a recorded run on every node (or those named in `only`), connected afresh (see
    node.stop_together). Each node's state once its stop is done is history from then: kept in
    the run's record (fleet.run.outcomes)."""

    @contextlib.contextmanager
    def connect(node: NodeRecord) -> Iterator[tuple[Transport, str, str, Wrapper | None]]:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        name = node.host.name
        with open_transport(node.host, hello=not absolute) as t:
            run_dir, key = t.path(node.run_dir), record.stop_key(name)
            yield t, run_dir, key, wrapper(record.dir, name)
            # Only after a stop that went through (an error skips this).
            with contextlib.suppress(FleetError):
                st = run_state.state(t, run_dir, key)
                if st.done:
                    outcomes.note(record.dir, st.outcome(name, node.node_rank), by)

    return stop_together([(n.host.name, lambda n=n: connect(n))  # type: ignore[misc]
                          for n in record.nodes if only is None or n.host.name in only], by)
