"""Experiment trackers across attempts and a subset of the inventory, through the real CLI on
real sshd hosts that share nothing: three attempts of one run (a job that fails twice, then
succeeds) write one run in an MLflow file store and one wandb run id in offline mode, each
attempt with the run's FLEET_RUN_ID; `--exclude` and `--node` run the job on the hosts left,
the first of them the master, and nothing on the others."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleet import trackers
from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

TRACK = '''import os, sys
attempt = int(os.environ["FLEET_ATTEMPT"])
print(f"attempt {attempt} of run {os.environ['FLEET_RUN_ID']} as "
      f"{os.environ['FLEET_ATTEMPT_ID']}", flush=True)
if os.environ["TRACKER"] == "mlflow":
    import mlflow
    with mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"]):
        mlflow.log_metric("attempt", attempt, step=attempt)
else:
    import wandb
    run = wandb.init(project="fleet-e2e")
    run.log({"attempt": attempt})
    print(f"wandb run {run.id}", flush=True)
    wandb.finish()
sys.exit(0 if attempt == 3 else 1)
'''
LIMIT_S = 240


def tracked_job(tmp_path: Path, tb: Testbed, tracker: str, env: dict[str, str]) -> Path:
    (tmp_path / "track.py").write_text(TRACK)
    tb.inventory(tmp_path / "inv.toml")
    lines = "".join(f'{k} = "{v}"\n' for k, v in {"TRACKER": tracker, **env}.items())
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                   'command = ["{python}", "track.py"]\n'
                   f'[restart]\nmax = 2\nbackoff = 0\ntracker = "{tracker}"\n[env]\n{lines}')
    return job


def three_attempts(cli: CLI, tb: Testbed, job: Path, *where: str) -> tuple[str, str]:
    """The run's id, and what `fleet up` printed: the job's lines (stdout), then fleet's."""
    r = cli("up", str(job), *where, timeout=LIMIT_S)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    run_id = run_id_of(r.stderr)
    said = re.findall(r"attempt (\d) of run (\S+) as (\S+)", r.stdout)
    assert said == [("1", run_id, run_id), ("2", run_id, f"{run_id}-a2"),
                    ("3", run_id, f"{run_id}-a3")], out
    for attempt in (run_id, f"{run_id}-a2", f"{run_id}-a3"):
        assert_nothing_left(tb, attempt)
    return run_id, out


def test_three_attempts_write_one_mlflow_run(tb3: Testbed, cli: CLI, tmp_path: Path) -> None:
    store = tb3.host("node1").home / "mlstore"  # on the master; read here through its home
    job = tracked_job(tmp_path, tb3, "mlflow", {"MLFLOW_TRACKING_URI": f"file:{store}",
                                                "MLFLOW_ALLOW_FILE_STORE": "true"})
    run_id, out = three_attempts(cli, tb3, job, "--node", "node1")
    metas = list(store.glob("*/*/meta.yaml"))
    assert len(metas) == 1, (metas, out)  # one run: created once, taken up by every attempt
    mlflow_id = metas[0].parent.name
    assert f"MLflow run {mlflow_id}" in out
    history = (metas[0].parent / "metrics" / "attempt").read_text().split("\n")
    # Each attempt's metric (time, value, step), all in the one run.
    assert sorted((float(v), s) for _, v, s in (line.split() for line in history if line)) == [
        (1.0, "1"), (2.0, "2"), (3.0, "3")]
    record = cli.cwd / ".fleet" / "runs" / run_id / trackers.RECORD
    assert mlflow_id in record.read_text()


def test_three_attempts_write_one_wandb_run(tb3: Testbed, cli: CLI, tmp_path: Path) -> None:
    where = tb3.host("node2").home / "wb"
    job = tracked_job(tmp_path, tb3, "wandb", {"WANDB_MODE": "offline", "WANDB_DIR": str(where),
                                               "WANDB_SILENT": "true"})
    where.mkdir()
    run_id, out = three_attempts(cli, tb3, job, "--exclude", "node1", "--exclude", "node3")
    wanted = trackers.wandb_id(run_id)
    assert re.findall(r"^node2 \| wandb run (\S+)$", out, re.M) == [wanted] * 3, out
    runs = sorted(p.name for p in (where / "wandb").glob("offline-run-*"))
    assert len(runs) == 3 and all(name.endswith(f"-{wanted}") for name in runs), runs


def test_exclude_runs_on_the_hosts_left_the_first_the_master(tb3: Testbed, cli: CLI,
                                                            tmp_path: Path) -> None:
    tb3.inventory(tmp_path / "inv.toml")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nlauncher = "command"\ncommand = ["sh", "-c", '
                   '"echo on $FLEET_NODE rank {node_rank} of {nnodes} master {master_addr}"]\n')
    r = cli("up", str(job), "--exclude", "node1", timeout=LIMIT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    addr = tb3.host("node2").addr
    said = sorted(re.findall(r"on (node\d) rank (\d) of (\d) master (\S+)", r.stdout))
    assert said == [("node2", "0", "2", addr), ("node3", "1", "2", addr)], r.stdout
    assert not (tb3.host("node1").home / "fleet" / "runs" / run_id).exists()
    assert (tb3.host("node3").home / "fleet" / "runs" / run_id).is_dir()
    r = cli("up", str(job), "-x", "node1", "-x", "node2", "-x", "node3")
    assert r.returncode == 2 and "leaves no host of" in r.stderr, r.stderr
