"""What `fleet logs` and `fleet status` do beyond their options: the logs of every attempt
and the run's end (a Verdict event with --json), and the status as one JSON object."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleet.console import Console, Meaning
from fleet.errors import UsageError
from fleet.states import RunStatus

if TYPE_CHECKING:
    from fleet.lifecycle.history import Finished
    from fleet.run.record import RunRecord


def logs(console: Console, run_id: str | None, follow: bool, node: str | None,
          rank: int | None, attempt: int | None, merge: bool, tail: int | None,
          since: str | None) -> int:
    """`fleet logs`; with `follow`, the run's exit code at its end (0 without)."""
    from fleet import backends
    from fleet.events import Phase, Step, Verdict
    from fleet.lifecycle import attempts
    from fleet.run import logs as run_logs
    from fleet.run import outcomes
    from fleet.run import record as state
    from fleet.transport.forward import declared, recorded

    view = run_logs.View(merge, tail, None if since is None
                         else run_logs.parse_since(since, time.time()))
    run = state.load(run_id)
    backends.for_record(run).take_healed(run)  # a detached run that healed by itself
    every = attempts.records(run)
    console.event(Phase(Step.FOLLOWING, every[0].run_id))
    if attempt is not None and not 1 <= attempt <= len(every):
        raise UsageError(f"run {every[0].run_id} has {len(every)} attempt(s), not {attempt}")
    chosen = every if attempt is None else [every[attempt - 1]]
    found = attempts.load(every[0])
    total = found[0] + 1 if found else len(every)
    last = every[-1]
    # The job's `forward` ports of the master, while -f follows (a connection of their own).
    forwards = recorded(last.dir / "manifest.json") if follow else ()
    with declared(lambda: backends.for_record(last).tunnel(last, None), forwards, console,
                  owned=True):
        for one in chosen:
            if len(every) > 1:
                console.info(f"attempt {every.index(one) + 1}/{total}: run {one.run_id}")
            backends.for_record(one).logs(one, console, follow and one is every[-1], node,
                                          rank, view)
    if not follow:
        return 0
    final, lines = backends.for_record(every[-1]).describe(every[-1])
    said = run_logs.final_line(every[0].run_id, final, lines)
    if final.is_terminal:
        from fleet.cli.run_answers import keep_seen

        keep_seen(every[0], last, "fleet logs -f", final)
    if console.sink is None:
        console.info(said, _MEANING.get(final, Meaning.WARN))
    else:
        seen = outcomes.seen(last.dir)
        console.event(Verdict(every[0].run_id, final, final.exit_code, tuple(
            seen[n.host.name].outcome for n in last.nodes if n.host.name in seen), said))
    return final.exit_code


_MEANING = {RunStatus.SUCCEEDED: Meaning.OK, RunStatus.FAILED: Meaning.FAIL,
            RunStatus.NEVER_STARTED: Meaning.FAIL}


def status_json(rec: RunRecord, last: RunRecord, final: RunStatus, lines: list[str],
                done: Finished | None = None) -> None:
    """`status --json`: each node as fleet's record of the last attempt keeps it (what
    `describe` just asked of the nodes whose end was not kept is kept by now); a finished
    run's verdict as kept, with its parts never seen to end."""
    import json

    from fleet.lifecycle import attempts
    from fleet.run import outcomes
    from fleet.run.jsonl import status_json as as_json

    seen = outcomes.seen(last.dir)
    nodes = [(n.host.name, n.node_rank, seen[n.host.name].outcome if n.host.name in seen
              else None) for n in last.nodes]
    out = as_json(rec.run_id, final, nodes, lines)
    tried = attempts.as_json(rec)
    if tried:
        out["attempts"] = tried
    if done is not None:
        from fleet.run import verdict

        out["verdict"] = {**verdict.as_json(done.verdict),
                          "not_seen_to_end": [{"attempt": p.attempt, "run_id": p.run_id,
                                               "node": p.node} for p in done.open]}
    print(json.dumps(out, ensure_ascii=False))
