"""`fleet usage`: GPU-hours per user, host and job from this machine's records alone
(fleet.run.usage): runs with chosen GPUs, one whose GPUs are unknown (named, never guessed), one
still running (to now, said), one straddling the window (its part inside), a restart's attempts,
a run that never started, queued runs, a Slurm run and a damaged record; and the command's
tables and JSON."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.cli import commands  # noqa: F401  (every command on the app)
from fleet.cli.app import app
from fleet.config.inventory import BackendKind, Host
from fleet.nodeside.shared.queue_rules import FAILED, LOST, QUEUED, RUNNING, SUCCEEDED
from fleet.run import outcomes, sweeps, usage, verdict
from fleet.run.outcomes import Seen
from fleet.run.record import LAUNCHED, NodeRecord, RunRecord, state_dir, write_atomic
from fleet.states import NodeOutcome, NodeStatus, RunStatus

H = 3600.0
DAY = 24 * H
ME = usage.me()


def node(name: str, gpus: tuple[int, ...] | None, user: str | None = None,
         rank: int = 0) -> NodeRecord:
    return NodeRecord(Host(name, f"10.0.0.{rank + 1}", user=user, gpus=gpus), rank,
                      f"~/fleet/runs/x/{name}", None)


def record(run_id: str, started: float, nodes: list[NodeRecord], ends: dict[str, float],
           kept: float | None = None, launched: bool = True, parent: str = "",
           backend: BackendKind = BackendKind.HOSTS) -> RunRecord:
    """A run's record as fleet writes it: run.json, the launched mark, each node's end as
    fleet saw it (at the given times) and the run's verdict."""
    rec = RunRecord(run_id, f"jobs/{run_id.split('-')[0]}.toml", started, tuple(nodes),
                    parent=parent, backend=backend)
    rec.dir.mkdir(parents=True)
    write_atomic(rec.dir / "run.json", json.dumps(dataclasses.asdict(rec)))
    if launched:
        (rec.dir / LAUNCHED).touch()
    seen = {n.host.name: Seen(NodeOutcome(n.host.name, n.node_rank, NodeStatus.SUCCEEDED, 0),
                              ends[n.host.name], "fleet up")
            for n in nodes if n.host.name in ends}
    if seen:
        write_atomic(rec.dir / outcomes.FILE, outcomes.dumps(seen))
    if kept is not None:
        verdict.record(rec.dir, verdict.Verdict(RunStatus.SUCCEEDED, 0, "fleet up", kept, "ok"))
    return rec


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> float:
    """The records of a day's runs, written against `now` (returned)."""
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    now = time.time()
    # 2 GPUs on n1 for 1h (alice), 4 on n2 for 2h (no user: this machine's)
    record("mnist-20261126-100000-aaaa", now - 3 * H,
           [node("n1", (0, 1), "alice"), node("n2", (0, 1, 2, 3), rank=1)],
           {"n1": now - 2 * H, "n2": now - 1 * H}, kept=now - 1 * H)
    # no GPUs chosen: unknown, 1 node-hour
    record("ddp-20261126-110000-bbbb", now - 2 * H, [node("n3", None, "alice")],
           {"n3": now - 1 * H}, kept=now - 1 * H)
    # still running: 1 GPU for the last 30 minutes, to now
    record("mnist-20261126-123000-cccc", now - 0.5 * H, [node("n1", (3,), "alice")], {})
    # straddles a 1d window: 3h in all, 1h of it inside
    record("old-20261125-080000-dddd", now - DAY - 2 * H, [node("n1", (0, 1), "alice")],
           {"n1": now - DAY + 1 * H}, kept=now - DAY + 1 * H)
    # never started a node: nothing counts
    record("mnist-20261126-120000-eeee", now - 1 * H, [node("n1", (0, 1), "alice")], {},
           launched=False)
    # a restart: attempt 1 (no end seen) until attempt 2's start, attempt 2 to its end
    record("big-20261126-070000-ffff", now - 5 * H, [node("n4", (0,), "bob")], {},
           kept=now - 3 * H)
    record("big-20261126-070000-ffff-a2", now - 4 * H, [node("n4", (0,), "bob")],
           {"n4": now - 3 * H}, parent="big-20261126-070000-ffff")
    # a Slurm run: its GPUs are not recorded
    record("ddp-20261126-090000-9999", now - 2 * H, [], {}, kept=now - H,
           backend=BackendKind.SLURM)
    damaged = state_dir() / "bad-20261126-000000-0000"
    damaged.mkdir()
    (damaged / "run.json").write_text("{")
    sweeps.save(sweeps.SweepRecord(
        "sw1", "jobs/tune.toml", "tune", "inv.toml", "q1", "carol", now - 3 * H, runs=(
            sweeps.QueuedRun("tune-1", host="n5", gpu_ids=(0, 1), state=SUCCEEDED,
                             started=now - 2 * H, ended=now - 1 * H, seen=now - H),
            sweeps.QueuedRun("tune-2", host="n5", gpu_ids=(2,), user="dave", state=RUNNING,
                             started=now - 1 * H, seen=now - 0.5 * H),
            sweeps.QueuedRun("tune-3", host="n5", gpu_ids=(3,), state=LOST,
                             started=now - 3 * H, seen=now - 2.5 * H),
            sweeps.QueuedRun("tune-4", state=QUEUED),
            sweeps.QueuedRun("tune-5", host="n5", state=FAILED, started=now - 3 * DAY,
                             ended=now - 2 * DAY, seen=now - 2 * DAY))))
    return now


