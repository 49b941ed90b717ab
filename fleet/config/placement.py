"""Where a job runs within its inventory: `nodes` (how many of its hosts) and `gpus_per_node`
(how many GPUs on each). Left out, a job runs on every host of the inventory and every GPU it
chooses there (the inventory's `gpus`, else all); given, fleet picks the hosts and GPUs that
are free (no process on them, no lease of another user) when the run starts, and a queued
run (`fleet submit`, `fleet sweep`) is placed by the same rule."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.config.schema import Table

MOST_GPUS = 64  # a node's GPUs a job may ask for


@dataclass(frozen=True)
class Placement:
    nodes: int | None = None  # None: every host of the inventory
    gpus_per_node: int | None = None  # None: every GPU the inventory chooses on each host

    @property
    def partial(self) -> bool:
        """The job takes part of the lab (some hosts, or some GPUs of each)."""
        return self.nodes is not None or self.gpus_per_node is not None


def take_placement(root: Table) -> Placement:
    """The job's `nodes` and `gpus_per_node`, each a positive whole number where given."""
    nodes = _count(root, "nodes", 4096)
    gpus = _count(root, "gpus_per_node", MOST_GPUS)
    return Placement(nodes=nodes, gpus_per_node=gpus)


def _count(root: Table, key: str, most: int) -> int | None:
    if not root.has(key):
        return None
    value = root.take(key, int)
    if isinstance(value, bool) or not 1 <= value <= most:
        raise root.error(key, f"must be a whole number from 1 to {most}, not {value!r}")
    return value
