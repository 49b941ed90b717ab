"""How a node reaches the master: the fact the probe finds (fleet.facts.probe) and the plan
uses (fleet.plan)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeNet:
    """How one node reaches the master, as detected on the node (or pinned in the inventory)."""

    interface: str | None = None
    address: str | None = None  # this node's own IP (v4 or v6) on that interface
    reason: str = "not detected"
