"""Stopping a run on hosts: every node's stop recorded before any is signalled, and a node whose
connection failed (or that was lost) retried on fresh connections for a while."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from fleet.backends.hosts import node as remote
from fleet.backends.hosts.prepare import Session
from fleet.console import Console
from fleet.errors import CommandTimedOut, FleetError, TransportError
from fleet.events import Ending
from fleet.facts.stopping import StopStep
from fleet.plan import NodePlan
from fleet.run.record import Wrapper
from fleet.transport import Transport
from fleet.transport.group import each, failures, reason
from fleet.transport.link import RETRY_S, Link, refused


def stop_nodes(session: Session, nodes: list[NodePlan], console: Console, by: str,
               key: Callable[[str], str], wrapper: Callable[[str], Wrapper | None],
               links: dict[str, Link] | None = None, lost: set[str] | None = None,
               retry_for: float = 0.0,
               heard: Callable[[str, StopStep | None], None] | None = None) -> dict[str, str]:
    """Stop the run on these nodes, every node's stop recorded before any is signalled
    (node.stop_together); `key` and `wrapper` give a node's stop key and its wrapper as
    recorded at the start. Where a node's connection fails (or it was lost), the stop is
    retried on fresh connections for `retry_for` seconds: a node that stalled for a while is
    stopped once it answers again; one that refuses connections is not waited for."""
    links, lost = links or {}, lost or set()
    taken: dict[str, int] = {}  # the generation of each link's connection the stop went on

    def target(n: NodePlan) -> remote.Target:
        @contextlib.contextmanager
        def held() -> Iterator[tuple[Transport, str, str, Wrapper | None]]:
            link, name = links.get(n.host.name), n.host.name
            if link is None:
                t = session.transports[name]
            else:
                with link.cond:  # the connection and its generation, read as one
                    t, taken[name] = link.t, link.generation
            yield t, n.run_dir, key(name), wrapper(name)
        return held

    reachable = [n for n in nodes if n.host.name not in lost]
    results = remote.stop_together([(n.host.name, target(n)) for n in reachable], by, heard)
    why = {n.host.name: "it was lost" for n in nodes if n.host.name in lost}
    why.update({name: reason(r) for name, r in results.items()
                if isinstance(r, TransportError | CommandTimedOut)})
    again = [n for n in nodes if n.host.name in why and n.host.name in links]

    def afresh(n: NodePlan) -> remote.Stopped:
        name = n.host.name
        if not retry_for and name in lost:
            return let_go(links[name])
        if heard is not None:
            heard(name, Ending.CONNECTING)  # its wait named again: a fresh connection
        try:
            return stop_afresh(links[name], n, by, key(name), wrapper(name), why[name],
                               retry_for, console, taken.get(name))
        finally:
            if heard is not None:
                heard(name, None)

    results.update(each(((n.host.name, n) for n in again), afresh))
    problems = failures(results)
    for name, r in results.items():
        if isinstance(r, remote.Stopped) and r.left:
            problems[name] = f"processes still alive after SIGKILL: {r.left}"
    console.phases({name: f"stop failed: {problem}" for name, problem in problems.items()})
    return problems


def let_go(link: Link) -> remote.Stopped:
    """A lost node's stop, without `retry_for`: left to the caller (a healing run stops it in
    the background once it answers: fleet.lifecycle.left), so the next attempt does not wait
    for it; nothing waits for its connection any more."""
    link.give_up()
    raise TransportError("it was lost: its stop is tried again in the background, once it "
                         "answers")


def stop_afresh(link: Link, node: NodePlan, by: str, key: str, wrapper: Wrapper | None,
                why: str, retry_for: float, console: Console,
                taken: int | None = None) -> remote.Stopped:
    """The stop on a fresh connection, tried until one answers or `retry_for` has passed (the
    link is given up then). `taken`: the generation of the link's connection that the first
    stop went on; where the link has replaced it since (a heartbeat found it slow, or a stream
    broke, and a fresh one answered: that closed the old one under the stop), the stop goes on
    the one in place, and that is what is said: the node was never lost."""
    name = node.host.name
    deadline = time.monotonic() + retry_for
    if taken is not None and link.generation != taken and not link.given_up:
        console.phase(name, "its connection was replaced during the stop; stopping it on the "
                            "one in place")
        try:
            return remote.stop(link.t, node.run_dir, by, key, wrapper)
        except (TransportError, CommandTimedOut) as e:
            why = reason(e)  # the one in place failed too: on as for any broken connection
    console.phase(name, f"no stop on its connection ({why}); " + (
        f"trying fresh connections for up to {retry_for:g}s (watchdog.unreachable_after)"
        if retry_for else "trying a fresh connection, once"))
    while True:
        try:
            t = link.fresh(max(deadline - time.monotonic(), 1.0), link.generation)
            break
        except FleetError as e:
            if refused(e):  # an answer, unlike silence: nothing listens there, lost at once
                link.give_up()
                raise TransportError(f"it refuses connections (sshd is gone, or the host "
                                     f"restarts): {e}") from e
            if time.monotonic() + RETRY_S >= deadline:
                link.give_up()
                raise TransportError(f"no fresh connection answered within {retry_for:g}s: "
                                     f"{e}") from e
            time.sleep(RETRY_S)
    try:
        left = remote.stop(t, node.run_dir, by, key, wrapper)
    except FleetError:
        link.give_up()
        raise
    console.phase(name, "answered on a fresh connection: the stop reached it")
    return left
