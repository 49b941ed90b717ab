"""The backends a run can have, behind one seam (fleet.backends.base): SSH hosts and Slurm.
Which one answers is the inventory's word (a `[slurm]` table) or the run record's."""

from __future__ import annotations

import importlib
from pathlib import Path

from fleet.backends.base import Backend
from fleet.backends.slurm.cluster import is_cluster
from fleet.errors import DamagedRecord
from fleet.run.record import RunRecord

# Each backend by name: its module and class, loaded when a run needs it.
BACKENDS = {"hosts": ("fleet.backends.hosts.backend", "HostsBackend"),
            "slurm": ("fleet.backends.slurm.backend", "SlurmBackend")}


def named(name: str) -> Backend:
    module, cls = BACKENDS[name]
    backend: type[Backend] = getattr(importlib.import_module(module), cls)
    return backend()


def for_inventory(path: Path) -> Backend:
    """The backend an inventory file describes."""
    return named("slurm" if is_cluster(path) else "hosts")


def for_record(rec: RunRecord) -> Backend:
    """The backend that ran a recorded run."""
    if rec.backend not in BACKENDS:
        raise DamagedRecord(f"{rec.dir / 'run.json'}: run {rec.run_id} names a backend fleet "
                            f"does not know ({rec.backend!r})")
    return named(rec.backend)
