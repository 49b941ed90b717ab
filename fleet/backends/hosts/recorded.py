"""A recorded run's nodes, each connected afresh from its run record: a function on every node,
and the stop of them all (the commands that outlive the `fleet up` that started the run)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

from fleet.backends.hosts.node import stop_together
from fleet.run.record import NodeRecord, RunRecord
from fleet.transport import Transport, open_transport
from fleet.transport.group import each

R = TypeVar("R")


def on_nodes(record: RunRecord, fn: Callable[[Transport, str], R]) -> dict[str, R | Exception]:
    """fn(transport, run dir) on every node of a recorded run, connected afresh, in parallel."""

    def one(node: NodeRecord) -> R:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        with open_transport(node.host, hello=not absolute) as t:
            return fn(t, t.path(node.run_dir))

    return each(((n.host.name, n) for n in record.nodes), one)


def stop_recorded(record: RunRecord, by: str) -> dict[str, list[int] | Exception]:
    """Stop a recorded run on every node, connected afresh (see node.stop_together)."""

    @contextlib.contextmanager
    def connect(node: NodeRecord) -> Iterator[tuple[Transport, str, str]]:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        with open_transport(node.host, hello=not absolute) as t:
            yield t, t.path(node.run_dir), record.stop_key(node.host.name)

    return stop_together([(n.host.name, lambda n=n: connect(n))  # type: ignore[misc]
                          for n in record.nodes], by)
