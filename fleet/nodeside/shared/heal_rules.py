"""How a detached run heals without the laptop, pure: the next attempt fleet prepared before it
was needed (`Heal`, in each watcher's config), the master's watcher's choice to start it in
place of a fail-fast stop (`choose`), and the file on the master that says it was
(`healed.json`: written by the master's watcher, read back by the laptop's `status` as
untrusted input, `parse_healed`). Only a lost node other than the master is healed: with the
master gone, nobody is left to decide, and the run fails fast."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

HEALED = "healed.json"  # in the master's run directory of the attempt that was healed
MAX_HEALED = 2048  # bytes of healed.json the laptop reads
MAX_SAID = 300  # characters of its reason
MAX_ATTEMPT = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")


@dataclass(frozen=True)
class Heal:
    """The next attempt, prepared on every node that may take part in it (the spares too):
    its number and run id, this node's script that starts its part (given the lost node's
    name: the spare takes its rank), and the standby spares, in the order they are taken."""

    attempt: int
    run: str
    script: str
    spares: tuple[str, ...]

    def as_obj(self) -> dict[str, object]:
        return {"attempt": self.attempt, "run": self.run, "script": self.script,
                "spares": list(self.spares)}


def parse_heal(got: object) -> Heal:
    """A config's `heal`, checked (ValueError naming what is wrong)."""
    if not isinstance(got, dict) or set(got) != {"attempt", "run", "script", "spares"}:
        raise ValueError("heal: not the next attempt's fields")
    attempt, run, script, spares = got["attempt"], got["run"], got["script"], got["spares"]
    if type(attempt) is not int or not 2 <= attempt <= MAX_ATTEMPT:
        raise ValueError("heal.attempt: not an attempt's number")
    if not isinstance(run, str) or not isinstance(script, str) or not script:
        raise ValueError("heal.run, heal.script: not strings")
    if not isinstance(spares, list) or not spares or not all(
            isinstance(s, str) and _NAME.match(s) for s in spares):
        raise ValueError("heal.spares: not a list of names")
    return Heal(attempt, run, script, tuple(spares))


@dataclass(frozen=True)
class Healing:
    """What the master's watcher did instead of stopping the run: `lost` gave way to `spare`
    in attempt `attempt` (run id `run`), at `at` (time.time()), and why."""

    attempt: int
    run: str
    lost: str
    spare: str
    why: str
    at: float


def choose(master: str, culprit: str, lost: bool, heal: Heal | None,
           standby: dict[str, float | None], now: float, after: float,
           at: float) -> Healing | None:
    """The master's choice when a node is to be stopped for: heal, where a next attempt was
    prepared, the node was lost (not failed) and is not the master, and a standby spare was
    heard of within `after` (the first such in the heal's order); None (fail fast) else."""
    if heal is None or not lost or not culprit or culprit == master:
        return None
    heard = [s for s in heal.spares if (seen := standby.get(s)) is not None
             and now - seen <= after]
    if not heard:
        return None
    spare = heard[0]
    why = (f"healed: {culprit} unreachable; attempt {heal.attempt} started with {spare} in its "
           "place (seen by the nodes' watchers)")
    return Healing(heal.attempt, heal.run, culprit, spare, why, at)


def unhealed(why: str, culprit: str, lost: bool, master: str, heal: Heal | None) -> str:
    """A fail-fast stop's reason where a next attempt was prepared and a node lost: why it was
    not healed (the reason as it was otherwise)."""
    if heal is None or not lost:
        return why
    return why + ("; not healed: the master was lost" if culprit == master
                  else "; not healed: no standby spare answered")


def dumps_healed(h: Healing) -> str:
    return json.dumps({"attempt": h.attempt, "run": h.run, "lost": h.lost, "spare": h.spare,
                       "why": h.why[:MAX_SAID], "at": h.at}, sort_keys=True) + "\n"


def parse_healed(text: str, run_id: str, nodes: tuple[str, ...],
                 spares: tuple[str, ...]) -> Healing:
    """healed.json as the master wrote it, checked as the node's word: its size, exactly its
    fields, the attempt that follows the run (`<run id>-a<N>`), a lost node of the run other
    than its master, a spare of the run's, printable words, a finite time. ValueError
    otherwise."""
    if len(text) > MAX_HEALED:
        raise ValueError("too long")
    try:
        got = json.loads(text)
    except ValueError as e:
        raise ValueError("not JSON") from e
    if not isinstance(got, dict) or set(got) != {"attempt", "run", "lost", "spare", "why", "at"}:
        raise ValueError("not a healing's fields")
    attempt, run, lost, spare = got["attempt"], got["run"], got["lost"], got["spare"]
    why, at = got["why"], got["at"]
    if type(attempt) is not int or not 2 <= attempt <= MAX_ATTEMPT or \
            run != f"{run_id}-a{attempt}":
        raise ValueError("not an attempt of this run")
    if lost not in nodes[1:]:
        raise ValueError("the node lost is none of the run's but its master")
    if spare not in spares:
        raise ValueError("the spare is none of the run's")
    if not isinstance(why, str) or len(why) > MAX_SAID or not all(c.isprintable() for c in why):
        raise ValueError("no reason")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
        raise ValueError("no time")
    return Healing(attempt, run, lost, spare, why, float(at))
