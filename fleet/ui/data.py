"""What the page shows, as JSON objects made from the same answers the CLI prints: the recorded
runs (fleet.run.record, fleet.lifecycle.answers), one run (status --json's object, show
--json's manifest, what fleet kept of its end and its hang), and the lab's GPUs (what `fleet
gpus --json` prints). History comes from this machine's records, never re-asked of hosts."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.errors import UsageError

if TYPE_CHECKING:
    from fleet.run.record import RunRecord

MOST_RUNS = 200  # the runs page lists the newest this many
STACKS_MOST = 2000  # lines of a kept stack dump the page shows


def runs(asked: int = MOST_RUNS) -> dict[str, Any]:
    """Every recorded run (a restart's attempts with their run), newest first: its state as
    `fleet ps` says it (a finished run's from its record; a live one's asked, all at once)."""
    from fleet.lifecycle import answers, attempts
    from fleet.run import record as state
    from fleet.transport.group import each, reason

    records, _ = state.all_runs()
    tops = [r for r in records if not r.parent][-asked:]
    said = each(((r.run_id, r) for r in tops), answers.ps_word)
    rows = []
    for r in reversed(tops):
        every = attempts.records(r)
        word = said[r.run_id]
        rows.append({**_summary(r, every),
                     "state": word if isinstance(word, str) else f"unknown ({reason(word)})"})
    return {"runs": rows}


def _summary(rec: RunRecord, every: list[RunRecord]) -> dict[str, Any]:
    """A run's row: job, hosts, attempts, start and how long it ran (to its kept end, else to
    now)."""
    from fleet.run import verdict

    kept = verdict.read(rec.dir)
    last = every[-1]
    return {"run_id": rec.run_id, "job": rec.job, "backend": str(rec.backend),
            "hosts": [n.host.name for n in last.nodes],
            "user": next((n.host.user for n in last.nodes if n.host.user), "") or _me(),
            "inventory": _inventory(rec.dir),
            "attempts": len(every), "started": rec.started,
            "duration": duration(rec.started, kept.at if kept else None, ends(last.dir)),
            "ended": kept is not None}


def ends(record_dir: Path) -> list[float]:
    """When fleet saw each node's part end (a later look, `status` a day on, says a late
    time: the page's duration is then as late)."""
    from fleet.run import outcomes

    return [s.at for s in outcomes.seen(record_dir).values() if s.final]


def _me() -> str:
    """The login that ran fleet here (a host with no `user` is reached as it)."""
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return ""


def _inventory(record_dir: Path) -> str:
    """The inventory the run's manifest names ("" where none is kept)."""
    import json

    try:
        return str(json.loads((record_dir / "manifest.json").read_text())["inventory"]["path"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def duration(started: float, kept: float | None, seen: list[float]) -> float | None:
    """How long a run ran: to the last node's end fleet saw, else to its kept end, else (it
    goes on) to now; None where that would run backwards."""
    end = max(seen) if seen else kept if kept is not None else time.time()
    return end - started if end >= started else None


def run(rec: RunRecord) -> dict[str, Any]:
    """One run: its state and nodes (status --json's object), its manifest, its end as fleet
    kept it, the last hang's stacks, the job's metrics."""
    from fleet.lifecycle import answers

    seen = answers.look(rec)
    status = answers.status_object(seen)
    shown = answers.shown(rec)
    return {**_summary(rec, seen.every), "state": seen.final.value, "status": status,
            "manifest": shown, "failure": failure(status, shown),
            "hang": hang(seen.last.dir), "metrics": metrics(shown),
            "ranks": ranks(seen.last)}


def ranks(last: RunRecord) -> dict[str, list[int]]:
    """Per node the global ranks the plan gave it (none where the node decides)."""
    out = {}
    for n in last.nodes:
        if n.rank_base is not None and n.nproc:
            out[n.host.name] = list(range(n.rank_base, n.rank_base + n.nproc))
    return out


def failure(status: dict[str, Any], shown: dict[str, Any]) -> list[str]:
    """What fleet kept of a run that did not succeed: its verdict's words and each node that
    failed by itself, as fleet saw them end. Empty for a run that succeeded or goes on."""
    kept = status.get("verdict") or {}
    if not kept or kept.get("status") == "succeeded":
        return []
    out = [str(kept.get("said", ""))]
    for host, o in sorted((shown.get("outcomes") or {}).items()):
        if isinstance(o, dict) and o.get("status") not in (None, "succeeded"):
            own = o.get("own_failure") or ""
            out.append(f"{host}: {o.get('status')}"
                       + (f" (exit {o['exit_code']})" if o.get("exit_code") is not None else "")
                       + (f": {own}" if own else "")
                       + (f" [{o['detail']}]" if o.get("detail") else ""))
    return [line for line in out if line]


def hang(record_dir: Path) -> dict[str, Any] | None:
    """The last stack dump fleet kept in the run's record (the hang watchdog's or `fleet
    dump`'s), its first line the verdict; None where none was kept."""
    dumps = sorted(record_dir.glob("stacks-*.txt"))
    if not dumps:
        return None
    try:
        lines = dumps[-1].read_text(errors="replace").splitlines()[:STACKS_MOST]
    except OSError as e:
        return {"verdict": f"{dumps[-1].name}: {e.strerror}", "stacks": []}
    return {"verdict": lines[0] if lines else "", "stacks": lines[1:], "file": dumps[-1].name}


def metrics(shown: dict[str, Any]) -> dict[str, str]:
    """The job's `[metrics]`, as its manifest kept them: name -> a pattern whose group `v` is
    the value (the page parses the log's lines with them)."""
    job = shown.get("job")
    found = job.get("metrics") if isinstance(job, dict) else None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def lab(results: dict[str, Any], now: float) -> dict[str, Any]:
    """One inventory's GPUs as `fleet gpus --json` prints them."""
    from fleet.gpuview import as_json

    return as_json(results, now)


def recorded_inventories(most: int = 50) -> list[Path]:
    """The inventories the newest runs recorded here ran on (those still there), newest
    first: the lab `fleet ui` shows when given none."""
    from fleet.run import record as state

    records, _ = state.all_runs()
    found: list[Path] = []
    for r in reversed(records[-most:]):
        path = Path(_inventory(r.dir))
        if path.is_absolute() and path.is_file() and path not in found:
            found.append(path)
    return found


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def load(typed: str) -> RunRecord:
    """A run named by the page (an id or its unique prefix, as the CLI takes it)."""
    from fleet.run import record as state

    if not RUN_ID.fullmatch(typed):
        raise UsageError(f"{typed[:80]!r} is no run id")
    return state.load(typed)