def by(rows: list[usage.Row]) -> dict[str, tuple[float, int]]:
    return {r.name: (round(r.gpu_hours, 3), len(r.runs)) for r in rows}


def test_gpu_hours_per_user_host_and_job_over_a_day(lab: float) -> None:
    u = usage.usage(DAY, lab)
    assert by(u.users) == {"alice": (2.0 + 0.5 + 2.0, 4), ME: (8.0, 1), "bob": (2.0, 1),
                           "carol": (2.0 + 0.5, 2), "dave": (0.5, 1)} | (
        {ME: (8.0, 1)} if ME not in {"alice", "bob", "carol", "dave"} else {})
    assert by(u.hosts) == {"n1": (4.5, 3), "n2": (8.0, 1), "n3": (0.0, 1), "n4": (2.0, 1),
                           "n5": (3.0, 3)}
    assert by(u.jobs) == {"mnist": (10.5, 2), "ddp": (0.0, 1), "old": (2.0, 1),
                          "big": (2.0, 1), "tune": (3.0, 3)}
    assert [r.name for r in u.hosts] == ["n2", "n1", "n5", "n4", "n3"]  # most first
    assert round(u.total.gpu_hours, 3) == 17.5 and len(u.total.runs) == 8
    # the running ones, said: the fleet up run and the queued one the sweep saw running
    assert u.total.running == {"mnist-20261126-123000-cccc", "tune-2"}
    assert u.total.unknown == {"ddp-20261126-110000-bbbb"}
    assert round(u.total.unknown_node_hours, 3) == 1.0
    assert u.not_counted == ("ddp-20261126-090000-9999",)
    assert list(u.damaged) == [str(state_dir() / "bad-20261126-000000-0000" / "run.json")]


def test_a_longer_window_counts_the_whole_of_what_it_holds(lab: float) -> None:
    u = usage.usage(30 * DAY, lab)
    assert by(u.jobs)["old"] == (6.0, 1)  # 3h on 2 GPUs, all inside now
    assert by(u.jobs)["tune"] == (3.0 + 24.0, 4)  # tune-5: 1 GPU (none listed) for a day
    hours = {q.run_id: q.gpu_hours for q in sweeps.load("sw1").runs}
    assert round(sum(hours.values()), 3) == 27.0  # as the sweep's record counts them


def test_a_window_before_a_run_leaves_it_out(lab: float) -> None:
    u = usage.usage(0.25 * H, lab)  # the last 15 minutes: only what still runs
    assert {r.name for r in u.jobs} == {"mnist"}
    assert u.total.runs == {"mnist-20261126-123000-cccc"}
    assert round(u.total.gpu_hours, 3) == 0.25


def test_spans_are_pure() -> None:
    rec = RunRecord("j-20260101-000000-abcd", "j.toml", 100.0,
                    (node("a", (0, 1, 2)), node("b", None, "zoe", 1)))
    spans = usage.run_spans(rec, {"a": 3700.0}, None, 7300.0, "me")
    assert spans == [usage.Span("j-20260101-000000-abcd", "me", "a", "j", 3, 100.0, 3700.0),
                     usage.Span("j-20260101-000000-abcd", "zoe", "b", "j", None, 100.0, 7300.0,
                                running=True)]
    u = usage.aggregate(spans, 1900.0, 7300.0)
    assert round(u.total.gpu_hours, 6) == 1.5 and round(u.total.unknown_node_hours, 6) == 1.5
    assert usage.job_name("odd") == "odd"


