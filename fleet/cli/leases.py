"""`fleet reserve` and `fleet release`: GPU leases kept on the hosts themselves (no server).
What they need beyond their options is loaded when they run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleet import waits
from fleet.cli.app import echo, selection
from fleet.errors import ExitCode, FleetError, UsageError, once
from fleet.timespan import parse_duration

if TYPE_CHECKING:
    from fleet.backends import Backend
    from fleet.console import Console
    from fleet.facts.leases import Lease, Taken


class LeaseRefused(FleetError):
    """Another user's lease covers what was asked for; nothing was reserved."""

    exit_code = ExitCode.BUSY


Targets = Annotated[list[str] | None, typer.Argument(
    metavar="HOST[:GPUS]...", help="A host (the whole host) or host:GPUs, e.g. node2:1 or "
                                   "node2:0-3; GPU indices are nvidia-smi's.")]
NeedInv = Annotated[Path | None, typer.Option("--inventory", "-i", metavar="INVENTORY",
                                              help="The inventory whose hosts these are.")]


def _targets(targets: list[str]) -> list[tuple[str, tuple[int, ...] | None]]:
    out = []
    for t in targets:
        from fleet.facts.leases import parse_gpu_list

        host, colon, which = t.partition(":")
        gpus = parse_gpu_list(which) if colon else None
        if not host or (colon and gpus is None):
            raise UsageError(f"{t!r}: give HOST or HOST:GPUS (node2, node2:1, node2:0,2, "
                             "node2:0-3)")
        out.append((host, gpus))
    return out


def reserve(targets: Targets = None, inventory: NeedInv = None,
            for_: Annotated[str, typer.Option(
                "--for", metavar="DURATION", help="How long: 30m, 4h, 2d (at most 7d).")] = "4h",
            note: Annotated[str, typer.Option(
                "--note", metavar="TEXT", help="Why, for your colleagues (`fleet gpus` shows "
                                               "it).")] = "",
            list_: Annotated[bool, typer.Option(
                "--list", help="List every active lease on the inventory's hosts.")] = False,
            ) -> None:
    """Lease GPUs (or a whole host) to yourself for a while.

    The lease is a small file on the host that every fleet user's `gpus`, `up` and `up --wait`
    read: `fleet up` of another user refuses these GPUs (unless --ignore-leases), and waits
    for them with --wait. It ends by itself; it never stops anyone's process. Exit code 6 when
    another user's lease is in the way (nothing is reserved then)."""
    from fleet import backends
    from fleet.console import Console, Meaning
    from fleet.facts.leases import MAX_LEASE_S, LeaseOrder
    from fleet.gpuview import clock, local_until, span

    if inventory is None:
        raise UsageError("give the hosts' inventory: fleet reserve node2:1 -i inventory/lab.toml")
    backend = backends.for_inventory(inventory)
    console = Console()
    if list_:
        if targets:
            raise UsageError("--list lists every lease: give it no HOST")
        _list(console, backend, inventory)
        return
    seconds = parse_duration(for_)
    if seconds is None or not 60 <= seconds <= MAX_LEASE_S:
        raise UsageError(f"--for {for_!r}: a duration from 1m to 7d (30m, 4h, 2d)")
    if len(note) > 200 or not note.isprintable():
        raise UsageError("--note: at most 200 printable characters")
    wanted = _targets(targets or [])
    if not wanted:
        raise UsageError("name what to reserve: fleet reserve node2:1 -i INVENTORY (or --list)")
    _check_targets(console, backend, inventory, wanted)
    taken: list[tuple[str, Taken]] = []
    refused: dict[str, str] = {}
    undone = ""
    try:
        with waits.shown_by(console.hosts_waiting):
            for host, gpus in wanted:  # in order: the first refusal ends it
                t = backend.lease(inventory, host, LeaseOrder.take(gpus, seconds, note))
                if not t.ok:
                    refused[host] = _refusal(t)
                    break
                taken.append((host, t))
    finally:
        if refused or len(taken) < len(wanted):  # one refused (or an error): none of it kept
            undone = _undo(backend, inventory, taken)
    if refused:
        raise LeaseRefused("not reserved" + undone + ":\n" + "\n".join(
            f"  {host}: {why}" for host, why in refused.items()))
    now = time.time()
    for host, t in taken:
        # Kept everywhere: the caller's leases each new one replaces go now.
        if t.replaces:
            with waits.shown_by(console.hosts_waiting):
                backend.lease(inventory, host, LeaseOrder.drop(t.replaces))
        if t.lease is not None:
            console.info(f"{host}: {t.lease.what()} reserved for you ({t.lease.owner}) until "
                         f"{clock(local_until(t.lease, t.now, now), now)} "
                         f"({span(seconds)})", Meaning.OK)


def _undo(backend: Backend, inventory: Path, taken: list[tuple[str, Taken]]) -> str:
    """Drop the leases this reserve took (by name: what the caller held before stays); the
    words for what was undone, or what could not be."""
    from fleet.facts.leases import LeaseOrder

    failed = []
    for host, t in taken:
        try:
            back = backend.lease(inventory, host, LeaseOrder.drop((t.name,)))
        except FleetError as e:
            failed.append(f"{host} ({e})")
            continue
        if not back.ok:
            failed.append(f"{host} ({back.error})")
    if failed:
        return (" (and the lease taken on " + ", ".join(failed) + " could not be dropped: "
                "`fleet release` it)")
    return " (the leases it had taken on other hosts were dropped)" if taken else ""


