"""What a detached run that healed by itself left to say (fleet.backends.hosts.heal): the
master's healed.json, read back as the node's word when `status` or `ps` first sees it, and
taken into the run's record on this machine: the attempt that ran becomes a record of its own
(`<run>-a2`, the one of those waiting that has the spare in the lost node's place), and the
run's attempts.json says the first attempt, the loss and the replacement."""

from __future__ import annotations

import dataclasses
import json
import shutil

from fleet.errors import RemoteCommandError
from fleet.nodeside.shared.heal_rules import HEALED, MAX_HEALED, Healing, parse_healed
from fleet.run import record as state
from fleet.run import watched
from fleet.run.record import RunRecord
from fleet.shell import quote
from fleet.transport import open_transport

ATTEMPTS = "attempts.json"  # fleet.lifecycle.attempts.FILE, which this writes for the run
MAX_FILE = "max"  # in the waiting records' folder: `[restart] max` of the run


def waiting(rec: RunRecord) -> list[str]:
    """The nodes whose loss an attempt waits for (none: nothing prepared, or taken in)."""
    d = rec.dir / "heal"
    if rec.parent or not d.is_dir() or (state.state_dir() / f"{rec.run_id}-a2").exists():
        return []
    return sorted(p.name for p in d.iterdir() if (p / "run.json").is_file())


def waiting_record(rec: RunRecord) -> RunRecord | None:
    """One record of every node's directory of the attempt prepared and never taken in
    (`fleet rm` removes them with the run's own), None where there is none."""
    lost = waiting(rec)
    if not lost:
        return None
    recs = [state.parse_record((rec.dir / "heal" / x / "run.json").read_text()) for x in lost]
    nodes = {n.host.name: n for r in recs for n in r.nodes}
    return dataclasses.replace(recs[0], nodes=tuple(nodes.values()))


def read(rec: RunRecord) -> str:
    """healed.json on the run's master ("" where it is not there: not healed)."""
    m = rec.nodes[0]
    t = open_transport(m.host)
    try:
        r = t.run(f"head -c {MAX_HEALED + 1} {quote(f'{m.run_dir}/{HEALED}')} 2>/dev/null",
                  timeout=15, what="read healed.json")
    finally:
        t.close()
    return r.out if r.ok else ""


def take(rec: RunRecord, text: str) -> Healing | None:
    """The healing healed.json (`text`) says, taken into the record; RemoteCommandError where
    it is not fleet's word."""
    lost = waiting(rec)
    if not lost or not text.strip():
        return None
    d = rec.dir / "heal"
    spares = tuple(sorted({n.host.name for x in lost for n in state.parse_record(
        (d / x / "run.json").read_text()).nodes} - {n.host.name for n in rec.nodes}))
    try:
        h = parse_healed(text, rec.run_id, tuple(n.host.name for n in rec.nodes), spares)
    except ValueError as e:
        raise RemoteCommandError(rec.nodes[0].host.name, f"read {HEALED}", 0,
                                 f"not a healing fleet prepared ({e}); the run's record is "
                                 "left as it was") from None
    if h.lost not in lost or h.run != f"{rec.run_id}-a2":
        raise RemoteCommandError(rec.nodes[0].host.name, f"read {HEALED}", 0,
                                 f"{h.run} with {h.lost} lost: no such attempt was prepared")
    max_ = int((d / MAX_FILE).read_text().strip() or "1")
    target = state.state_dir() / h.run
    (d / h.lost).rename(target)
    state.mark_launched(target)
    watched.mark(target)  # its own watchers, started with it on the nodes
    hosts = [n.host.name for n in rec.nodes]
    first = {"number": 1, "run_id": rec.run_id, "hosts": hosts, "started": rec.started,
             "ended": h.at, "status": "failed", "why": f"{h.lost} was lost",
             "stopped_at": h.at, "progressed_at": None, "replaced": {h.lost: h.spare},
             "then": "healed by the nodes' watchers", "lost": [h.lost]}
    state.write_atomic(rec.dir / ATTEMPTS, json.dumps({"max": max_, "attempts": [first]},
                                                      indent=2) + "\n")
    shutil.rmtree(d, ignore_errors=True)
    return h
