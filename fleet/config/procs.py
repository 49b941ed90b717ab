"""A node's process count (`nproc_per_node`, in a job, an inventory host or a Slurm cluster):
a positive number, or one of torchrun's words for "as many as this node has"."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeAlias

from fleet.config.schema import Table


class Procs(StrEnum):
    """torchrun's words for a count it finds on the node itself. A StrEnum: its word is what
    torchrun's command line, the manifest and the run records have always said."""

    GPU = "gpu"  # one process per visible GPU
    CPU = "cpu"  # one per CPU
    AUTO = "auto"  # per GPU where there are any, else per CPU


Nproc: TypeAlias = int | Procs


def parse_nproc(value: object, key: str = "") -> Nproc:
    """The count a file or record says (a positive integer or one of Procs' words);
    ValueError, saying what is wrong with it (`key` first, where given), where it is neither."""
    if isinstance(value, str):
        try:
            return Procs(value)
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        if value >= 1:
            return value
        raise ValueError(f"{key} must be at least 1, not {value}".lstrip())
    words = ", ".join(p.value for p in Procs)
    raise ValueError(f"{key} must be a positive integer or one of {words}, not {value!r}"
                     .lstrip())


def nproc_value(t: Table, key: str) -> Nproc:
    """The table's count at `key`; a ConfigError naming the file and key where it is none."""
    value: str | int = t.take(key, str) if isinstance(t.data[key], str) else t.take(key, int)
    try:
        return parse_nproc(value)
    except ValueError as e:
        raise t.error(key, str(e)) from None