def _check_targets(console: Console, backend: Backend, inventory: Path,
                   wanted: list[tuple[str, tuple[int, ...] | None]]) -> None:
    """GPUs that do not exist are refused before anything is written; processes already on the
    GPUs are named (a lease keeps fleet runs off, it stops nothing)."""
    from fleet.console import Meaning

    survey = backend.survey(inventory, selection(sorted({host for host, _ in wanted}), []))
    try:
        with waits.shown_by(console.hosts_waiting):
            results = survey.look()
    finally:
        survey.close()
    bad = {}
    for host, gpus in wanted:
        f = results[host]
        if isinstance(f, str):
            bad[host] = f"not asked: {f}"
            continue
        if gpus is None:
            continue
        have = {g.index for g in f.gpus}
        if not f.gpus:
            bad[host] = ("it has no GPU nvidia-smi lists" + (f" ({f.error})" if f.error else "")
                         + f": reserve the whole host (fleet reserve {host})")
        elif missing := [g for g in gpus if g not in have]:
            bad[host] = (f"no GPU {','.join(map(str, missing))} here (its GPUs: "
                         f"{','.join(map(str, sorted(have)))})")
        for g in gpus:
            for a in f.on(g):
                console.info(f"{host} GPU{g} is in use now: {a.used_mib} MiB, pid {a.pid} of "
                             f"{a.user or 'a process not visible here'} (the lease stops "
                             "nothing: it keeps fleet runs of others off)", Meaning.WARN)
    if bad:
        raise UsageError("nothing was reserved:\n" + "\n".join(f"  {line}" for line in once(bad)))


def _refusal(t: Taken) -> str:
    from fleet.gpuview import lease_words

    if t.error:
        return t.error
    if not t.conflicts:
        return "refused by a lease fleet cannot read"
    return "; ".join(f"{c.what()} leased by {lease_words(c, t.now, time.time())}"
                     for c in t.conflicts)


def _list(console: Console, backend: Backend, inventory: Path) -> None:
    from fleet.gpuview import clock, local_until, span

    survey = backend.survey(inventory, selection([], []))
    try:
        with waits.shown_by(console.hosts_waiting):
            results = survey.look()
    finally:
        survey.close()
    now = time.time()
    table: list[list[str]] = []
    for host, f in results.items():
        if isinstance(f, str):
            table.append([host, "-", "", "", "", f"not asked: {f}"])
            continue
        if f.unknown:
            table.append([host, "all", "?", "", "", f"leases unknown: {f.unknown}"])
        for x in sorted(f.active_leases(), key=lambda x: x.until):
            end = local_until(x, f.now, now)
            note = "; ".join(w for w in (f"run {x.run}" if x.run else "", x.note) if w)
            table.append([host, _gpus(x), x.owner, clock(end, now), span(end - now), note])
    if not table:
        console.info("no active lease on any host")
        return
    console.emit(console.table(("HOST", "GPUS", "OWNER", "UNTIL", "LEFT", "NOTE"), table))


def _gpus(x: Lease) -> str:
    return "all" if x.gpus is None else ",".join(map(str, x.gpus))


def release(targets: Targets = None, inventory: NeedInv = None) -> None:
    """Give back your GPU leases (HOST alone: all of yours there).

    Only a lease's owner can release it (its file is theirs); another user's lease on the same
    GPUs is named, and stays."""
    from fleet import backends
    from fleet.console import Console, Meaning
    from fleet.facts.leases import LeaseOrder
    from fleet.gpuview import lease_words

    if inventory is None:
        raise UsageError("give the hosts' inventory: fleet release node2:1 -i inventory/lab.toml")
    wanted = _targets(targets or [])
    if not wanted:
        raise UsageError("name what to release: fleet release node2:1 -i INVENTORY")
    backend = backends.for_inventory(inventory)
    console = Console()
    failed = {}
    for host, gpus in wanted:
        with waits.shown_by(console.hosts_waiting):
            t = backend.lease(inventory, host, LeaseOrder.give(gpus))
        if not t.ok:
            failed[host] = t.error
            continue
        what = "the whole host" if gpus is None else \
            ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))
        if not t.released:
            console.info(f"{host}: you held no lease of {what}")
        for x in t.released:
            rest = [g for g in x.gpus or () if gpus is not None and g not in gpus]
            kept = f" (your lease keeps GPU{'s' if len(rest) > 1 else ''} " \
                f"{','.join(map(str, rest))})" if rest else ""
            console.info(f"{host}: released your lease of {what if rest else x.what()}{kept}",
                         Meaning.OK)
        for x in t.kept:
            console.info(f"{host}: {x.what()} stays leased by "
                         f"{lease_words(x, t.now, time.time())} (only its owner can release "
                         "it)", Meaning.WARN)
    if failed:
        echo("\n".join(f"fleet: {line}" for line in once(failed)), err=True)
        raise typer.Exit(ExitCode.FAILED)
