"""GPU leases: small records kept on each host (LEASE_DIR), written by `fleet reserve` through
fleet/nodeside/lease.py and read by every fleet user's `gpus`, `up` and `up --wait`. No server:
the host's filesystem is the only shared state, its clock the only clock.

A lease's owner is the user who owns its file (what the host's kernel says), never what the
file says: a lease in someone else's name cannot be written. Leases are cooperative: they keep
fleet runs off GPUs, they never stop a process."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any

from fleet.nodedata import number
from fleet.nodeside.shared.lease_rules import (
    LEASE_FILE,
    lease_end,
    lease_gpus,
    lease_run,
    lease_time,
)
from fleet.nodeside.shared.lease_rules import MAX_LEASE_S as MAX_LEASE_S  # fleet.cli.leases
from fleet.nodeside.shared.lease_rules import MAX_NAMES as MAX_NAMES  # fleet.facts.gpus
from fleet.nodeside.shared.lease_rules import MAX_RECORDS as MAX_RECORDS
from fleet.nodeside.shared.scrub import masked

# Per machine, not per user (everyone's fleet reads the same place) and not in a home (an NFS
# home is shared by many machines); /var/tmp survives a reboot, where /tmp may not.
LEASE_DIR = "/var/tmp/fleet-leases"
NOTE_MAX = 200
_OWNER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}\$?")
_TEXT = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True)
class Lease:
    """`gpus` None: the whole host."""

    owner: str
    gpus: tuple[int, ...] | None
    until: float  # the host's clock
    since: float = 0.0
    note: str = ""
    origin: str = ""  # where it was taken from (user@machine), as its writer said
    run: str = ""  # a run lease's run (a run id's shape, else ""): held while that run runs

    def active(self, now: float) -> bool:
        return self.until > now

    def overlaps(self, gpus: tuple[int, ...] | None) -> bool:
        """Whether this lease covers any of `gpus` (None: the whole host)."""
        return self.gpus is None or gpus is None or bool(set(self.gpus) & set(gpus))

    def what(self) -> str:
        if self.gpus is None:
            return "the whole host"
        return ("GPU " if len(self.gpus) == 1 else "GPUs ") + ",".join(map(str, self.gpus))


def parse_lease(owner: str, text: str, changed: float | None = None) -> Lease | None:
    """A lease file's JSON (a node's: anything may be in it) with the owner its file has; None
    where it is not a lease. Its end is at most MAX_LEASE_S after the file's last status change
    (`changed`: its ctime, which the kernel sets and its owner cannot, as `touch -d` sets an
    mtime): one written by hand with a far end still ends."""
    try:
        said = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(said, dict) or not _OWNER.fullmatch(owner):
        return None
    gpus, until = lease_gpus(said.get("gpus")), lease_time(said.get("until"))
    if gpus is False or until is None:
        return None
    if changed is not None:
        until = lease_end(until, changed)
    note, origin = said.get("note", ""), said.get("origin", "")
    return Lease(owner, gpus if isinstance(gpus, tuple) else None, until,
                 lease_time(said.get("since")) or 0.0,
                 masked(note)[:NOTE_MAX] if isinstance(note, str) else "",
                 masked(origin)[:100] if isinstance(origin, str) else "",
                 lease_run(said.get("run")))


def others(leases: list[Lease], me: str, gpus: tuple[int, ...] | None) -> list[Lease]:
    """The leases (active ones, given) of users other than `me` that cover any of `gpus`."""
    return [lease for lease in leases if lease.owner != me and lease.overlaps(gpus)]


class LeaseAction(Enum):
    """What lease.py is asked to do; its word is lease.py's first argument."""

    TAKE = "take"
    GIVE = "give"
    DROP = "drop"


