"""The laptop's record is the history: the verdict that `fleet up`, `logs -f` or `stop` saw is
kept in the run's record at once (fleet.run.verdict), with every node's part of any attempt that
fleet never saw end; `status` and `ps` answer a finished run from that record alone, so a host
that is gone since neither rewrites nor slows what fleet already knows."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleet.config.inventory import BackendKind
from fleet.errors import FleetError
from fleet.lifecycle import attempts
from fleet.run import outcomes, verdict
from fleet.run import record as state
from fleet.run.verdict import Lost, Verdict
from fleet.states import NodeOutcome, RunStatus


def keep(run_id: str, status: RunStatus, code: int, by: str, said: str) -> Verdict | None:
    """Keep the run's verdict (the first one kept stands); none for a state that is no end
    (`unknown`: fleet lost sight of a node, whose part later commands still ask about), nor
    for `never started` (its record says so by itself).
    Never raises: a record that cannot take it leaves the run to be asked, as before."""
    if not status.is_terminal or status is RunStatus.NEVER_STARTED:  # that one is said locally
        return None
    try:
        run = state.load(run_id)
        run = state.load(run.parent) if run.parent else run
        every = attempts.records(run)
        return verdict.record(run.dir, Verdict(status, int(code), by, time.time(), said,
                                               lost_parts(every, attempts.load(run))))
    except (FleetError, OSError):
        return None


def lost_parts(every: list[state.RunRecord],
               found: tuple[int, list[attempts.Attempt]] | None) -> tuple[Lost, ...]:
    """Each node's part, of any attempt, whose end fleet has not seen (its record keeps none):
    those an attempt lost, and those of the last attempt with no end kept."""
    parts: dict[tuple[str, str], Lost] = {}
    by_id = {r.run_id: r for r in every}
    for a in (found[1] if found else []):
        rec = by_id.get(a.run_id)
        if rec is None:
            continue
        ended = outcomes.ended(rec.dir)
        for node in a.lost:
            if node not in ended:
                parts[(a.run_id, node)] = Lost(a.number, a.run_id, node)
    last = every[-1]
    ended = outcomes.ended(last.dir)
    for n in last.nodes:
        if n.host.name not in ended:
            parts.setdefault((last.run_id, n.host.name), Lost(len(every), last.run_id,
                                                              n.host.name))
    return tuple(sorted(parts.values(), key=lambda p: (p.attempt, p.node)))


@dataclass(frozen=True)
class Finished:
    """A run whose end fleet saw: what status and ps say of it, from its record alone."""

    verdict: Verdict
    open: list[Lost]  # its lost parts whose end is still not seen (a later stop keeps it)
    nodes: list[tuple[state.NodeRecord, NodeOutcome | None]]  # the last attempt's, as kept


def finished(run: state.RunRecord, every: list[state.RunRecord]) -> Finished | None:
    """The run as its record has it where fleet saw it end; None where it must be asked."""
    if run.backend is not BackendKind.HOSTS:  # Slurm's answer is its controller's, not hosts'
        return None
    v = verdict.read(run.dir)
    if v is None:
        return None
    ended = outcomes.ended(every[-1].dir)
    still = [p for p in v.lost
             if p.node not in outcomes.ended(state.state_dir() / p.run_id)]
    return Finished(v, still, [(n, ended.get(n.host.name)) for n in every[-1].nodes])


def node_row(n: state.NodeRecord, o: NodeOutcome | None) -> str:
    """A node's row in `status`, from the record: `node1  node rank 0 (rank 0)  succeeded`."""
    where = f"  {n.host.name:<16} {n.ranks()}"
    if o is None:
        return f"{where}  never seen to end (fleet does not ask a finished run again)"
    return f"{where}  {outcomes.words(o)}"


def status_lines(last: state.RunRecord, done: Finished) -> list[str]:
    """`fleet status` of a finished run: its verdict, then each node of its last attempt."""
    v = done.verdict
    head = f"run {last.run_id} ({last.job}), started {time.ctime(last.started)}: {v.status.value}"
    return [head] + [node_row(n, o) for n, o in done.nodes] + [
        f"  as fleet saw it end: exit {v.code}, by {v.by} at {v.when()} (no host asked)"]


def lost_lines(run_id: str, done: Finished) -> list[str]:
    return [f"  {p.words(run_id)}" for p in done.open]


def ps_tail(done: Finished) -> str:
    """`; attempt 1 may still run on node2` per attempt with a part never seen to end."""
    by: dict[int, list[str]] = {}
    for p in done.open:
        by.setdefault(p.attempt, []).append(p.node)
    return "".join(f"; attempt {n} may still run on {', '.join(nodes)}"
                   for n, nodes in sorted(by.items()))
