"""`fleet ps`: a header row, columns that stay in line whatever a state says, and words where
there is nothing to list (no run recorded; no run alive on an inventory's hosts)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from fleet.cli import listing
from fleet.config.inventory import Host
from fleet.console import Console
from fleet.run import record as state
from tests.conftest import InProcessCLI

LONG = "unreachable (may still be running)"


def record(run_id: str, started: float) -> state.RunRecord:
    return state.RunRecord(run_id, "job.toml", started, (state.NodeRecord(
        Host("node1", "192.0.2.1"), 0, f"/r/{run_id}/node1", 0, 1),))


def plain(headers: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    import io

    return Console(out=io.StringIO(), err=io.StringIO(), color=False).table(headers, rows) \
        .splitlines()


def test_runs_have_a_header_and_their_columns_stay_in_line_under_a_long_state() -> None:
    runs = [record("mnist-20260101-120000-49b0", 1.0e9), record("r2", 1.0e9 + 60)]
    rows = listing.run_rows(runs, {runs[0].run_id: LONG, "r2": "running"},
                            {runs[0].run_id: ["node1", "node2"], "r2": ["node3"]})
    lines = plain(listing.RUNS, rows)
    assert lines[0].split() == ["RUN", "STATE", "STARTED", "NODES"]
    assert LONG in lines[1] and "running" in lines[2]
    # every column starts where its header does, on every row
    for header in ("STATE", "STARTED", "NODES"):
        at = lines[0].index(header)
        assert all(line[at - 2:at] == "  " and line[at] != " " for line in lines[1:]), lines
    assert lines[1].endswith("node1,node2") and lines[2].endswith("node3")


def test_alive_rows_name_the_run_the_host_and_the_node() -> None:
    rows = listing.alive_rows({"node1": ["r1/node1", "r2/gpu-a"], "node2": []})
    assert rows == [["r1", "running", "node1", "node1"], ["r2", "running", "node1", "gpu-a"]]
    assert plain(listing.ALIVE, rows)[0].split() == ["RUN", "STATE", "HOST", "AS", "NODE"]


@pytest.mark.parametrize("answered, unreachable, words", [
    (3, 0, "no run is running on any of the 3 hosts of lab.toml"),
    (1, 0, "no run is running on the one host of lab.toml"),
    (2, 1, "no run is running on the 2 hosts of lab.toml that answered (1 unreachable)"),
    (0, 2, "no host of lab.toml answered: nothing is known to run"),
])
def test_nothing_alive_is_said_in_words(answered: int, unreachable: int, words: str) -> None:
    assert listing.nothing_alive(Path("lab.toml"), answered, unreachable) == words


def test_ps_with_no_run_recorded_says_so(tmp_path: Path) -> None:
    r = InProcessCLI(tmp_path)("ps")
    assert (r.returncode, r.stdout, r.stderr) == (0, listing.NO_RUN + "\n", "")


def test_ps_lists_finished_runs_under_a_header(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / ".fleet"))
    rec = record("r1", time.time())
    rec.dir.mkdir(parents=True)
    state.write_atomic(rec.dir / "run.json", json.dumps(dataclasses.asdict(rec)) + "\n")
    monkeypatch.setattr("fleet.lifecycle.answers.ps_word", lambda r: LONG)  # no host asked
    r = InProcessCLI(tmp_path)("ps")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0].split() == list(listing.RUNS), r
    assert lines[1].startswith("r1  ") and f"  {LONG}  " in lines[1], r
