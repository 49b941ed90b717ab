"""The stragglers `fleet up`'s watch named in a run, kept in each attempt's local record
(<state dir>/runs/<attempt's run id>/stragglers.json) the moment each was named: history, which
`fleet status` shows from the laptop's record alone, the run live or finished."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet import events as ev
from fleet.errors import DamagedRecord
from fleet.run.record import write_atomic

FILE = "stragglers.json"
MOST = 100  # named in one attempt: kept at most (a rank is named again only after another)
LINE_CHARS = 2000


@dataclass(frozen=True)
class Named:
    """One straggler named, when, in which attempt (its own run id)."""

    straggler: ev.Straggler
    at: float  # time.time()
    run_id: str

    def words(self, attempt: int | None = None) -> str:
        """`straggler: rank 1 (node2) is the straggler: ... (named at 12:03:04)`."""
        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        where = f" in attempt {attempt}" if attempt is not None else ""
        return f"straggler: {self.straggler.line} (named at {when}{where})"


def keep(record_dir: Path, s: ev.Straggler, run_id: str) -> str | None:
    """Add the straggler to the attempt's record; None where kept, else why not (a record
    gone or full is said, never the run's end)."""
    try:
        kept = read(record_dir)
    except DamagedRecord as e:
        return str(e)
    if len(kept) >= MOST:
        return f"{record_dir / FILE}: {MOST} stragglers kept already"
    named = [*kept, Named(s, time.time(), run_id)]
    try:
        write_atomic(record_dir / FILE, json.dumps(
            {"stragglers": [as_json(n) for n in named]}, indent=2) + "\n")
    except OSError as e:
        return f"{record_dir / FILE}: {e.strerror or e}"
    return None


def as_json(n: Named) -> dict[str, Any]:
    """As the record and `status --json` have it: the event's fields, `at` and `run_id`."""
    d = ev.as_json(n.straggler)
    return {k: v for k, v in d.items() if k not in ("v", "event")} | {"at": n.at,
                                                                    "run_id": n.run_id}


def read(record_dir: Path) -> list[Named]:
    """The stragglers kept in an attempt's record, in the order named ([] where none was)."""
    path = record_dir / FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise DamagedRecord(f"{path}: cannot be read ({e})") from e
    try:
        items = json.loads(text)["stragglers"]
        if not isinstance(items, list):
            raise TypeError("stragglers is no list")
        return [parse(item) for item in items[:MOST]]
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedRecord(f"{path}: the stragglers kept are damaged ({e}); remove that "
                            "file") from e


def parse(d: Any) -> Named:
    """One kept straggler (ValueError or TypeError where it is not one)."""
    if not isinstance(d, dict):
        raise TypeError(f"{d!r} is no table")
    rank, score, wait, at = d["rank"], d["score"], d["others_wait"], d["at"]
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise TypeError(f"rank {rank!r} is no rank")
    for name, value in (("score", score), ("others_wait", wait), ("at", at)):
        if not isinstance(value, int | float) or isinstance(value, bool) \
                or not math.isfinite(value):
            raise TypeError(f"{name} {value!r} is no number")
    for name in ("host", "place", "line", "run_id"):
        if not isinstance(d[name], str) or len(d[name]) > LINE_CHARS:
            raise TypeError(f"{name} {d[name]!r} is no text")
    return Named(ev.Straggler(rank, d["host"], float(score), float(wait), d["place"],
                              d["line"]), float(at), d["run_id"])


def of_run(record_dirs: list[Path]) -> tuple[list[Named], list[str]]:
    """Every straggler kept in a run's attempts' records (in attempt order), and a line per
    record whose kept stragglers could not be read (the rest is still said)."""
    named: list[Named] = []
    problems = []
    for d in record_dirs:
        try:
            named += read(d)
        except DamagedRecord as e:
            problems.append(str(e))
    return named, problems
