"""The debug record of round trips (FLEET_TRACE): silent unless asked, one JSON line per round
trip, and scripts named by their first telling line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.transport import trace


def test_nothing_is_written_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(trace.VAR, raising=False)
    with trace.span("node1", "run", "probe"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_each_round_trip_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "trace.jsonl"
    monkeypatch.setenv(trace.VAR, str(out))
    with trace.span("node1", "run", "probe"):
        pass
    with pytest.raises(RuntimeError), trace.span("node2", "stream", "x" * 300):
        raise RuntimeError("a failed round trip is recorded too")
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["host"], r["kind"], r["what"]) for r in recs] == [
        ("node1", "run", "probe"), ("node2", "stream", "x" * 200)]
    assert all(r["s"] >= 0 and r["t"] > 0 for r in recs)


def test_a_script_is_named_by_its_first_telling_line() -> None:
    assert trace.label("{\nset -- 'a' 'b'\n# fleet's claim on a host\nset -u\n}") == \
        "# fleet's claim on a host"
    assert trace.label("(\n\n  echo hi\n)") == "echo hi"
    assert trace.label("") == ""
