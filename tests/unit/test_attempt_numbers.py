"""Each attempt keeps its own number where an earlier one never started (no record of it):
`fleet logs --attempt N` is the attempt N that ran, not the Nth record found."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fleet.config.inventory import Host
from fleet.lifecycle import attempts
from fleet.run import record as state


def write(run_id: str, parent: str = "") -> state.RunRecord:
    rec = state.RunRecord(run_id, "job.toml", 100.0, (state.NodeRecord(
        Host("node1", "10.0.0.1"), 0, f"/h/fleet/runs/{run_id}/node1", 0, 1),),
        secret="s" * 32, parent=parent)
    rec.dir.mkdir(parents=True)
    state.write_atomic(rec.dir / "run.json", json.dumps(dataclasses.asdict(rec)))
    return rec


def test_an_attempt_that_never_started_leaves_the_later_ones_their_numbers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    run = write("r1")
    write("r1-a3", "r1")  # attempt 2 failed before anything started: no record
    write("r1-a10", "r1")
    (run.dir.parent / "r1-ax").mkdir()  # not an attempt's
    found = attempts.numbered(run)
    assert {n: r.run_id for n, r in found.items()} == {1: "r1", 3: "r1-a3", 10: "r1-a10"}
    assert list(found) == [1, 3, 10]
    assert [r.run_id for r in attempts.records(run)] == ["r1", "r1-a3", "r1-a10"]
