"""Experiment trackers across attempts (`[restart] tracker`): the variables that make every
attempt of one run write to one tracker run, and the record of what fleet created for it. A
wandb run is named after the fleet run (WANDB_RUN_ID, WANDB_RESUME=allow); an MLflow run must
exist before `start_run(run_id=...)` finds it, so fleet creates it once, on the master before
the first attempt (fleet.facts.mlflow_run), and keeps its id beside the run's record."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from fleet.config.restart import Tracker

WANDB_RUN_VAR = "WANDB_RUN_ID"
WANDB_RESUME_VAR = "WANDB_RESUME"
MLFLOW_RUN_VAR = "MLFLOW_RUN_ID"
RECORD = "tracker.json"  # in the run's (its first attempt's) local record
WANDB_ID_CHARS = 40  # of the run id's own letters and digits, before its digest


def wandb_id(run_id: str) -> str:
    """A wandb run id for the fleet run: lowercase letters and digits only (wandb refuses some
    characters in an id, and its run pages lower-case them), the run id's own ones followed by
    a digest of the whole, so that two runs never share one."""
    own = re.sub(r"[^a-z0-9]", "", run_id.lower())[:WANDB_ID_CHARS]
    return own + hashlib.sha256(run_id.encode()).hexdigest()[:8]


def plan_vars(tracker: Tracker | None, run_id: str) -> dict[str, str]:
    """What planning alone sets for the tracker, `run_id` the run's (the first attempt's):
    wandb's; MLflow's run id is only known once fleet created it (created_vars)."""
    if tracker is Tracker.WANDB:
        return {WANDB_RUN_VAR: wandb_id(run_id), WANDB_RESUME_VAR: "allow"}
    return {}


# The distributions that give a tracker's import, as `pip freeze` names them (lower case).
PACKAGES = {Tracker.WANDB: ("wandb",), Tracker.MLFLOW: ("mlflow", "mlflow-skinny")}


def lacking(tracker: Tracker | None, packages: dict[str, tuple[str, ...]]) -> list[str]:
    """The nodes whose python has none of the tracker's packages (`name==version` each, as the
    probe says them; a node that said none is not known to lack it)."""
    if tracker is None:
        return []
    return [node for node, said in packages.items() if said and not any(
        re.sub(r"[-_.]+", "-", p.split("==", 1)[0].lower()) in PACKAGES[tracker] for p in said)]


def keep(run_dir: Path, mlflow_run_id: str) -> None:
    """Record the MLflow run fleet created for the run (its local record's directory)."""
    tmp = run_dir / f".{RECORD}.tmp"
    tmp.write_text(json.dumps({"mlflow_run_id": mlflow_run_id}) + "\n")
    tmp.replace(run_dir / RECORD)


def created_vars(run_dir: Path) -> dict[str, str]:
    """The variables of what fleet created for the run before (its MLflow run): a later attempt
    sets them instead of creating another. Nothing where the record holds none; an id that is
    not one is left out (the record is a file a person may edit)."""
    try:
        data = json.loads((run_dir / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    found = data.get("mlflow_run_id") if isinstance(data, dict) else None
    return {MLFLOW_RUN_VAR: found} if isinstance(found, str) and MLFLOW_ID.match(found) else {}


MLFLOW_ID = re.compile(r"[0-9a-f]{32}\Z")  # uuid4().hex, as MLflow makes run ids
