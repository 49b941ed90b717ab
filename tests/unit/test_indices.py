"""Sets of indices written as runs (fleet.indices), as GPU and rank lists are shown."""

from __future__ import annotations

from fleet.indices import ranges


def test_runs_of_consecutive_indices_are_written_as_ranges() -> None:
    assert ranges([0, 1, 2, 5]) == "0-2, 5"
    assert ranges([3]) == "3"
    assert ranges([0, 2, 4, 5, 6, 7]) == "0, 2, 4-7"
    assert ranges([]) == ""
