"""`fleet plan` on a host list: each node's rank, env and command, the spares, and what `up`
would move; with `probe`, as the nodes answer (read-only: nothing is created on them)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from fleet import preview
from fleet.backends.hosts import placing
from fleet.backends.hosts import prepare as launch
from fleet.backends.hosts import setup as fleet_setup
from fleet.backends.hosts.setup import Decision
from fleet.backends.hosts.upload import scan_sources
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.config.select import load_selected
from fleet.console import Console
from fleet.plan import Plan, make_plan, masked, new_run_id, rank_span
from fleet.shell import join
from fleet.transport import open_transport
from fleet.transport.group import each, reason
from fleet.transport.ignore import counted
from fleet.transport.sync import Scan
from fleet.transport.transfer import human

LARGEST = 3  # files named by size in the text; --json names LARGEST_JSON
LARGEST_JSON = 20
IGNORED_SHOWN = 3  # per ignore file in the text; --json names up to IGNORED_MAX
IGNORED_MAX = 1000


@dataclass(frozen=True)
class Moves:
    """What `up` would send: the workdir as scanned (what is synced, what is ignored and by
    which file) and the preview of what moves where."""

    code: Scan
    preview: preview.Preview


def largest(code: Scan, count: int) -> list[tuple[str, int]]:
    """The largest files synced, (path, bytes), largest first (then by path)."""
    return sorted(((rel, m[0]) for rel, m in code.manifest.items()),
                  key=lambda f: (-f[1], f[0]))[:count]


def code_lines(code: Scan) -> list[str]:
    """What is synced from the workdir: how much, its largest files, and what .gitignore and
    .fleetignore leave out (an ignored directory counts once, with a trailing /)."""
    size = sum(m[0] for m in code.manifest.values())
    top = ", ".join(f"{rel} {human(n)}" for rel, n in largest(code, LARGEST))
    out = [f"code to sync: {len(code.manifest)} file(s), {human(size)} from {code.root}"
           + (f" (largest: {top})" if top else "")]
    for why, names in counted(code.ignored):
        more = len(names) - IGNORED_SHOWN
        out.append(f"  ignored by {why}: {len(names)} ({', '.join(names[:IGNORED_SHOWN])}"
                   f"{f' and {more} more' if more > 0 else ''})")
    return out


def code_json(code: Scan) -> dict[str, object]:
    return {"root": str(code.root), "files": len(code.manifest),
            "bytes": sum(m[0] for m in code.manifest.values()),
            "largest": [{"path": rel, "bytes": n} for rel, n in largest(code, LARGEST_JSON)],
            "ignored": [{"path": rel, "by": why} for rel, why in code.ignored[:IGNORED_MAX]]}


@dataclass(frozen=True)
class Spare:
    """A host with `spare = true`: not in the plan until it takes a node's place; with
    --probe, whether it answered (`said`: "answers", or why not)."""

    host: Host
    said: str = ""


def spares(inv: Inventory, probe: bool) -> tuple[Spare, ...]:
    """The inventory's spares, each connected to (then let go) where `probe` asks."""
    if not probe:
        return tuple(Spare(h) for h in inv.spares)

    def answer(h: Host) -> str:
        open_transport(h, hello=False).close()
        return "answers"

    found = each(((h.name, h) for h in inv.spares), answer)
    return tuple(Spare(h, r if isinstance(r, str) else reason(r))
                 for h, r in zip(inv.spares, found.values(), strict=True))


