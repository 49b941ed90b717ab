"""The end of a transfer judged: which node failed and why, from what each receiver said (its
own words, shown, never obeyed) and how the watch ended the transfer (a node silent, the stream
stuck, a node that takes nothing). Pure: what it is told in, a HostError (or RelayTampered) out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleet.console import printable
from fleet.errors import FleetError, RelayTampered, TransportError, host_error
from fleet.nodeside import ferry
from fleet.transport.transfer.report import NodeState, human, problem_text, relayer

# A node that says nothing for this long, before its end, stopped answering (a cut link, a
# frozen host): every receiver says where it is twice a second, whatever it waits on.
STALL_S = 25.0
# No byte placed on any node for this long: the transfer is stuck (a link between two nodes
# that moves nothing, a node that talks but does not take the stream).
STUCK_S = ferry.STALL_S + 30.0
# A node that waited this long to pass data on while the next one placed no byte: the next one
# takes nothing (it stopped reading; its heartbeats alone do not make it a taker). Well under
# the relay socket's own ferry.STALL_S; a node that copies the blocks it keeps places them.
TAKES_S = 20.0


@dataclass(frozen=True)
class Ending:
    """How the watch ended the transfer: the first receiver that ended before the end, or
    stopped answering (silent), or, with every other, placed nothing for STUCK_S (stuck); or
    the link (a, b) where b took nothing from a (deaf)."""

    cause: str | None
    silent: bool
    stuck: bool
    deaf: tuple[str, str] | None


def check(states: dict[str, NodeState], routes: list[list[str]], ending: Ending,
          last_err: Callable[[str], list[str]]) -> None:
    """Every node that failed, by its own words first; then those only the chain broke.
    A node lost or silent makes it HostsUnreachable (exit 3), as any unreachable host; one
    that altered what it relayed, RelayTampered, named before anything else."""
    check_tampered(states, routes)
    problems: dict[str, Exception] = {}
    deaf = ending.deaf[1] if ending.deaf else None
    if ending.deaf:
        a, b = ending.deaf
        if states[b].unread:  # b's own word: the data reached it, and it does not read
            problems[b] = TransportError(
                f"takes nothing: {a} waited {TAKES_S:.0f}s to pass it data and it placed "
                f"none meanwhile, with {human(states[b].unread)} from {a} unread in its "
                "socket (as it says): it stopped reading. What arrived is kept: the next "
                "`fleet up` sends only the rest")
        else:
            problems[a] = problems[b] = stalled(
                a, b, f"{a} says it waited {TAKES_S:.0f}s to pass data on to {b}; {b} "
                "placed none meanwhile and holds none unread from it")
    for n, s in states.items():
        if n == deaf:
            continue
        if s.error is not None and not s.error.get("relay"):
            problems[n] = FleetError(problem_text(s.error))
        elif n == ending.cause and ending.stuck:
            problems[n] = TransportError(
                f"nothing moved for {STUCK_S:.0f}s on any node: the stream stopped here "
                "(the link from the node before it, or this node, takes nothing)")
        elif n == ending.cause and ending.silent:
            problems[n] = TransportError(
                f"no progress for {STALL_S:.0f}s while data was sent: it stopped answering "
                "(a cut link, a frozen host?). What arrived is kept: the next `fleet up` "
                "sends only the rest")
        elif s.ended and not s.done and s.error is None and ending.cause in (None, n):
            err = last_err(n)
            problems[n] = TransportError(
                "lost mid-transfer (its connection or its receiver ended" +
                (f": {printable(err[0])}" if err else "") + ")")
    for n, s in states.items():  # "could not pass it on": the next node's doing
        nxt = next_of(routes, n)
        if s.error is None or s.error.get("relay") != "out" or nxt is None:
            continue
        why = printable(str(s.error.get("msg") or ""))
        if states[nxt].unread:  # its own word: what reached it waits unread
            problems.setdefault(nxt, TransportError(
                f"takes nothing from {n}, which could not pass the data on ({why}), with "
                f"{human(states[nxt].unread)} from it unread in its socket (as it "
                "says)"))
        else:
            link = stalled(n, nxt, f"{n} says it could not pass the data on ({why})"
                           f"; {nxt} holds none unread from it")
            problems.setdefault(n, link)
            problems.setdefault(nxt, link)
    if not problems:
        for n, s in states.items():
            if s.error is not None:
                problems[n] = FleetError(problem_text(s.error))
    if problems:
        raise host_error("sending data", problems)

def stalled(a: str, b: str, said: str) -> TransportError:
    """The relay link a -> b carried nothing, and only a says why: a's word alone blames
    no node (a compromised a would blame an innocent b), so both ends are named."""
    return TransportError(
        f"the relay link {a} -> {b} stalled: {said}. {a} stopped passing it on, {b} "
        "stopped reading, or the link between them carries nothing: check both. What "
        "arrived is kept: the next `fleet up` sends only the rest")

def next_of(routes: list[list[str]], name: str) -> str | None:
    for route in routes:
        if name in route[:-1]:
            return route[route.index(name) + 1]
    return None

def check_tampered(states: dict[str, NodeState], routes: list[list[str]]) -> None:
    """RelayTampered naming each node that passed on what another found altered (its own
    words, shown, never obeyed). Only the first node of a chain to find it names the one
    before it: what reached those after it was already altered, so whether the node
    between altered it too cannot be told, and it is not accused."""
    bad: dict[str, str] = {}
    found = {n for n, s in states.items() if s.error is not None
             and s.error.get("tampered")}
    for n, s in states.items():
        if n not in found or s.error is None:
            continue
        by = relayer(routes, n)
        if by in found:
            continue
        what = printable(str(s.error.get("msg") or ""))
        if by is None:  # fed from here: not relayed, so not a relaying node's doing
            continue
        bad.setdefault(by, f"what it relayed to {n} does not match what fleet sent "
                           f"({what}): nothing of it was applied on {n}. {by} altered the "
                           "data it passed on (compromised or faulty): check it, or leave "
                           "it out of the inventory")
    if bad:
        raise RelayTampered("sending data", bad)
