"""The states a node's part of a run and a whole run can be in, as types (not strings compared
in several modules), with what follows from each: terminal or not, the exit code it means."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from fleet.errors import ExitCode


class StopCause(Enum):
    """Who stopped a run, as the first word of its stop records (`fail-fast: n2 failed`,
    `watchdog: no output for 30s (a hang)`, `fleet stop`, `fleet up, interrupted (SIGINT)`)."""

    FAIL_FAST = "fail-fast"  # a node failed or was lost: its peers are stopped
    WATCHDOG = "watchdog"  # no output for hang_timeout
    STRAGGLER = "straggler watch"  # straggler_action = "replace": a spare takes its host's place
    OTHER = ""  # a person (`fleet stop`, Ctrl-C), or fleet up ending

    def says(self, detail: str) -> str:
        """The stop record's text for this cause."""
        return f"{self.value}: {detail}"

    @classmethod
    def of(cls, stopped_by: str) -> StopCause:
        """The cause a stop record names (what a node says: anything else is OTHER)."""
        word = stopped_by.split(":", 1)[0] if ":" in stopped_by else ""
        return next((c for c in cls if c.value and c.value == word), cls.OTHER)


def by_fail_fast(stopped_by: str, node: str | None = None) -> bool:
    """Whether a stop record's cause is a fail-fast (set off by `node`, where given)."""
    if StopCause.of(stopped_by) is not StopCause.FAIL_FAST:
        return False
    return node is None or stopped_by.startswith(StopCause.FAIL_FAST.says(f"{node} "))


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
    def exit_code(self) -> ExitCode:
        """What `fleet status` (and an attached `fleet up`) exits with for a run in this state."""
        return {RunStatus.FAILED: ExitCode.FAILED, RunStatus.NEVER_STARTED: ExitCode.FAILED,
                RunStatus.UNKNOWN: ExitCode.UNREACHABLE,
                RunStatus.STOPPED: ExitCode.STOPPED}.get(self, ExitCode.OK)


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


@dataclass(frozen=True)
class NodeOutcome:
    """How one node's part of a run ended, as the run's report says it."""

    name: str
    node_rank: int
    status: NodeStatus
    code: int | None = None
    detail: str = ""  # who stopped it, or why it could not be reached
    own_failure: str = ""  # failed although stopped: how its own part had failed before
    elapsed: int | None = None  # seconds its part ran, by the node's own clock, where known

    def describe(self) -> str:
        if self.status is NodeStatus.UNREACHABLE:
            return f"is unreachable ({self.detail})"
        words: str = self.status.value
        exit_words = ""
        if self.code is not None:
            signal_part = f", signal {self.code - 128}" if self.code > 128 else ""
            exit_words = f"exit {self.code}{signal_part}"
        if self.own_failure:
            # The stop came after the failure: its exit code may be the stop's, not the cause.
            then = f"; then {exit_words}" if exit_words else ""
            return (f"{words}: {self.own_failure} before the stop ({self.detail}) reached "
                    f"it{then}")
        if exit_words:
            words += f" ({exit_words})"
        if self.status is NodeStatus.STOPPED and self.detail:
            words += f" by {self.detail}"
        elif self.status is NodeStatus.FAILED and self.detail:
            words += f": {self.detail}"  # what the node said that was no exit code
        return words
