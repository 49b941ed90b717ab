"""The states a node's part of a run and a whole run can be in, as types (not strings compared
in several modules), with what follows from each: terminal or not, the exit code it means."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class NodeStatus(Enum):
    STARTING = "starting"  # run.sh started, its pid not yet recorded
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # ended non-zero by itself
    STOPPED = "stopped"  # ended because something stopped it (see NodeState.stopped_by)
    MISSING = "missing"  # no run directory there
    UNREACHABLE = "unreachable"  # fleet could not ask: it may still be running

    @property
    def is_terminal(self) -> bool:
        return self in (NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.STOPPED,
                        NodeStatus.MISSING)


class RunStatus(Enum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    UNKNOWN = "unknown"  # some node could not be asked, and none is known to have failed
    NEVER_STARTED = "never started"  # its `fleet up` ended before it started any node

    @property
    def is_terminal(self) -> bool:
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.STOPPED,
                        RunStatus.NEVER_STARTED)

    @property
    def exit_code(self) -> int:
        """What `fleet status` (and an attached `fleet up`) exits with for a run in this state."""
        return {RunStatus.FAILED: 1, RunStatus.NEVER_STARTED: 1, RunStatus.UNKNOWN: 3,
                RunStatus.STOPPED: 4}.get(self, 0)


def overall(nodes: Iterable[NodeStatus]) -> RunStatus:
    """The run's state from its nodes': a failure wins, then what cannot be known, then what is
    still going on, then a stop; only every node succeeding is success."""
    seen = set(nodes)
    if NodeStatus.FAILED in seen:
        return RunStatus.FAILED
    if seen & {NodeStatus.UNREACHABLE, NodeStatus.MISSING} or not seen:
        return RunStatus.UNKNOWN
    if NodeStatus.RUNNING in seen:
        return RunStatus.RUNNING
    if NodeStatus.STARTING in seen:
        return RunStatus.STARTING
    if NodeStatus.STOPPED in seen:
        return RunStatus.STOPPED
    return RunStatus.SUCCEEDED
