"""The backends a run can have, behind one seam (fleet.backends.base): SSH hosts and Slurm.
Which one answers is the inventory's word (a `[slurm]` table) or the run record's."""

from __future__ import annotations

from pathlib import Path

from fleet.backends.base import Backend
from fleet.backends.hosts.backend import HostsBackend
from fleet.backends.slurm.backend import SlurmBackend
from fleet.backends.slurm.cluster import is_cluster
from fleet.run.record import RunRecord

BACKENDS: dict[str, type[Backend]] = {"hosts": HostsBackend, "slurm": SlurmBackend}


def for_inventory(path: Path) -> Backend:
    """The backend an inventory file describes."""
    return SlurmBackend() if is_cluster(path) else HostsBackend()


def for_record(rec: RunRecord) -> Backend:
    """The backend that ran a recorded run."""
    return BACKENDS[rec.backend]()
