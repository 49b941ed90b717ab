"""Experiment trackers across attempts: the variables planning sets, the record of the MLflow run
fleet created, the parser of what the master said, and the node program under a real `sh`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import trackers
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.config.restart import Restart, Tracker
from fleet.facts import mlflow_run
from fleet.facts.mlflow_run import NoRun
from fleet.plan import make_plan

HEX = "0123456789abcdef" * 2


def job(tracker: Tracker | None, env: dict[str, str] | None = None) -> Job:
    return Job(path=Path("/j/job.toml"), name="Train.v2_x", inventory=Path("/j/inv.toml"),
               workdir=Path("/j"), script="train.py", env=env or {},
               restart=Restart(max=2, tracker=tracker))


INV = Inventory(Path("/j/inv.toml"), (Host("n1", "10.0.0.1"), Host("n2", "10.0.0.2")))


def test_a_wandb_id_is_lowercase_alnum_stable_and_its_own() -> None:
    one = trackers.wandb_id("Train.v2_x-20260101-000000-ab12")
    assert re.fullmatch(r"[a-z0-9]+", one) and len(one) <= 48
    assert one.startswith("trainv2x20260101000000ab12")
    assert one == trackers.wandb_id("Train.v2_x-20260101-000000-ab12")
    # Two ids that differ only in what is dropped still differ.
    assert trackers.wandb_id("a-b-1") != trackers.wandb_id("ab-1")


def test_every_attempt_is_planned_with_the_runs_wandb_id() -> None:
    first = make_plan(INV, job(Tracker.WANDB), "r-1", master_addr="10.0.0.1")
    later = make_plan(INV, job(Tracker.WANDB), "r-1-a3", master_addr="10.0.0.1", run="r-1")
    for p in (first, later):
        assert {(n.env["WANDB_RUN_ID"], n.env["WANDB_RESUME"]) for n in p.nodes} == {
            (trackers.wandb_id("r-1"), "allow")}
    # The job's own value wins; without a tracker none is set; MLflow's comes later.
    mine = make_plan(INV, job(Tracker.WANDB, {"WANDB_RUN_ID": "mine"}), "r-1",
                     master_addr="10.0.0.1")
    assert mine.master.env["WANDB_RUN_ID"] == "mine"
    for tracker in (None, Tracker.MLFLOW):
        env = make_plan(INV, job(tracker), "r-1", master_addr="10.0.0.1").master.env
        assert not {"WANDB_RUN_ID", "WANDB_RESUME", "MLFLOW_RUN_ID"} & set(env)


def test_the_created_run_is_kept_for_the_attempts_after(tmp_path: Path) -> None:
    assert trackers.created_vars(tmp_path) == {}
    trackers.keep(tmp_path, HEX)
    assert trackers.created_vars(tmp_path) == {"MLFLOW_RUN_ID": HEX}
    for bad in ('{"mlflow_run_id": "../x"}', '{"mlflow_run_id": 3}', "[1]", "not json"):
        (tmp_path / trackers.RECORD).write_text(bad)
        assert trackers.created_vars(tmp_path) == {}


def test_only_a_well_formed_run_id_comes_back() -> None:
    assert mlflow_run.parse(f"noise\nfleet-mlflow run {HEX}\n", 0, "py") == HEX
    for out, code in [(f"fleet-mlflow run {HEX.upper()}", 0), (f"fleet-mlflow run {HEX}0", 0),
                      (f"fleet-mlflow run {HEX} extra", 0), (f"fleet-mlflow run {HEX}", 1),
                      ("fleet-mlflow run ../../etc", 0), ("", 0), (f"run {HEX}", 0)]:
        with pytest.raises(NoRun, match="creating the MLflow run failed"):
            mlflow_run.parse(out, code, "py")
    with pytest.raises(NoRun) as e:
        mlflow_run.parse("fleet-mlflow missing No module named 'mlflow'\n", 0, "/v/bin/python")
    assert "(/v/bin/python) cannot import mlflow (No module named 'mlflow')" in str(e.value)
    assert "pip install mlflow-skinny" in str(e.value)
    with pytest.raises(NoRun, match=r"exit 1\): Traceback .* \| MlflowException: no"):
        mlflow_run.parse("Traceback (most recent call last):\nMlflowException: no\n", 1, "py")


def node(tmp_path: Path, env: str) -> tuple[Path, Path]:
    code, run = tmp_path / "code", tmp_path / "run"
    code.mkdir()
    run.mkdir()
    (run / "env.sh").write_text(env)
    return code, run


def created(code: Path, run: Path, python: str) -> tuple[int, str]:
    r = subprocess.run(["sh", "-s"], input=mlflow_run.command(str(code), str(run), python, "r-1"),
                       capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_the_program_creates_one_run_in_the_jobs_store(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    code, run = node(tmp_path, "export MLFLOW_TRACKING_URI=file:store\n"
                               "export MLFLOW_ALLOW_FILE_STORE=true\n"
                               "export MLFLOW_EXPERIMENT_NAME=exp\n")
    rc, out = created(code, run, sys.executable)
    run_id = mlflow_run.parse(out, rc, sys.executable)
    # Relative to the job's directory, as the job's own start_run(run_id=...) finds it.
    metas = list((code / "store").glob(f"*/{run_id}/meta.yaml"))
    assert len(metas) == 1 and "r-1" in metas[0].read_text()


def test_a_python_without_mlflow_is_said_as_such(tmp_path: Path) -> None:
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or subprocess.run([bare, "-c", "import mlflow"],
                                      capture_output=True).returncode == 0:
        pytest.skip("no python without mlflow here")
    code, run = node(tmp_path, "")
    rc, out = created(code, run, bare)
    with pytest.raises(NoRun, match="cannot import mlflow"):
        mlflow_run.parse(out, rc, bare)


def test_the_nodes_whose_python_lacks_the_tracker_are_named() -> None:
    said = {"n1": ("torch==2.1", "wandb==0.16.0"), "n2": ("torch==2.1",), "n3": (),
            "n4": ("MLflow_Skinny==3.1",)}
    assert trackers.lacking(Tracker.WANDB, said) == ["n2", "n4"]  # n3 said nothing: not known
    assert trackers.lacking(Tracker.MLFLOW, said) == ["n1", "n2"]
    assert trackers.lacking(None, said) == []