def survey(job: Job, probe: bool) -> tuple[Plan, dict[str, Decision], Moves, tuple[Spare, ...]]:
    """The plan, each node's setup decision, what would be sent, and the spares."""
    inv, notes = placing.planned(job, load_selected(job.inventory, job.selection))
    console = Console(out=sys.stderr)
    sources = scan_sources(job, console)  # as `up` does, before any host is touched
    if not probe:
        p = make_plan(inv, job, new_run_id(job.name))
        p = dataclasses.replace(p, notes=p.notes + notes)
        return p, fleet_setup.decide(p, None), Moves(
            sources.code, preview.preview(p, sources.code, sources.data)), spares(inv, False)
    console.hosts([h.name for h in inv.hosts])
    spared = spares(inv, True)
    session = launch.connect(inv, console)
    try:
        p = launch.prepare_plan(session, inv, job, new_run_id(job.name), console,
                                create=False, allow_mismatch=True)
        p = dataclasses.replace(p, notes=p.notes + notes)
        marks = fleet_setup.recorded(session.transports, p) if job.setup else {}
        setups = fleet_setup.decide(p, marks)
        moves = preview.preview(p, sources.code, sources.data,
                                preview.list_nodes(session.transports, p),
                                tuple(n for n, f in session.facts.items() if not f.storage))
    finally:
        session.close()
    return p, setups, Moves(sources.code, moves), spared


def spare_lines(spared: tuple[Spare, ...]) -> list[str]:
    out = []
    for s in spared:
        h = s.host
        out.append(f"\n[{h.name}] spare (not used at the start: it takes a lost or failed "
                   f"node's place, with its node rank), {h.transport} "
                   f"{(h.user + '@') if h.user else ''}{h.address}"
                   f"{':' + str(h.port) if h.port else ''}")
        if s.said:
            out.append(f"  probe:     {s.said}")
    return out


def lines(p: Plan, setups: dict[str, Decision], moves: Moves,
          spared: tuple[Spare, ...] = ()) -> list[str]:
    job = p.job
    out = [f"run {p.run_id}: {job.name}, {len(p.nodes)} node(s), rendezvous "
           f"{job.rendezvous.backend} at {p.master.master_addr}:{job.rendezvous.port}"]
    out += [f"note: {note}" for note in p.notes]
    out += [f"shared storage: {', '.join(group)} (one workdir; code and data synced once)"
            for group in p.storage if len(group) > 1]
    for n in p.nodes:
        h = n.host
        out.append(f"\n[{h.name}] node rank {n.node_rank}, {h.transport} "
                   f"{(h.user + '@') if h.user else ''}{h.address}"
                   f"{':' + str(h.port) if h.port else ''}")
        out.append(f"  interface: {n.net.interface or '-'} ({n.net.reason})")
        span = rank_span(n.rank_base, n.nproc)
        gpus = f" on GPU(s) {','.join(map(str, h.gpus))}" if h.gpus else ""
        world = f" of world size {n.world_size}" if n.world_size else ""
        out.append(f"  processes: {n.nproc}{gpus}" + (f", {span}{world}" if span else world))
        out.append(f"  code dir:  {n.code_dir}")
        if job.setup:
            out.append(f"  setup:     {setups[h.name]}")
        out.append(f"  run dir:   {n.run_dir}")
        out += [f"  env {k}={v}" for k, v in masked(n.env, job.secret_env).items()]
        out.append(f"  command:   {join(n.argv)}")
    out += spare_lines(spared)
    out.append("")
    return out + code_lines(moves.code) + preview.lines(moves.preview)


def as_json(p: Plan, moves: Moves, spared: tuple[Spare, ...] = ()) -> dict[str, object]:
    return {"run_id": p.run_id, "job": p.job.name, "notes": list(p.notes),
            "spares": [{"host": s.host.name, "address": s.host.address,
                        "transport": s.host.transport, "probe": s.said or None}
                       for s in spared],
            "storage": [list(g) for g in p.storage], "nodes": [
        {"host": n.host.name, "address": n.host.address, "transport": n.host.transport,
         "node_rank": n.node_rank, "nnodes": n.nnodes, "nproc_per_node": n.nproc,
         "rank_base": n.rank_base, "world_size": n.world_size,
         "gpus": list(n.host.gpus) if n.host.gpus else None,
         "master_addr": n.master_addr, "master_port": n.master_port,
         "interface": n.net.interface, "interface_reason": n.net.reason,
         "run_dir": n.run_dir, "code_dir": n.code_dir,
         "env": masked(n.env, p.job.secret_env), "argv": list(n.argv)}
        for n in p.nodes], "data": preview.as_json(moves.preview), "sync": code_json(moves.code)}
