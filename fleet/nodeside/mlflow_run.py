"""Creates the MLflow run that every attempt of a fleet run writes to (`[restart] tracker =
"mlflow"`). Runs once, on the master before the first attempt, with the job's python, in the
job's directory and with the job's env (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME or
MLFLOW_EXPERIMENT_ID), so that a relative store means what it means to the job. Its last line
says what it did: `fleet-mlflow run <id>`, or `fleet-mlflow missing <why>` where mlflow cannot
be imported; anything else failing is its traceback and a non-zero exit.
Argument: the fleet run's id (the MLflow run's name and its tag fleet.run_id)."""

from __future__ import annotations

import importlib
import os
import sys

MARK = "fleet-mlflow"


def main(argv: list[str]) -> int:
    name = argv[1] if len(argv) > 1 else "fleet"
    try:
        tracking = importlib.import_module("mlflow.tracking")
    except ImportError as e:
        print(f"{MARK} missing {e}")
        return 0
    client = tracking.MlflowClient()
    experiment = os.environ.get("MLFLOW_EXPERIMENT_ID") or ""
    if not experiment:
        # MLflow's own default where none is named; a new file store has none yet.
        named = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "Default"
        found = client.get_experiment_by_name(named)
        experiment = found.experiment_id if found is not None else client.create_experiment(named)
    run = client.create_run(experiment, run_name=name, tags={"fleet.run_id": name})
    # The run stays RUNNING: the job's start_run(run_id=...) takes it up, its end ends it.
    print(f"{MARK} run {run.info.run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
