"""`fleet top` as data and as a table, from one look at a run (fleet.backends.answers: each
node's state and its ranks' sampling): pure, so that what a person reads and what `--json`
says are one thing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleet.backends import NodeLook
from fleet.events import SCHEMA
from fleet.facts.gpus import GpuFacts
from fleet.facts.ranktop import RankSample
from fleet.run import straggler
from fleet.run.straggler import Standing
from fleet.sizes import short
from fleet.states import NodeOutcome, NodeStatus, RunStatus, overall
from fleet.transport.group import reason

MIB = 1 << 20
HEADERS = ("node", "rank", "state", "cpu", "rss", "gpu", "log", "where", "waits", "score")


@dataclass(frozen=True)
class Top:
    run_id: str
    status: RunStatus
    states: dict[str, NodeOutcome | Exception]  # in node rank order
    looks: dict[str, NodeLook | Exception]
    node_ranks: dict[str, int]
    standing: Standing

    @property
    def unasked(self) -> dict[str, str]:
        """The nodes that could not be asked, and why."""
        return {h: reason(r) for h, r in self.looks.items() if isinstance(r, Exception)}


def make(run_id: str, states: dict[str, NodeOutcome | Exception],
         looks: dict[str, NodeLook | Exception], node_ranks: dict[str, int],
         factor: float = straggler.FACTOR, planned: dict[str, range] | None = None) -> Top:
    """`planned`: per node the global ranks the plan gave it, where known (a rank a node
    claims outside them is not judged)."""
    status = overall(_status(r) for r in states.values())
    tops = {h: r.top for h, r in looks.items() if isinstance(r, NodeLook)}
    return Top(run_id, status, states, looks, node_ranks,
               straggler.judge(straggler.ranks_of(tops, planned), factor))


def _status(r: NodeOutcome | Exception) -> NodeStatus:
    return r.status if isinstance(r, NodeOutcome) else NodeStatus.UNREACHABLE


def _gpu_of(facts: GpuFacts | None, pid: int) -> tuple[int, int | None, int] | None:
    """(GPU index, its use %, this process's memory in bytes) where the process is on one."""
    if facts is None:
        return None
    for app in facts.apps:
        g = facts.gpu(app.gpu_uuid)
        if app.pid == pid and g is not None:
            return g.index, g.util, app.used_mib * MIB
    return None


def _where(s: RankSample) -> str:
    if not s.alive:
        return "(ended)"
    if not s.places or not s.samples:
        return s.now.where
    p = s.places[0]
    return f"{p.where} {p.count / s.samples:.0%}"


def rows(top: Top) -> list[tuple[list[str], bool]]:
    """The table's rows, each with whether it is the straggler's."""
    out: list[tuple[list[str], bool]] = []
    named = top.standing.straggler
    for host, state in top.states.items():
        word = _status(state).value
        look = top.looks.get(host)
        if not isinstance(look, NodeLook):
            why = reason(look) if isinstance(look, Exception) else "not asked"
            out.append(([host, "-", word, "", "", "", "", why, "", ""], False))
            continue
        t = look.top
        pace = (f"{t.lines_per_s:.1f}/s" if t.lines_per_s is not None else "-") + (
            f", {t.last_line_age_s:.0f}s ago" if t.last_line_age_s is not None else "")
        ranks = t.ranks()
        if not ranks:
            out.append(([host, "-", word, "", "", "", pace, "no rank sampled", "", ""], False))
        for rank, s in ranks.items():
            gpu = _gpu_of(look.gpus, s.pid)
            score = top.standing.scores.get(rank)
            out.append(([
                host, str(rank), word,
                f"{s.cpu_pct:.0f}%" if s.cpu_pct is not None else "-",
                short(s.rss) if s.rss is not None else "-",
                (f"{gpu[0]}: {gpu[1] if gpu[1] is not None else '?'}% {short(gpu[2])}"
                 if gpu else "-"),
                pace, _where(s),
                f"{s.wait_share:.0%}" if s.wait_share is not None else "-",
                f"{score:.2f}x" if score is not None else "-"],
                named is not None and named.rank == rank))
    return out


def as_json(top: Top) -> dict[str, Any]:
    """`fleet top --json` (docs/EVENTS.md)."""
    nodes: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for host, state in top.states.items():
        word = _status(state).value
        look = top.looks.get(host)
        node: dict[str, Any] = {"host": host, "node_rank": top.node_ranks.get(host),
                                "status": word, "log": None, "gpus": None, "error": None}
        nodes.append(node)
        if not isinstance(look, NodeLook):
            node["error"] = reason(look) if isinstance(look, Exception) else "not asked"
            continue
        t = look.top
        node["log"] = {"lines_per_s": _round(t.lines_per_s),
                       "last_line_age_s": _round(t.last_line_age_s)}
        if look.gpus is not None and look.gpus.smi:
            node["gpus"] = [{"index": g.index, "util_pct": g.util,
                             "memory_used": g.used_mib * MIB} for g in look.gpus.gpus]
        for rank, s in t.ranks().items():
            gpu = _gpu_of(look.gpus, s.pid)
            ranks.append({
                "rank": rank, "local_rank": s.local_rank, "host": host, "pid": s.pid,
                "alive": s.alive, "status": word, "cpu_pct": s.cpu_pct, "rss": s.rss,
                "gpu": {"index": gpu[0], "memory_used": gpu[2]} if gpu else None,
                "samples": s.samples, "wait_share": _round(s.wait_share, 3),
                "where": _where(s), "now": s.now.where,
                "score": _round(top.standing.scores.get(rank), 3),
                "throttled": s.throttled})
    named = top.standing.straggler
    return {"v": SCHEMA, "run_id": top.run_id, "status": top.status.value, "nodes": nodes,
            "ranks": ranks, "verdict": top.standing.verdict(),
            "straggler": None if named is None else {
                "rank": named.rank, "host": named.host, "score": named.score,
                "others_wait": round(named.others_wait, 3), "place": named.place,
                "throttled": named.throttled, "line": named.line}}


def _round(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)