@dataclass(frozen=True)
class LeaseOrder:
    """What fleet/nodeside/lease.py is asked: take `gpus` (None: the whole host) for `seconds`,
    give them back, or drop the caller's leases named. A take with `run` is a run lease."""

    action: LeaseAction
    gpus: tuple[int, ...] | None = None
    seconds: float = 0.0
    note: str = ""
    names: tuple[str, ...] = ()
    run: str = ""

    @classmethod
    def take(cls, gpus: tuple[int, ...] | None, seconds: float, note: str = "",
             run: str = "") -> LeaseOrder:
        return cls(LeaseAction.TAKE, gpus, seconds, note, run=run)

    @classmethod
    def give(cls, gpus: tuple[int, ...] | None) -> LeaseOrder:
        return cls(LeaseAction.GIVE, gpus)

    @classmethod
    def drop(cls, names: tuple[str, ...]) -> LeaseOrder:
        """The caller's own leases, by their files' names (undoing or finishing a take)."""
        return cls(LeaseAction.DROP, names=names)

    def argv(self, origin: str) -> list[str]:
        which = "all" if self.gpus is None else ",".join(map(str, self.gpus))
        if self.action is LeaseAction.TAKE:
            return [self.action.value, which, f"{self.seconds:.0f}", self.note, origin,
                    *([self.run] if self.run else [])]
        if self.action is LeaseAction.GIVE:
            return [self.action.value, which]
        return [self.action.value, *self.names]


@dataclass(frozen=True)
class Taken:
    """What lease.py answered: taken (the lease), or refused (the leases in the way), or an
    error of the host's lease directory."""

    ok: bool
    lease: Lease | None = None
    conflicts: tuple[Lease, ...] = ()
    released: tuple[Lease, ...] = ()  # give: the caller's leases it changed or removed
    kept: tuple[Lease, ...] = ()  # give: other users' active leases on what was given
    now: float = 0.0
    error: str = ""
    name: str = ""  # take: the new lease's file
    replaces: tuple[str, ...] = ()  # take: the caller's leases it replaces, to drop once kept


def parse_answer(out: str) -> Taken:
    """lease.py's one JSON line (after whatever a login banner printed)."""
    for line in reversed(out.splitlines()):
        if not line.startswith("{"):
            continue
        try:
            said = json.loads(line)
        except (ValueError, RecursionError):
            break
        if not isinstance(said, dict):
            break

        def leases(key: str, said: dict[str, Any] = said) -> tuple[Lease, ...]:
            items = said.get(key)
            found = (_lease(x) for x in items) if isinstance(items, list) else ()
            return tuple(x for x in found if x is not None)

        error = said.get("error")
        now = lease_time(said.get("now")) or 0.0
        mine = leases("lease")
        name, replaces = said.get("name"), said.get("replaces")
        return Taken(ok=said.get("ok") is True, lease=mine[0] if mine else None,
                     conflicts=leases("conflicts"), released=leases("released"),
                     kept=leases("kept"), now=now,
                     error=_TEXT.sub("?", error)[:400] if isinstance(error, str) else "",
                     name=name if isinstance(name, str) and LEASE_FILE.fullmatch(name) else "",
                     replaces=tuple(x for x in replaces if isinstance(x, str)
                                    and LEASE_FILE.fullmatch(x))
                     if isinstance(replaces, list) else ())
    return Taken(ok=False, error="the host's lease program gave no answer")


def _lease(item: object) -> Lease | None:
    if not isinstance(item, dict):
        return None
    owner = item.get("owner")
    return parse_lease(owner, json.dumps(item)) if isinstance(owner, str) else None


def parse_gpu_list(text: str) -> tuple[int, ...] | None:
    """`0`, `0,2`, `1-3` (what a command line says after HOST:), as sorted indices; None where it
    is not that."""
    out: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        a, b = number(lo), number(hi) if dash else number(lo)
        if a is None or b is None or b < a or b - a > 255 or b >= 1 << 16:
            return None
        out.update(range(a, b + 1))
    return tuple(sorted(out)) if out else None
