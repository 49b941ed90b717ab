"""The backends a run can have, behind one seam (fleet.backends.base): SSH hosts and Slurm.
Which one answers is the inventory's word (a `[slurm]` table) or the run record's, looked up in
a registry keyed by BackendKind. The CLI imports this package alone: the seam's types it needs
are here too, and never a backend's own module."""

from __future__ import annotations

import importlib
from pathlib import Path

from fleet.backends.answers import NodeLook, Preview, RankLooks, Seen
from fleet.backends.base import (
    ROLES,
    Backend,
    GpuSurvey,
    LabTools,
    Launch,
    Options,
    Recorded,
)
from fleet.backends.checks import Check, Status, differ
from fleet.backends.checks import summary as check_summary
from fleet.backends.checks import view as check_view
from fleet.backends.queueing import Queue, Queued
from fleet.config.inventory import BackendKind, backend_kind
from fleet.run.record import RunRecord

__all__ = ["BACKENDS", "ROLES", "Backend", "BackendKind", "Check", "GpuSurvey", "LabTools",
           "Launch", "NodeLook", "Options", "Preview", "Queue", "Queued", "RankLooks", "Recorded",
           "Seen", "Status",
           "check_summary", "check_view", "differ", "for_inventory", "for_record", "named"]

# Each backend by kind: its module and class, loaded when a run needs it.
BACKENDS: dict[BackendKind, tuple[str, str]] = {
    BackendKind.HOSTS: ("fleet.backends.hosts.backend", "HostsBackend"),
    BackendKind.SLURM: ("fleet.backends.slurm.backend", "SlurmBackend")}


def named(kind: BackendKind) -> Backend:
    module, cls = BACKENDS[kind]
    backend: type[Backend] = getattr(importlib.import_module(module), cls)
    return backend()


def for_inventory(path: Path) -> Backend:
    """The backend an inventory file describes."""
    return named(backend_kind(path))


def for_record(rec: RunRecord) -> Backend:
    """The backend that ran a recorded run (its record names a kind fleet knows: see
    fleet.run.record.parse_record)."""
    return named(rec.backend)
