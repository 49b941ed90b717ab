"""What fleet saw of each node, kept in the run's local record: an end seen stands whatever
comes after it; a loss does not; the file is read strictly (fleet.run.outcomes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import DamagedRecord
from fleet.run import outcomes
from fleet.states import NodeOutcome
from fleet.states import NodeStatus as S


def test_an_end_seen_stands_whatever_the_node_says_later(tmp_path: Path) -> None:
    failed = NodeOutcome("n1", 0, S.FAILED, 1, elapsed=12)
    assert outcomes.note(tmp_path, failed, "fleet up") == failed
    forged = NodeOutcome("n1", 0, S.SUCCEEDED, 0)
    assert outcomes.note(tmp_path, forged, "fleet status") == failed  # the record's word
    kept = outcomes.seen(tmp_path)["n1"]
    assert (kept.outcome, kept.by, kept.final) == (failed, "fleet up", True)
    assert outcomes.ended(tmp_path) == {"n1": failed}


def test_a_loss_is_no_end_its_later_word_is(tmp_path: Path) -> None:
    lost = NodeOutcome("n2", 1, S.UNREACHABLE, None, "no answer for 10s")
    outcomes.note(tmp_path, lost, "fleet up")
    assert outcomes.ended(tmp_path) == {}  # asked of the node again
    assert outcomes.seen(tmp_path)["n2"].outcome == lost  # and when it was lost, kept
    stopped = NodeOutcome("n2", 1, S.STOPPED, 143, "fleet stop")
    assert outcomes.note(tmp_path, stopped, "fleet stop") == stopped
    assert outcomes.ended(tmp_path) == {"n2": stopped}


def test_nothing_is_kept_for_a_run_whose_record_is_gone(tmp_path: Path) -> None:
    o = NodeOutcome("n1", 0, S.SUCCEEDED, 0)
    assert outcomes.note(tmp_path / "gone", o, "fleet up") == o
    assert not (tmp_path / "gone").exists()
    assert outcomes.seen(tmp_path / "gone") == {}


def test_the_record_round_trips(tmp_path: Path) -> None:
    o = NodeOutcome("n1", 0, S.FAILED, None, "fail-fast: n2 failed", "its process 7 had "
                    "exited 1", 30)
    outcomes.note(tmp_path, o, "fleet up")
    assert outcomes.parse((tmp_path / outcomes.FILE).read_text())["n1"].outcome == o


@pytest.mark.parametrize("text", [
    "[]", "{", '{"n1": {"status": "fine", "node_rank": 0, "code": 0, "at": 1}}',
    '{"n1": {"status": "failed", "node_rank": 0, "code": "1", "at": 1}}',
    '{"n1": {"status": "failed", "node_rank": 0, "code": true, "at": 1}}',
    '{"n1": {"status": "failed", "node_rank": 0, "code": 1}}',
    '{"n1": {"status": "failed", "node_rank": "0", "code": 1, "at": 1}}',
])
def test_a_damaged_record_is_named(tmp_path: Path, text: str) -> None:
    (tmp_path / outcomes.FILE).write_text(text)
    with pytest.raises(DamagedRecord, match=outcomes.FILE):
        outcomes.seen(tmp_path)
