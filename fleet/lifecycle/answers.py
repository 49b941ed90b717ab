"""What fleet answers about a recorded run, as data: its state (a finished run from its record
alone, never asked again; a live one asked of its nodes), `status --json`'s object and the
manifest `show --json` prints. The CLI prints these; `fleet ui` serves them: one answer, two
views."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.errors import FleetError
from fleet.states import RunStatus

if TYPE_CHECKING:
    from fleet.backends import Seen
    from fleet.lifecycle.attempts import Attempt
    from fleet.lifecycle.history import Finished
    from fleet.run.record import RunRecord
    from fleet.run.straggler_record import Named


@dataclass(frozen=True)
class Looked:
    """A run as `fleet status` sees it: its record, every attempt's, the attempts' history
    (None: no [restart]), its kept end (None: not over), its state and lines per node, the
    stragglers named and what of them could not be read."""

    rec: RunRecord
    every: list[RunRecord]
    found: tuple[int, list[Attempt]] | None
    done: Finished | None
    final: RunStatus
    lines: list[str]
    named: list[Named]
    unread: list[str]

    @property
    def last(self) -> RunRecord:
        return self.every[-1]


def look(rec: RunRecord) -> Looked:
    """The run's state: a finished run's from its record, a live one's asked of its nodes (and
    kept where that look saw it end)."""
    from fleet import backends
    from fleet.lifecycle import attempts, history
    from fleet.run import straggler_record

    backends.for_record(rec).take_healed(rec)  # a detached run that healed by itself
    found = attempts.load(rec)
    every = attempts.records(rec)
    done = history.finished(rec, every)
    if done is not None:
        final, lines = done.verdict.status, history.status_lines(every[-1], done)
    else:
        final, lines = backends.for_record(every[-1]).describe(every[-1])
        if final.is_terminal:  # seen to end now (a detached run): not asked again
            keep_seen(rec, every[-1], "fleet status", final)
    named, unread = straggler_record.of_run([r.dir for r in every])
    return Looked(rec, every, found, done, final, lines, named, unread)


def status_object(seen: Looked) -> dict[str, Any]:
    """`status --json`: each node as fleet's record of the last attempt keeps it (what
    `describe` just asked of the nodes whose end was not kept is kept by now); a finished
    run's verdict as kept, with its parts never seen to end; the last straggler named."""
    from fleet.lifecycle import attempts
    from fleet.run import outcomes, straggler_record, verdict, watched
    from fleet.run.jsonl import status_json

    last, final = seen.last, seen.final
    ends = outcomes.seen(last.dir)
    nodes = [(n.host.name, n.node_rank, ends[n.host.name].outcome if n.host.name in ends
              else None) for n in last.nodes]
    out = status_json(seen.rec.run_id, final, nodes, seen.lines)
    out["straggler"] = straggler_record.as_json(seen.named[-1]) if seen.named else None
    if tried := attempts.as_json(seen.rec):
        out["attempts"] = tried
    if by := watched.watched_by(last, final):  # a run that goes on: who stops it on a failure
        out["watched_by"] = {"words": by.removeprefix("watched by: "),
                             "who": watched.who(last, final)}
    if seen.done is not None:
        out["verdict"] = {**verdict.as_json(seen.done.verdict),
                          "not_seen_to_end": [{"attempt": p.attempt, "run_id": p.run_id,
                                               "node": p.node} for p in seen.done.open]}
    return out


def manifest(rec: RunRecord) -> dict[str, Any]:
    """A run's manifest as its backend keeps it (`fleet diff` compares two)."""
    from fleet import backends
    from fleet.console import Console

    return backends.for_record(rec).manifest(rec, Console())


def diff(rec_a: RunRecord, rec_b: RunRecord) -> list[str]:
    """`fleet diff`: what changed between two runs (a restarted run: its last attempt, said
    so)."""
    from fleet import manifest_view
    from fleet.lifecycle import attempts

    said, chosen = [], []
    for rec in (rec_a, rec_b):
        every = attempts.records(rec)
        if len(every) > 1:
            said.append(f"{every[0].run_id}: comparing its last attempt, "
                        f"{len(every)}/{len(every)} ({every[-1].run_id})")
        chosen.append(every[-1])
    a, b = manifest(chosen[0]), manifest(chosen[1])
    return said + (manifest_view.diff(a, b)
                   or [f"no difference between {a['run_id']} and {b['run_id']}"])


