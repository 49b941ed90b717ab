"""Sets of indices (GPUs, ranks) written as people write them: [0, 1, 2, 5] as "0-2, 5"."""

from __future__ import annotations


def ranges(values: list[int]) -> str:
    """Sorted integers as runs: [0, 1, 2, 5] -> "0-2, 5"."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
