"""Who watches a run that goes on: the attached `fleet up` that started it (its pid on this
machine, in the run's record), the nodes' own watchers (a mark in the record, made when they
were started with the run: fleet/nodeside/watcher.py), or nobody."""

from __future__ import annotations

from pathlib import Path

from fleet.config.inventory import BackendKind
from fleet.run.record import RunRecord, controller_alive
from fleet.states import RunStatus

WATCHED = "watched"  # in the run's record: the nodes' watchers were started with the run


def mark(record_dir: Path) -> None:
    (record_dir / WATCHED).touch()


def who(rec: RunRecord, final: RunStatus) -> str:
    """Who watches a run that goes on, as a word for scripts: "fleet_up", "nodes", "nobody", or
    "" (a run that has ended, or one Slurm watches)."""
    if final.is_terminal or rec.backend is not BackendKind.HOSTS:
        return ""
    if controller_alive(rec.controller):
        return "fleet_up"
    return "nodes" if (rec.dir / WATCHED).exists() else "nobody"


def watched_by(rec: RunRecord, final: RunStatus) -> str:
    """Who watches a run on SSH hosts that goes on, as `status` says it: the attached `fleet
    up` (its pid on this machine), the nodes' own watchers, or nobody; "" for a run that has
    ended, or one Slurm watches. Of a run some node of which cannot be asked (unknown), the
    watchers are said to watch where they still run: the node that lost the others stops its
    own part."""
    by = who(rec, final)
    if not by:
        return ""
    if by == "fleet_up":
        pid = rec.controller.split(":")[-2] if rec.controller.count(":") >= 2 else "?"
        return f"watched by: fleet up (pid {pid} on this machine)"
    if by == "nodes":
        if final is RunStatus.UNKNOWN:
            return ("watched by: the nodes' own watchers, where they still run (a node cut off "
                    "from the others stops its own part)")
        return ("watched by: the nodes' own watchers (a node that fails or goes silent stops "
                "the others)")
    return ("watched by: nobody (its `fleet up` has ended): a lost host holds the others until "
            "torch's own timeout; `fleet stop` ends it")
