"""`[restart]` in a job: whole restarts of a run that ended badly (a rank failed, a hang, a lost
node), each attempt from the job's own checkpoint, with a growing wait between them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fleet.config.schema import Table


class Ending(StrEnum):
    """How an attempt ended, as `[restart] on` names the endings that start another one."""

    FAIL = "fail"  # a rank failed
    HANG = "hang"  # the watchdog found no output for hang_timeout
    LOST = "lost"  # a node stopped answering


class Tracker(StrEnum):
    """`[restart] tracker`: the experiment tracker whose one run every attempt writes to."""

    WANDB = "wandb"  # WANDB_RUN_ID (from the run's id) and WANDB_RESUME=allow
    MLFLOW = "mlflow"  # MLFLOW_RUN_ID of a run fleet creates before the first attempt


class Replace(StrEnum):
    """`[restart] replace`: which endings make a node give way to a spare at once."""

    LOST = "lost"  # a lost node at once; a failed one is retried in place first, then replaced
    FAIL = "fail"  # a failed node too, at once


BACKOFF_MAX_S = 300.0  # the wait before an attempt grows up to this


@dataclass(frozen=True)
class Restart:
    """`[restart]`: whole restarts of a run that ended badly, each from the job's checkpoint."""

    max: int = 0  # attempts after the first
    on: tuple[Ending, ...] = (Ending.FAIL, Ending.HANG, Ending.LOST)
    backoff: float = 10.0  # seconds before the second attempt, doubled for each one after
    tracker: Tracker | None = None  # every attempt writes to one run of this tracker
    checkpoints: str = ""  # the job's checkpoint directory, relative to its directory on a node
    replace: Replace = Replace.LOST  # when a node gives way to a spare

    def wait(self, attempt: int) -> float:
        """The wait before attempt number `attempt` (2 for the first restart)."""
        return float(min(self.backoff * 2.0 ** max(attempt - 2, 0), BACKOFF_MAX_S))


def take_restart(t: Table, hang_timeout: float | None) -> Restart:
    """The job's `[restart]` table, every mistake named by its key."""
    count = t.take("max", int, 0)
    named = t.has("on")
    if not 0 <= count <= 100:
        raise t.error("max", f"must be a number of restarts from 0 to 100, not {count}")
    words = t.take_str_list("on", [e.value for e in Ending])
    on = []
    for i, word in enumerate(words):
        try:
            on.append(Ending(word))
        except ValueError:
            names = ", ".join(f'"{e.value}"' for e in Ending)
            raise t.error(f"on[{i}]", f"must be one of {names}, not {word!r}") from None
    if named and Ending.HANG in on and hang_timeout is None:
        raise t.error("on", '"hang" needs [watchdog] hang_timeout (without it no run is ever '
                            "found hung)")
    backoff = float(t.take("backoff", float, 10.0))
    if not 0 <= backoff <= BACKOFF_MAX_S:
        raise t.error("backoff", f"must be a number of seconds from 0 to {BACKOFF_MAX_S:g}, "
                                 f"not {backoff:g}")
    replace = t.take("replace", str, Replace.LOST.value)
    if replace not in {r.value for r in Replace}:
        names = ", ".join(f'"{r.value}"' for r in Replace)
        raise t.error("replace", f"must be one of {names}, not {replace!r}")
    tracker = _tracker(t)
    checkpoints = take_checkpoints(t)
    t.done()
    return Restart(count, tuple(dict.fromkeys(on)), backoff, tracker=tracker,
                   checkpoints=checkpoints, replace=Replace(replace))


def _tracker(t: Table) -> Tracker | None:
    word = t.take("tracker", str, None)
    if word is None:
        return None
    try:
        return Tracker(word)
    except ValueError:
        names = ", ".join(f'"{e.value}"' for e in Tracker)
        raise t.error("tracker", f"must be one of {names}, not {word!r}") from None


def take_checkpoints(t: Table) -> str:
    """`checkpoints`: a directory inside the job's own on each node (what fleet replicates
    between the nodes names files there and nowhere else), as "ckpt" ("" where not set)."""
    path = t.take("checkpoints", str, "")
    if not t.has("checkpoints"):
        return ""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith(("/", "~")) or ".." in parts or not parts:
        raise t.error("checkpoints", "must be a directory inside the job's directory, relative "
                                     f'to it (like "ckpt/"), not {path!r}')
    return "/".join(parts)
