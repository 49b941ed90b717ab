"""`fleet gpus` (who uses which GPU, on every host), `fleet reserve` and `fleet release` (leases
kept on the hosts themselves: no server). fleet.cli adds them to the app after the commands
around a run."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleet.cli.app import ExcludeOpt, InvOpt, NodeOpt, echo, job_given, selection
from fleet.console import Console, Meaning, interactive
from fleet.errors import ExitCode, FleetError, Interrupted, UsageError
from fleet.facts.gpus import GpuFacts
from fleet.facts.leases import MAX_LEASE_S, Lease, LeaseOrder, Taken, parse_gpu_list
from fleet.gpuview import HEADERS, clock, lease_words, local_until, rows, span
from fleet.gpuview import as_json as gpus_json
from fleet.timespan import parse_duration

if TYPE_CHECKING:
    from fleet.backends import Backend, GpuSurvey


class LeaseRefused(FleetError):
    """Another user's lease covers what was asked for; nothing was reserved."""

    exit_code = ExitCode.BUSY


def _inventory(path: Path | None, inventory: Path | None) -> Path:
    if path is not None:
        from fleet.trust import inventory_for
        return inventory_for(path, inventory)
    if inventory is not None:
        return inventory
    raise UsageError("name the hosts: a job or inventory file (fleet gpus inventory/lab.toml), "
                     "or -i INVENTORY")


Where = Annotated[Path | None, typer.Argument(
    metavar="[JOB|INVENTORY]", callback=job_given,
    help="A job file (its inventory's hosts) or an inventory file; or give -i.")]


def gpus(path: Where = None, inventory: InvOpt = None, node: NodeOpt = None,
         exclude: ExcludeOpt = None,
         watch: Annotated[bool, typer.Option(
             "--watch", "-w", help="Refresh in place until Ctrl-C (off a terminal: a new table, "
                                   "or JSON line with --json, each time).")] = False,
         every: Annotated[float, typer.Option(
             "--every", metavar="SECONDS", min=1.0, help="How often --watch looks.")] = 5.0,
         as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")
                            ] = False) -> None:
    """Show every host's GPUs: memory, use, whose processes, leases.

    One command per host, all at once; a process's fleet run is named where this login may see
    it (its own, or any as root). A process running for an hour or more that holds memory on a
    GPU at 0% at this look is flagged "idle?". Exit code 3 when a host could not be asked."""
    from fleet import backends

    inv = _inventory(path, inventory)
    backend = backends.for_inventory(inv)
    console = Console()
    survey = backend.survey(inv, selection(node, exclude))
    watched: dict[str, float] = {}
    try:
        if not watch:
            with console.waiting("asking every host"):
                results = survey.look()
            _show(console, results, as_json, watched)
        else:
            results = _watch(console, survey, as_json, every, watched)
    finally:
        survey.close()
    if any(isinstance(r, str) for r in results.values()):
        raise typer.Exit(ExitCode.UNREACHABLE)


def _show(console: Console, results: dict[str, GpuFacts | str], as_json: bool,
          watched: dict[str, float]) -> None:
    now = time.time()
    if as_json:
        print(json.dumps(gpus_json(results, now)), flush=True)
        return
    table, meanings = rows(results, now, watched)
    console.emit(console.table(HEADERS, table, meanings))


def _watch(console: Console, survey: GpuSurvey, as_json: bool, every: float,
           watched: dict[str, float]) -> dict[str, GpuFacts | str]:
    """Look every `every` seconds until Ctrl-C (which ends it with exit code 0): on a terminal
    the table is redrawn in place."""
    from rich.live import Live
    from rich.text import Text

    live = None if as_json or not interactive(sys.stdout) else Live(
        Text(""), auto_refresh=False, transient=False, redirect_stdout=False)
    results: dict[str, GpuFacts | str] = {}
    try:
        if live is not None:
            live.start()
        while True:
            results = survey.look()
            _seen_idle(results, watched, time.time())
            if live is not None:
                table, meanings = rows(results, time.time(), watched)
                stamp = time.strftime("%H:%M:%S")
                live.update(Text.from_ansi(f"{stamp}  every {every:g}s, Ctrl-C ends\n" +
                                           console.table(HEADERS, table, meanings)), refresh=True)
            else:
                _show(console, results, as_json, watched)
                if not as_json:
                    print(flush=True)
            time.sleep(every)
    except Interrupted:
        return results
    finally:
        if live is not None:
            live.stop()


def _seen_idle(results: dict[str, GpuFacts | str], watched: dict[str, float],
               now: float) -> None:
    """Since when --watch has seen each GPU hold memory at 0%, without a busy look between."""
    for host, f in results.items():
        if isinstance(f, str):
            continue
        for g in f.gpus:
            key = f"{host}/{g.index}"
            if g.util == 0 and f.on(g.index):
                watched.setdefault(key, now)
            else:
                watched.pop(key, None)


# ---- leases -----------------------------------------------------------------------------------
Targets = Annotated[list[str] | None, typer.Argument(
    metavar="HOST[:GPUS]...", help="A host (the whole host) or host:GPUs, e.g. node2:1 or "
                                   "node2:0-3; GPU indices are nvidia-smi's.")]
NeedInv = Annotated[Path | None, typer.Option("--inventory", "-i", metavar="INVENTORY",
                                              help="The inventory whose hosts these are.")]


def _targets(targets: list[str]) -> list[tuple[str, tuple[int, ...] | None]]:
    out = []
    for t in targets:
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
        with console.waiting("reserving"):
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
            backend.lease(inventory, host, LeaseOrder.drop(t.replaces))
        if t.lease is not None:
            console.info(f"{host}: {t.lease.what()} reserved for you ({t.lease.owner}) until "
                         f"{clock(local_until(t.lease, t.now, now), now)} "
                         f"({span(seconds)})", Meaning.OK)


def _undo(backend: Backend, inventory: Path, taken: list[tuple[str, Taken]]) -> str:
    """Drop the leases this reserve took (by name: what the caller held before stays); the
    words for what was undone, or what could not be."""
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
    survey = backend.survey(inventory, selection(sorted({host for host, _ in wanted}), []))
    try:
        with console.waiting("asking the hosts"):
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
        raise UsageError("nothing was reserved:\n" + "\n".join(
            f"  {host}: {why}" for host, why in bad.items()))


def _refusal(t: Taken) -> str:
    if t.error:
        return t.error
    if not t.conflicts:
        return "refused by a lease fleet cannot read"
    return "; ".join(f"{c.what()} leased by {lease_words(c, t.now, time.time())}"
                     for c in t.conflicts)


def _list(console: Console, backend: Backend, inventory: Path) -> None:
    survey = backend.survey(inventory, selection([], []))
    try:
        with console.waiting("asking every host"):
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
            table.append([host, _gpus(x), x.owner, clock(end, now), span(end - now), x.note])
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

    if inventory is None:
        raise UsageError("give the hosts' inventory: fleet release node2:1 -i inventory/lab.toml")
    wanted = _targets(targets or [])
    if not wanted:
        raise UsageError("name what to release: fleet release node2:1 -i INVENTORY")
    backend = backends.for_inventory(inventory)
    console = Console()
    failed = {}
    for host, gpus in wanted:
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
        echo("\n".join(f"fleet: {h}: {why}" for h, why in failed.items()), err=True)
        raise typer.Exit(ExitCode.FAILED)