def test_the_command_prints_three_tables_within_80_columns(lab: float) -> None:
    r = CliRunner().invoke(app, ["usage", "--since", "1d"])
    assert r.exit_code == 0, r.output
    text = r.output
    assert all(len(line) <= 80 for line in text.splitlines()
               if not line.startswith("damaged")), text
    for head in ("USER", "HOST", "JOB"):
        assert f"\n{head} " in text, text
    assert "total: 17.50 GPU-hours in 8 runs, 2 still running (counted to now)" in text, text
    assert "unknown GPUs: 1 run ran 1.00 node-hours" in text, text
    assert "not counted: 1 run on Slurm" in text, text
    assert f"\ndamaged records skipped (under {state_dir().parent}): " \
        "runs/bad-20261126-000000-0000/run.json\n" in text, text
    rows = [line.split() for line in text.splitlines()]
    assert ["n2", "8.00", "1"] in rows, text
    assert ["mnist", "10.50", "2", "1", "running"] in rows, text
    assert ["ddp", "0.00", "1", "1", "GPU", "count", "unknown"] in rows, text


def test_the_command_s_json_has_the_same_numbers(lab: float) -> None:
    r = CliRunner().invoke(app, ["usage", "--since", "1d", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["v"] == 1 and got["until"] - got["since"] == DAY
    assert (got["total"]["gpu_hours"], got["total"]["runs"], got["total"]["running"],
            got["total"]["unknown_gpus"]) == (pytest.approx(17.5, abs=0.01), 8, 2, 1)
    assert got["by_host"][0] == {"host": "n2", "gpu_hours": pytest.approx(8.0), "runs": 1,
                                 "running": 0, "unknown_gpus": 0, "unknown_node_hours": 0.0}
    assert {j["job"]: j["runs"] for j in got["by_job"]} == {
        "mnist": 2, "ddp": 1, "old": 1, "big": 1, "tune": 3}
    assert got["not_counted"] == ["ddp-20261126-090000-9999"]
    assert len(got["damaged"]) == 1


def test_nothing_recorded_and_a_bad_window(tmp_path: Path, fleet_cli: object) -> None:
    from tests.conftest import InProcessCLI

    assert isinstance(fleet_cli, InProcessCLI)
    r = fleet_cli("usage")
    assert r.returncode == 0 and "no run recorded here ran in that window" in r.stdout, r
    bad = fleet_cli("usage", "--since", "30")
    assert bad.returncode == 2 and "--since '30': a duration" in bad.stderr, bad


def test_a_run_with_a_damaged_end_is_named_and_skipped_whole(lab: float) -> None:
    broken = state_dir() / "mnist-20261126-100000-aaaa"
    (broken / outcomes.FILE).write_text("{")
    u = usage.usage(DAY, lab)
    assert str(broken) in u.damaged and "damaged" in u.damaged[str(broken)], u.damaged
    assert "mnist-20261126-100000-aaaa" not in u.total.runs
    assert round(u.total.gpu_hours, 3) == 17.5 - 10.0


@pytest.mark.parametrize("value, count", [
    ("0,1", 2), ("3", 1), (" 0, 2 ,5", 3), ("GPU-8f2e1c7a-1b2c-4d5e-9f00-0123456789ab", 1),
    ("MIG-GPU-8f2e1c7a/1/0,MIG-GPU-8f2e1c7a/2/0", 2),
    ("", None), ("-1", None), ("0,,1", None), ("0,0", None), ("all", None), (None, None),
    (3, None), ("0;rm -rf /", None)])
def test_a_visible_devices_list_is_counted_only_where_plain(value: object,
                                                            count: int | None) -> None:
    assert usage.visible_count(value) == count


def test_gpus_the_manifest_made_visible_count_where_the_inventory_chose_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's own CUDA_VISIBLE_DEVICES, as the run's manifest keeps each node's env: counted;
    a node whose env names none stays unknown, as does a run without a manifest."""
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    now = time.time()
    rec = record("env-20261126-100000-aaaa", now - 2 * H, [node("a", None), node("b", None)],
                 {"a": now - H, "b": now - H}, kept=now - H)
    (rec.dir / "manifest.json").write_text(json.dumps({"nodes": {
        "a": {"env": {"CUDA_VISIBLE_DEVICES": "4,5,6"}}, "b": {"env": {}}}}))
    record("bare-20261126-100000-bbbb", now - 2 * H, [node("a", None)], {"a": now - H},
           kept=now - H)
    u = usage.usage(DAY, now)
    assert by(u.hosts) == {"a": (3.0, 2), "b": (0.0, 1)}
    assert u.total.unknown == {"env-20261126-100000-aaaa", "bare-20261126-100000-bbbb"}
    assert round(u.total.unknown_node_hours, 3) == 2.0
