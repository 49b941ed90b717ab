"""What fleet saw of each node of a run, and when, kept in the run's local record
(<state dir>/runs/<run id>/outcomes.json) as fleet sees it. It is history: once fleet has seen a
node's part end, no later word of the node (an exit code rewritten by a process the job left
behind) changes it; only what fleet did not see end (a node it lost) is asked of the node again."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.errors import DamagedRecord
from fleet.run.record import write_atomic
from fleet.states import NodeOutcome, NodeStatus

FILE = "outcomes.json"
LOCK = ".outcomes.lock"  # two fleet commands at once (an up and a status) each add their own


@dataclass(frozen=True)
class Seen:
    """A node's outcome as fleet saw it, when (time.time()) and by which command."""

    outcome: NodeOutcome
    at: float
    by: str  # "fleet up", "fleet stop", "fleet status"

    @property
    def final(self) -> bool:
        """Its end: kept for good. A loss (unreachable) is not: the node may still run."""
        return self.outcome.status.is_terminal


def note(record_dir: Path, outcome: NodeOutcome, by: str) -> NodeOutcome:
    """Keep what fleet saw of a node now, unless its end is kept already; returns the outcome
    that stands (the end seen first). A run whose record is gone keeps nothing."""
    if not record_dir.is_dir():
        return outcome
    with _locked(record_dir):
        kept = seen(record_dir)
        old = kept.get(outcome.name)
        if old is not None and old.final:
            return old.outcome
        kept[outcome.name] = Seen(outcome, time.time(), by)
        write_atomic(record_dir / FILE, dumps(kept))
    return outcome


def seen(record_dir: Path) -> dict[str, Seen]:
    """What fleet saw of the run's nodes (none kept: empty)."""
    path = record_dir / FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise DamagedRecord(f"{path}: cannot be read ({e})") from e
    try:
        return parse(text)
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedRecord(f"{path}: what fleet saw of the run's nodes is damaged ({e}); "
                            "remove that file to ask the nodes instead") from e


def ended(record_dir: Path) -> dict[str, NodeOutcome]:
    """The nodes whose end fleet saw, each with how it ended."""
    return {name: s.outcome for name, s in seen(record_dir).items() if s.final}


def lines(kept: dict[str, Seen]) -> list[str]:
    """`fleet show`'s words: each node as fleet saw it, when and by which command."""
    return [f"  {name:<16} {s.outcome.describe()} (seen by {s.by} at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(s.at))})"
            for name, s in sorted(kept.items(), key=lambda kv: kv[1].outcome.node_rank)]


def words(r: NodeOutcome) -> str:
    """`failed (exit 1)  12s`, `stopped (exit 143) by fleet stop  3s`: a node's row in status."""
    code = f" (exit {r.code})" if r.code is not None else ""
    if r.own_failure:
        by = f": {r.own_failure} before the stop ({r.detail}) reached it"
    elif r.detail and r.status in (NodeStatus.STOPPED, NodeStatus.FAILED):
        by = f" by {r.detail}" if r.status is NodeStatus.STOPPED else f": {r.detail}"
    else:
        by = ""
    took = f"  {r.elapsed}s" if r.elapsed is not None else ""
    return f"{r.status.value}{code}{by}{took}"


def as_json(kept: dict[str, Seen]) -> dict[str, Any]:
    return json.loads(dumps(kept))  # type: ignore[no-any-return]


def dumps(kept: dict[str, Seen]) -> str:
    return json.dumps({name: {"status": s.outcome.status.value, "node_rank": s.outcome.node_rank,
                              "code": s.outcome.code, "detail": s.outcome.detail,
                              "own_failure": s.outcome.own_failure,
                              "elapsed": s.outcome.elapsed, "at": s.at, "by": s.by}
                       for name, s in kept.items()}, indent=2) + "\n"


def parse(text: str) -> dict[str, Seen]:
    """outcomes.json's text; ValueError (KeyError, TypeError) where it is damaged."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError("not a table of nodes")
    return {str(name): _one(str(name), d) for name, d in data.items()}


def _one(name: str, d: dict[str, Any]) -> Seen:
    code, elapsed, at = d["code"], d.get("elapsed"), d["at"]
    for what, value in (("code", code), ("elapsed", elapsed)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{name}: {what} {value!r} is no whole number")
    if not isinstance(at, int | float) or not isinstance(d["node_rank"], int):
        raise TypeError(f"{name}: a time or node rank that is no number")
    outcome = NodeOutcome(name, d["node_rank"], NodeStatus(d["status"]), code,
                          str(d.get("detail", "")), str(d.get("own_failure", "")), elapsed)
    return Seen(outcome, float(at), str(d.get("by", "")))


@contextlib.contextmanager
def _locked(record_dir: Path) -> Iterator[None]:
    fd = os.open(record_dir / LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
