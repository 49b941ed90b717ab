"""What the seam answers with, as data (the CLI says it in words): a recorded run's state as its
backend sees it, a plan's preview; and each verb as the person who asked it calls it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fleet.facts.gpus import GpuFacts
from fleet.facts.ranktop import NodeTop
from fleet.states import NodeOutcome, RunStatus


@dataclass(frozen=True)
class Seen:
    """`fleet ps`: a recorded run's state; why it is unknown, where it is and that is known;
    and who says it, where not fleet's own record and nodes (Slurm's queue: "slurm")."""

    status: RunStatus
    why: str = ""
    by: str = ""


@dataclass(frozen=True)
class NodeLook:
    """What a node's ranks did lately (fleet.facts.ranktop), and its GPUs where asked."""

    top: NodeTop
    gpus: GpuFacts | None = None


class RankLooks(Protocol):
    """`fleet top`: a recorded run's ranks, looked at again at each call, its connections kept
    open until closed."""

    def look(self, with_gpus: bool = False) -> tuple[dict[str, NodeOutcome | Exception],
                                                     dict[str, NodeLook | Exception]]:
        """(per node its state, as `fleet status` says it; per node its ranks' look)."""

    def close(self) -> None: ...


# What each verb is to the person who asked it: an Unsupported names it so.
VERBS = {"prepare": "fleet up", "checks": "fleet check", "preview": "fleet plan", "collective":
         "fleet check --collective", "export": "fleet export", "describe": "fleet status",
         "state": "fleet ps", "cancel": "fleet stop", "logs": "fleet logs", "dump":
         "fleet dump", "delete": "fleet rm", "tunnel": "fleet forward", "manifest": "fleet show",
         "pull": "fleet pull", "stop_part": "stopping one node's part of a run", "parts_left":
         "asking one node's part of a run", "survey": "fleet gpus", "lease":
         "fleet reserve and release", "execute": "fleet exec", "trust_inventory": "fleet trust",
         "pin_keys": "fleet trust --to inventory", "replicas": "[restart] checkpoints",
         "doctor": "fleet doctor", "top": "fleet top",
         "queue": "queued runs (fleet submit, fleet sweep, fleet queue)"}


class Preview(Protocol):
    """`fleet plan`: what `up` would run, as data and as the lines that show it."""

    def lines(self) -> list[str]: ...  # as `fleet plan` prints it

    def as_json(self) -> dict[str, object]: ...  # as `fleet plan --json` writes it


class Replicas(Protocol):
    """`[restart] checkpoints`: the job's checkpoints copied between the nodes while an attempt
    runs, and the newest brought to every node of the next attempt before it starts."""

    def ready(self, attempt: int, replace: dict[str, str], lost: list[str]) -> None: ...

    def close(self) -> None: ...
