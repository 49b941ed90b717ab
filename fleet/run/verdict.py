"""A run's verdict as fleet saw it end, kept in its local record (<state dir>/runs/<run id>/
verdict.json) the moment `fleet up`, `logs -f` or `stop` saw it: the status, the exit code, by
which command, when, the one-line words, and the parts (node of an attempt) never seen to end.
It is history: the first verdict stands, and a run that has one is never asked about again
(`status` and `ps` answer from it, whatever host is down)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.errors import DamagedRecord
from fleet.run.record import write_atomic
from fleet.states import RunStatus

FILE = "verdict.json"


@dataclass(frozen=True)
class Lost:
    """A node's part of one attempt that fleet never saw end: it may still run there."""

    attempt: int
    run_id: str  # that attempt's own run id (its record holds the node's end, once seen)
    node: str

    def words(self, run_id: str) -> str:
        """`node2's part of attempt 1 was never seen to end; ...`: what status says of it."""
        return (f"{self.node}'s part of attempt {self.attempt} ({self.run_id}) was never seen to "
                f"end; `fleet stop {run_id}` once it answers")


@dataclass(frozen=True)
class Verdict:
    """How the run ended, as fleet saw it."""

    status: RunStatus
    code: int
    by: str  # "fleet up", "fleet logs -f", "fleet stop"
    at: float  # time.time()
    said: str  # the one-line words (`run R succeeded in 12s`)
    lost: tuple[Lost, ...] = ()

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))


def record(record_dir: Path, verdict: Verdict) -> Verdict:
    """Keep the verdict, unless one is kept already (the first stands); returns the one that
    stands. A run whose record is gone (removed meanwhile) keeps nothing."""
    if not record_dir.is_dir():
        return verdict
    kept = read(record_dir)
    if kept is not None:
        return kept
    write_atomic(record_dir / FILE, dumps(verdict))
    return verdict


def read(record_dir: Path) -> Verdict | None:
    """The run's kept verdict; None where fleet has not seen it end."""
    path = record_dir / FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise DamagedRecord(f"{path}: cannot be read ({e})") from e
    try:
        return parse(text)
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedRecord(f"{path}: the run's verdict is damaged ({e}); remove that file to "
                            "ask the nodes instead") from e


def dumps(v: Verdict) -> str:
    return json.dumps(as_json(v), indent=2) + "\n"


def as_json(v: Verdict) -> dict[str, Any]:
    return {"status": v.status.value, "code": v.code, "by": v.by, "at": v.at, "said": v.said,
            "lost": [{"attempt": p.attempt, "run_id": p.run_id, "node": p.node}
                     for p in v.lost]}


def parse(text: str) -> Verdict:
    """verdict.json's text; ValueError (KeyError, TypeError) where it is damaged."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise TypeError("not a verdict")
    status = RunStatus(d["status"])
    if not status.is_terminal:
        raise ValueError(f"{status.value!r} is no end")
    code, at = d["code"], d["at"]
    if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 255:
        raise TypeError(f"exit code {code!r} is none")
    if not isinstance(at, int | float) or isinstance(at, bool):
        raise TypeError(f"time {at!r} is no number")
    for what in ("by", "said"):
        if not isinstance(d[what], str):
            raise TypeError(f"{what} {d[what]!r} is no text")
    if not isinstance(d.get("lost", []), list):
        raise TypeError("lost is no list")
    return Verdict(status, code, d["by"], float(at), d["said"],
                   tuple(_lost(p) for p in d.get("lost", [])))


def _lost(p: Any) -> Lost:
    if not isinstance(p, dict):
        raise TypeError(f"a lost part {p!r} is no table")
    number, run_id, node = p["attempt"], p["run_id"], p["node"]
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise TypeError(f"attempt {number!r} is no attempt number")
    if not isinstance(run_id, str) or not isinstance(node, str) or not run_id or not node \
            or "/" in run_id:
        raise TypeError(f"a lost part's run {run_id!r} or node {node!r} is no name")
    return Lost(number, run_id, node)
