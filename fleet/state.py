"""Local record of runs under .fleet/runs/<run-id>/, so later commands can find every node."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import RunNotFound
from fleet.inventory import Host
from fleet.plan import Plan


@dataclass(frozen=True)
class NodeRecord:
    host: Host
    node_rank: int
    run_dir: str
    rank_base: int | None


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    job: str
    started: float
    nodes: tuple[NodeRecord, ...]

    @property
    def dir(self) -> Path:
        return state_dir() / self.run_id


def state_dir() -> Path:
    return Path(os.environ.get("FLEET_STATE_DIR", ".fleet")) / "runs"


def save(plan: Plan) -> RunRecord:
    rec = RunRecord(run_id=plan.run_id, job=str(plan.job.path), started=time.time(),
                    nodes=tuple(NodeRecord(n.host, n.node_rank, n.run_dir, n.rank_base)
                                for n in plan.nodes))
    d = state_dir() / plan.run_id
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").write_text(json.dumps(dataclasses.asdict(rec), indent=2) + "\n")
    return rec


def load(run_id: str | None = None) -> RunRecord:
    """A recorded run by id, or the latest one."""
    root = state_dir()
    if run_id is None:
        runs = all_runs()
        if not runs:
            raise RunNotFound(f"no runs recorded under {root} (run `fleet up JOB` first)")
        return runs[-1]
    path = root / run_id / "run.json"
    if "/" in run_id or not path.is_file():
        raise RunNotFound(f"no run {run_id!r} under {root} (see `fleet ps`)")
    data = json.loads(path.read_text())
    nodes = tuple(NodeRecord(Host(**{**n["host"]}), n["node_rank"], n["run_dir"],
                             n.get("rank_base"))
                  for n in data["nodes"])
    return RunRecord(data["run_id"], data["job"], data["started"], nodes)


def all_runs() -> list[RunRecord]:
    """Every recorded run, oldest first."""
    runs = [load(p.parent.name) for p in state_dir().glob("*/run.json")]
    return sorted(runs, key=lambda r: r.started)
