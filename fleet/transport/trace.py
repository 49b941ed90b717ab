"""A debug record of every round trip fleet makes to a node: where FLEET_TRACE names a file,
each connection and each session channel (a command, a stream, a pipe, SFTP) appends one JSON
line to it (host, kind, what, when it began, how long it took). bench/fanout.py reads it to
say where a launch's round trips go; nothing in fleet reads it back."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

VAR = "FLEET_TRACE"
_lock = threading.Lock()


def path() -> str:
    return os.environ.get(VAR, "")


def label(script: str) -> str:
    """A script's name in the record: its first telling line (a shell program's comment)."""
    for line in script.splitlines():
        line = line.strip()
        if line and line not in ("{", "(") and not line.startswith("set -- "):
            return line[:80]
    return ""


def note(host: str, kind: str, what: str, began: float, seconds: float | None) -> None:
    """One round trip (or a channel held open: `seconds` to its close, None if not closed)."""
    target = path()
    if not target:
        return
    line = json.dumps({"host": host, "kind": kind, "what": what[:200], "t": round(began, 4),
                       "s": None if seconds is None else round(seconds, 4)})
    with _lock, open(target, "a", encoding="utf-8") as f:
        f.write(line + "\n")


@contextmanager
def span(host: str, kind: str, what: str) -> Iterator[None]:
    """Times the block as one round trip of `kind` (only where FLEET_TRACE is set)."""
    if not path():
        yield
        return
    t0 = time.time()
    try:
        yield
    finally:
        note(host, kind, what, t0, time.time() - t0)