def shown(rec: RunRecord) -> dict[str, Any]:
    """`show --json`: the last attempt's manifest, what was pulled, the attempts, how each node
    and the run ended as fleet saw them."""
    from fleet import manifest as fleet_manifest
    from fleet.lifecycle import attempts
    from fleet.run import outcomes, verdict

    last = attempts.records(rec)[-1]
    m = manifest(last)
    if pulled := fleet_manifest.pulled_of(last.dir):
        m = {**m, "pulled": pulled}
    if tried := attempts.as_json(rec):
        m = {**m, "attempts": tried}
    if seen := outcomes.seen(last.dir):  # how each node ended, as fleet saw it
        m = {**m, "outcomes": outcomes.as_json(seen)}
    if kept := verdict.read(rec.dir):  # and the run
        m = {**m, "verdict": verdict.as_json(kept)}
    return m


def ps_word(rec: RunRecord) -> str:
    """A run's state in `ps`: from its record where it is finished, else asked."""
    from fleet import backends
    from fleet.lifecycle import attempts, history
    from fleet.transport.group import reason

    try:
        backends.for_record(rec).take_healed(rec)  # a detached run that healed by itself
        found = attempts.load(rec)
        every = attempts.records(rec)
        done = history.finished(rec, every)
        if done is not None:
            said, left = done.verdict.status.value, history.ps_tail(done)
        else:
            said = words(backends.for_record(every[-1]).state(every[-1]))
            left = "".join(f"; attempt {number} may still run on "
                           f"{', '.join(row.split()[0] for row in rows)}"
                           for number, rows in not_over(every, found[1] if found else []))
        if not found:
            return said + left
        return f"{said} ({attempts.headline(*found, len(every))}){left}"
    except FleetError as e:
        return words(backends.Seen(RunStatus.UNKNOWN, why=reason(e)))


def words(seen: Seen) -> str:
    """A run's state in `ps`: `running`, `unknown (node2: timed out)`, `running (slurm)`."""
    return seen.status.value + "".join(f" ({w})" for w in (seen.why, seen.by) if w)


def not_over(every: list[RunRecord], items: list[Attempt]) -> list[tuple[int, list[str]]]:
    """Of a run not known to be over: earlier attempts that lost a node (their record says
    which) whose end fleet has not seen since (its stop keeps that end), where that node does
    not say it ended either: each one's number and its rows for those nodes. Only those nodes
    are asked, bounded in time."""
    from fleet import backends
    from fleet.run import outcomes

    records = {rec.run_id: rec for rec in every[:-1]}
    found = []
    for a in items:
        rec = records.get(a.run_id)
        if rec is None or not a.lost:
            continue
        open_ = set(a.lost) - set(outcomes.ended(rec.dir))
        if open_:
            rows = backends.for_record(rec).parts_left(rec, open_)
            if rows:
                found.append((a.number, rows))
    return found


def keep_seen(run: RunRecord, last: RunRecord, by: str, final: RunStatus | None = None) -> None:
    """After `stop`, `logs -f` or `status` saw the run end (`final`, else asked of the record
    and the nodes): its verdict kept, where no `fleet up` still watches it (that one keeps its
    own, and may yet start another attempt)."""
    from fleet import backends
    from fleet.lifecycle import attempts, history
    from fleet.run.record import controller_alive

    if controller_alive(run.controller) is True:
        return
    # The nodes' watchers may have healed the run since `last` was read: its end is then no
    # end of the run (attempt 2 goes on), and nothing is kept.
    backends.for_record(run).take_healed(run)
    if attempts.records(run)[-1].run_id != last.run_id:
        return
    if final is None:
        final, _ = backends.for_record(last).describe(last)
    history.keep(run.run_id, final, final.exit_code, by, f"run {run.run_id} {final.value}")
