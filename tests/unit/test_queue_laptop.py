"""The queue on the laptop's side: the runner's state as fleet reads it (fleet/facts/queue.py:
only what it can check), a sweep's grid and runs (fleet/lifecycle/sweep.py), the sweep's
record as history (fleet/run/sweeps.py), and its words (fleet/lifecycle/sweepview.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.config.job import load_job
from fleet.errors import RunNotFound, UsageError
from fleet.facts.queue import QueuedRun, parse_look
from fleet.lifecycle import sweep
from fleet.lifecycle.sweepview import line, table
from fleet.run import sweeps
from fleet.run.sweeps import SweepRecord


def look(runs: dict[str, object], agents: object = None, alive: str = "alive") -> str:
    return f"{alive}\n===\n" + json.dumps({"v": 1, "now": 100.0, "agents": agents or {},
                                          "runs": runs})


def run(**kw: object) -> dict[str, object]:
    base = {"sweep": "sw", "state": "running", "host": "node1", "gpus": [0], "attempt": 1,
            "started": 10.0, "ended": None, "code": None, "metrics": {}, "why": ""}
    return {**base, **kw}


def test_the_runners_state_is_read_as_untrusted_input() -> None:
    got = parse_look(look({
        "sw-1": run(state="succeeded", ended=20.0, code=0, metrics={"loss": 0.5, "x y": 1,
                                                                   "acc": "high"}),
        "sw-2": run(host="elsewhere"),  # not a host of the inventory: dropped
        "sw-3": run(state="exploded"),  # not a state: dropped
        "../x": run(),  # not a run id: dropped
        "sw-4": run(gpus=[0, "1", -2, 70000], code=999, attempt=True,
                    why="\x1b[31mred\nline"),
    }, agents={"node1": {"seen": 99.0, "gpus": [0, 1], "free": [1], "held": {"0": "a lease"}},
               "ghost": {"seen": 1.0}}), {"node1", "node2"}, "root")
    assert got.alive and got.now == 100.0
    assert set(got.runs) == {"sw-1", "sw-4"}
    assert got.runs["sw-1"].metrics == {"loss": 0.5}
    assert got.runs["sw-1"].user == "root" and got.runs["sw-1"].exit_code == 0
    four = got.runs["sw-4"]
    assert four.gpu_ids == (0,) and four.exit_code is None and four.attempt == 1
    assert four.why == "[31mredline"
    assert set(got.agents) == {"node1"} and got.agents["node1"].held == {0: "a lease"}


def test_a_damaged_or_missing_state_is_said_not_obeyed() -> None:
    assert parse_look("gone\n===\n", {"a"}).runs == {}
    bad = parse_look("gone\n===\n{not json", {"a"})
    assert not bad.alive and "not JSON" in bad.damaged
    assert parse_look("alive\n===\n[1, 2]", {"a"}).damaged


def test_a_grid_makes_every_combination_and_refuses_mistakes() -> None:
    grid = sweep.parse_grid(["lr=1e-3,3e-4", "bs=32,64,128"])
    combos = sweep.combos(grid)
    assert len(combos) == 6 and combos[0] == {"lr": "1e-3", "bs": "32"}
    for bad in (["lr"], ["1lr=1"], ["lr=1,,2"], ["lr=1,1"], ["lr=1", "lr=2"], [],
                ["x=" + ",".join(map(str, range(1001)))]):
        with pytest.raises(UsageError):
            sweep.parse_grid(bad)


def test_a_combination_reaches_the_job_as_arguments_or_environment(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.toml").write_text('inventory = "inv.toml"\nscript = "train.py"\n'
                                       'args = ["--epochs", "3", "{args}", "--tail"]\n')
    job = load_job(tmp_path / "job.toml")
    as_args = sweep.with_params(job, {"lr": "1e-3", "bs": "32"}, "args")
    assert as_args.args == ("--epochs", "3", "--lr", "1e-3", "--bs", "32", "--tail")
    as_env = sweep.with_params(job, {"LR": "1e-3"}, "env")
    assert as_env.env["LR"] == "1e-3" and as_env.args == job.args


def test_expect_is_a_duration_made_of_the_grids_values() -> None:
    assert sweep.expected("{epochs}m", {"epochs": "3"}) == 180.0
    assert sweep.expected(None, {}) is None
    with pytest.raises(UsageError, match="not a name"):
        sweep.expected("{steps}s", {"epochs": "3"})
    with pytest.raises(UsageError, match="not a duration"):
        sweep.expected("{epochs}", {"epochs": "3"})


def record(runs: tuple[QueuedRun, ...]) -> SweepRecord:
    return SweepRecord(sweep_id="sw", job="/j.toml", job_name="j", inventory="/inv.toml",
                       queue_host="node1", user="me", submitted=1.0, runs=runs)


def test_an_end_fleet_saw_is_history_a_later_attempt_is_news(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    rec = record((QueuedRun("sw-1", {"lr": "1"}, state="succeeded", host="node1", started=1.0,
                            ended=9.0, exit_code=0), QueuedRun("sw-2", {"lr": "2"})))
    sweeps.save(rec)
    later = sweeps.merged(rec, {
        "sw-1": QueuedRun("sw-1", state="failed", host="node2"),  # a host says otherwise
        "sw-2": QueuedRun("sw-2", state="running", host="node2", gpu_ids=(1,), started=5.0)})
    assert later.runs[0] == rec.runs[0]
    assert later.runs[1].state == "running" and later.runs[1].params == {"lr": "2"}
    again = sweeps.merged(later, {"sw-2": QueuedRun("sw-2", state="queued", attempt=2,
                                                    why="attempt 2: node2 was lost")})
    assert again.runs[1].state == "queued" and again.runs[1].attempt == 2
    forged = sweeps.merged(again, {"sw-1": QueuedRun("sw-1", state="failed", attempt=9)})
    assert forged.runs[0] == rec.runs[0]  # an end fleet saw stays, whatever the attempt
    assert sweeps.load("s").sweep_id == "sw" and sweeps.load().sweep_id == "sw"
    with pytest.raises(RunNotFound):
        sweeps.load("nope")
    (sweeps.sweeps_dir() / "zz.json").write_text("{")
    every, damaged = sweeps.all_sweeps()
    assert [s.sweep_id for s in every] == ["sw"] and "zz.json" in damaged


def test_a_sweeps_words() -> None:
    rec = record((QueuedRun("sw-1", {"lr": "1e-3"}, state="succeeded", host="node1",
                            gpu_ids=(2,), started=0.0, ended=75.0, metrics={"loss": 0.25}),
                  QueuedRun("sw-2", {"lr": "3e-4"}, why="waits for 1 free GPU(s)")))
    head, body = table(rec)
    assert head == "sweep sw: j on /inv.toml, 1 queued, 1 succeeded"
    assert body.splitlines()[0].split() == ["#", "lr", "STATE", "WHERE", "TIME", "LOSS"]
    assert body.splitlines()[1].split() == ["1", "1e-3", "succeeded", "node1", "GPU", "2",
                                            "1m15s", "0.25"]
    assert line(rec.runs[0]) == "sw-1 lr=1e-3: succeeded after 1m15s, loss 0.25"
    assert line(rec.runs[1]) == "sw-2 lr=3e-4: waits for 1 free GPU(s)"
