"""Where a job with a placement (`nodes`, `gpus_per_node`: fleet.config.placement) runs: the
first hosts of the inventory, in its order, that have enough free GPUs, and on each the first
free GPUs by index. Pure: it reads GpuFacts (fleet.facts.gpus) and what could not be asked.

A GPU is free where it exists (nvidia-smi lists it; the inventory's `gpus` names it, where it
names any), no compute process is on it (anyone's, the login's own too, and no memory held by
processes nvidia-smi does not list), no other user's lease is active on it and no run lease
(anyone's) is. --force and --ignore-leases do not widen that: a placement takes free GPUs."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet.config.inventory import Host
from fleet.config.placement import Placement
from fleet.facts.gpus import GpuFacts, owner
from fleet.facts.leases import Lease
from fleet.gpuview import IDLE_MIN_MIB, size, unlisted


@dataclass(frozen=True)
class Choice:
    """The hosts chosen, in the inventory's order, each with its GPUs (None: a host without
    GPUs, for a job that asks none), and per host not chosen why not. `needs`: in words."""

    chosen: tuple[tuple[str, tuple[int, ...] | None], ...]
    why_not: dict[str, str] = field(default_factory=dict)
    needs: str = ""
    enough: bool = True

    @property
    def gpus(self) -> dict[str, tuple[int, ...] | None]:
        return dict(self.chosen)


def needs(placement: Placement, hosts: int) -> str:
    """`1 host with 2 free GPUs` / `every host (3) with 2 free GPUs each` / `2 hosts`."""
    n = placement.nodes if placement.nodes is not None else hosts
    which = f"{n} host{'s' if n != 1 else ''}" if placement.nodes is not None else \
        f"every host ({hosts})"
    g = placement.gpus_per_node
    if g is None:
        return which + " whose GPUs are free"
    return which + f" with {g} free GPU{'s' if g != 1 else ''}" + (" each" if n != 1 else "")


def _lease_in_way(lease: Lease, me: str, index: int) -> bool:
    return (lease.owner != me or bool(lease.run)) and lease.overlaps((index,))


def taken(index: int, facts: GpuFacts) -> str:
    """Why GPU `index` of a host is not free, "" where it is."""
    why = [f"{a.used_mib} MiB in use by {owner(a)} (pid {a.pid})" for a in facts.on(index)]
    if (unseen := unlisted(facts, index)) >= IDLE_MIN_MIB:
        why.append(f"{size(unseen)} held by processes nvidia-smi does not list")
    for lease in facts.active_leases():
        if _lease_in_way(lease, facts.me, index):
            what = f"run {lease.run} of {lease.owner}" if lease.run else lease.owner
            why.append(f"leased by {what}")
    return ", ".join(why)


def free_gpus(host: Host, facts: GpuFacts | str) -> tuple[tuple[int, ...] | None, str, bool]:
    """The host's free GPUs among those the inventory lets a job use (None: it has no GPU), why
    the others are not free ("" where all are), and whether its GPUs could be counted."""
    if isinstance(facts, str):
        return (), f"not asked: {facts}", False
    if facts.unknown:
        return (), f"its leases are unknown: {facts.unknown}", False
    if not facts.smi:
        return None, "no GPUs (no nvidia-smi)", True
    if facts.error:
        return (), f"nvidia-smi failed: {facts.error}", False
    listed = sorted(g.index for g in facts.gpus)
    if not listed:
        return None, "no GPUs (nvidia-smi lists none)", True
    usable = [i for i in listed if not host.gpus or i in host.gpus]
    if not usable:
        return (), "none of the inventory's gpus exists here", False
    why = {i: taken(i, facts) for i in usable}
    busy = "; ".join(f"GPU{i}: {w}" for i, w in why.items() if w)
    return tuple(i for i in usable if not why[i]), busy, True


def choose(placement: Placement, hosts: list[Host], facts: dict[str, GpuFacts | str]) -> Choice:
    """The first hosts (inventory order) that fit: with `gpus_per_node` G, G free GPUs (the
    first G by index); without it, every GPU the job would use there free (a host without
    GPUs fits). Not enough: `enough` False, every host's word in `why_not`."""
    want = placement.nodes if placement.nodes is not None else len(hosts)
    g = placement.gpus_per_node
    chosen: list[tuple[str, tuple[int, ...] | None]] = []
    why_not: dict[str, str] = {}
    for h in hosts:
        if len(chosen) == want:
            break
        free, busy, counted = free_gpus(h, facts[h.name])
        if g is not None and free is not None and len(free) >= g:
            chosen.append((h.name, free[:g]))
        elif g is not None:
            have = f"{len(free)} free" if counted and free is not None else ""
            why_not[h.name] = ": ".join(x for x in (have, busy) if x)
        elif free is None or (counted and not busy):
            chosen.append((h.name, free))  # without GPUs (a CPU host fits), or all free
        else:
            why_not[h.name] = busy
    return Choice(tuple(chosen), why_not, needs(placement, len(hosts)), len(chosen) == want)
