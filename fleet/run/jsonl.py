"""The JSON-lines view of a run's events (`fleet up --json`, `fleet logs --json`): one object
per event on its stream, nothing else there (docs/EVENTS.md is its contract)."""

from __future__ import annotations

import contextlib
import json
import threading
from typing import Any, TextIO

from fleet import events as ev
from fleet.states import NodeOutcome, RunStatus


class JsonLines:
    """A sink that writes each event as one line of JSON, whole, in the order emitted (events
    come from several threads: one line is never cut by another)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._lock = threading.Lock()

    def emit(self, event: ev.Event) -> None:
        line = json.dumps(ev.as_json(event), ensure_ascii=False) + "\n"
        # Best effort, as the terminal's: a reader gone must not stop fleet from tearing down.
        with self._lock, contextlib.suppress(OSError, ValueError):
            self.stream.write(line)
            self.stream.flush()


def read(text: str) -> list[ev.Event]:
    """Events back from JSON lines (ValueError at the first line that is not one)."""
    return [ev.from_json(json.loads(line)) for line in text.splitlines() if line.strip()]


def status_json(run_id: str, status: RunStatus,
                nodes: list[tuple[str, int, NodeOutcome | None]], lines: list[str]
                ) -> dict[str, Any]:
    """`fleet status --json`: the run's state, fleet's exit code for it, and per node (in node
    rank order) its outcome as fleet's record keeps it (status null: no end kept, the node
    still runs or could not be asked; its row in `lines` says which)."""
    out: list[dict[str, Any]] = []
    for host, rank, o in nodes:
        if o is None:
            out.append({"host": host, "node_rank": rank, "status": None, "exit_code": None,
                        "detail": "", "own_failure": "", "elapsed": None})
        else:
            out.append(ev.outcome_json(o))
    return {"v": ev.SCHEMA, "run_id": run_id, "status": status.value,
            "exit_code": status.exit_code, "nodes": out, "lines": lines}
