"""`[watchdog]` in a job: what `fleet up` watches while the run goes on (a hang, a lost node,
the straggler) and the ranks' sampling that the straggler watch reads; every mistake named by
its key."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from fleet.config.restart import Restart
from fleet.config.schema import Table

HEARTBEAT_S = 2.0  # how often `fleet up` asks every running node to answer
MIN_UNREACHABLE_AFTER = 2 * HEARTBEAT_S  # a limit shorter would give a node one question
STRAGGLER_MAX = 10.0  # a factor above this names no rank a person would call slow first


class StragglerAction(StrEnum):
    """`[watchdog] straggler_action`: what `fleet up` does once the watch names a rank."""

    WARN = "warn"  # a warning line and an event; the run goes on
    REPLACE = "replace"  # the attempt is stopped; the next one has a spare in its host's place


@dataclass(frozen=True)
class Watchdog:
    hang_timeout: float | None = None  # seconds without a log line from any node: a hang
    nccl_flight_recorder: bool = False  # PyTorch's NCCL flight recorder, dumped with the stacks
    # Seconds a node may answer neither on its connection nor to a fresh one before it counts
    # as lost (fleet asks every HEARTBEAT_S); also how long a stop is retried on fresh ones.
    unreachable_after: float = 10.0
    # The straggler watch: a rank computing this many times as long per step as the others
    # (fleet.run.straggler) is named; None: not watched.
    straggler: float | None = None
    straggler_action: StragglerAction = StragglerAction.WARN
    sampling: bool = True  # every rank samples its stack (false: FLEET_SAMPLING=0)


def take_watchdog(t: Table) -> Watchdog:
    """The job's `[watchdog]` table (the defaults where it has none)."""
    hang = t.take("hang_timeout", float, None)
    if hang is not None and hang <= 0:
        raise t.error("hang_timeout", "must be a positive number of seconds (leave it out to "
                                      "never stop a run for silence)")
    recorder = t.take("nccl_flight_recorder", bool, False)
    unreachable = float(t.take("unreachable_after", float, 10.0))
    if not MIN_UNREACHABLE_AFTER <= unreachable < math.inf:
        raise t.error("unreachable_after", f"must be a number of seconds, at least "
                                           f"{MIN_UNREACHABLE_AFTER:g} (fleet asks every node "
                                           f"every {HEARTBEAT_S:g}s), not {unreachable:g}")
    straggler = t.take("straggler", float, None)
    if straggler is not None and not 1.0 < straggler <= STRAGGLER_MAX:
        raise t.error("straggler", f"must be a factor above 1 and at most {STRAGGLER_MAX:g} "
                                   "(1.3: a rank computing 1.3 times as long per step as the "
                                   f"others), not {straggler:g}")
    word = t.take("straggler_action", str, StragglerAction.WARN.value)
    if word not in {a.value for a in StragglerAction}:
        names = ", ".join(f'"{a.value}"' for a in StragglerAction)
        raise t.error("straggler_action", f"must be one of {names}, not {word!r}")
    if t.has("straggler_action") and straggler is None:
        raise t.error("straggler_action", "only used with straggler (the factor that names a "
                                          "rank)")
    sampling = t.take("sampling", bool, True)
    if not sampling and straggler is not None:
        raise t.error("sampling", "false turns off the ranks' sampling that straggler is "
                                  "judged from: leave one of them out")
    t.done()
    return Watchdog(float(hang) if hang is not None else None, recorder, unreachable,
                    float(straggler) if straggler is not None else None,
                    StragglerAction(word), sampling)


def check_action(t: Table, watchdog: Watchdog, restart: Restart) -> None:
    """`straggler_action = "replace"` restarts the run with a spare: it needs `[restart]`."""
    if watchdog.straggler_action is StragglerAction.REPLACE and not restart.max:
        raise t.error("straggler_action", '"replace" stops the attempt and starts the next one '
                                          "with a spare: it needs [restart] with max above 0 "
                                          '(and a spare in the inventory), or "warn"')
