"""What the receivers say, pure: their report lines checked for shape, each node's state so far,
and a receiver's error as the user reads it."""

from __future__ import annotations

import json
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet import sizes
from fleet.console import printable
from fleet.nodeside import ferry

LINE_MAX = 1 << 16  # a report line longer than this is not a report


@dataclass
class NodeState:
    """What one receiver said so far."""

    name: str
    expected: int = 0  # bytes it places
    at: int = 0
    started: bool = False  # its program runs: what is sent now reaches it, not the shell
    port: int | None = None
    linked: bool | None = None
    link_why: str = ""
    ok: dict[tuple[int, str], str] = field(default_factory=dict)  # (root, rel) -> sha256
    error: dict[str, object] | None = None
    done: bool = False
    ended: bool = False  # its output ended
    last: float = field(default_factory=time.monotonic)  # when it last said anything
    moved: float = field(default_factory=time.monotonic)  # when its bytes in place last grew
    waiting: float = 0.0  # seconds what it passes on to the next node has moved no byte, as said
    unread: int = 0  # bytes from the node before it waiting unread in its socket, as it says


def parse_report(line: bytes) -> dict[str, object] | None:
    """One report line as a dict of known shape, or None (noise, or not a report)."""
    if len(line) > LINE_MAX:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not obj:
        return None
    key, value = next(iter(obj.items()))
    if len(obj) > 1 and not (key in ("linked", "port") and set(obj) == {key, "why"}):
        return None
    checks: dict[str, Callable[[object], bool]] = {
        "port": lambda v: _int(v) and 0 <= v < 65536,  # type: ignore[operator]
        "linked": lambda v: isinstance(v, bool),
        "at": lambda v: _int(v) and v >= 0,  # type: ignore[operator]
        "unread": lambda v: _int(v) and v >= 0,  # type: ignore[operator]
        "waiting": lambda v: (isinstance(v, int | float) and not isinstance(v, bool)
                              and 0 <= v < 1e9),
        "ok": lambda v: (isinstance(v, list) and len(v) == 3 and isinstance(v[0], int)
                         and not isinstance(v[0], bool) and isinstance(v[1], str)
                         and isinstance(v[2], str) and len(v[2]) in (0, 64)),
        "gave_up": lambda v: isinstance(v, list),
        "error": lambda v: isinstance(v, dict),
        "done": lambda v: isinstance(v, dict),
    }
    if key not in checks or not checks[key](value):
        return None
    if key in ("linked", "port"):
        why = obj.get("why")
        return {key: value, "why": why if isinstance(why, str) else ""}
    return obj


HEARD_S = 5.0  # a receiver heard from within this still answers (it reports twice a second)


def takes_nothing(routes: list[list[str]], states: dict[str, NodeState], now: float,
                  bound: float) -> tuple[str, str] | None:
    """(the node that passes data on, the next one) where the first has waited `bound` seconds
    to pass on what it holds and the next placed no byte for as long (a node that stops
    reading, however it keeps saying it is alive), itself not waiting on the node after it.
    A next node that says nothing either (a cut link, a frozen host) is not one: it stopped
    answering, which the watch names by its own, longer bound."""
    for route in routes:
        for a, b in zip(route, route[1:], strict=False):
            sa, sb = states[a], states[b]
            if sb.done or sb.ended or sa.ended or now - sb.last >= HEARD_S:
                continue
            # b waiting on the node after it in turn: the one to name is further on
            if sa.waiting >= bound and now - sb.moved >= bound and sb.waiting < bound:
                return a, b
    return None


def relayer(routes: list[list[str]], name: str) -> str | None:
    """The node that passes the stream on to `name`; None where this machine feeds it."""
    for route in routes:
        if name in route[1:]:
            return route[route.index(name) - 1]
    return None


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def problem_text(err: dict[str, object]) -> str:
    """A receiver's error, as the user reads it: what, where, what to do."""
    path = printable(str(err.get("path") or ""))  # a node's words: shown, never obeyed
    msg = printable(str(err.get("msg") or "failed"))
    free = err.get("free")
    if err.get("errno") in ("ENOSPC", "EDQUOT"):
        room = f" ({_size(free)} free there)" if isinstance(free, int) else ""
        part = posixpath.join(posixpath.dirname(path), "." + posixpath.basename(path) +
                              ferry.PART)
        kept = (f"What arrived is kept (in {part}): the next `fleet up` sends only the rest"
                if err.get("kept") else "Nothing of that file was kept")
        return (f"no space left writing {path}{room}: free space there, or set `workdir` for "
                f"this host to a larger disk. {kept}")
    if path:
        return f"cannot write {path}: {msg}"
    return msg


def _size(n: object) -> str:
    return sizes.human(n) if isinstance(n, int) else "?"


def human(n: int) -> str:
    return sizes.human(n)
