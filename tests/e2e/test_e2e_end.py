"""The end of a run, in the order a person sees it: once the last node's part has ended, fleet says
the report (each node's end, then the verdict) and nothing else of its own, and exits; the
run's record has the verdict before fleet's exit. No timing here: the order of events (bench/end.py
measures how soon)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet import events as ev
from fleet.run.jsonl import read
from tests.conftest import CLI, JOBS
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


def test_after_the_last_nodes_end_only_the_report_follows(cli: CLI, tb2: Testbed,
                                                          tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", "--json", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    every = read(r.stdout)
    ends = [i for i, e in enumerate(every) if isinstance(e, ev.NodeEnded)]
    assert len(ends) == 2, every
    after = every[ends[-1] + 1:]
    # What may still come: the job's own last lines (its log read to the end), then the report.
    fleet_own = [e for e in after if not isinstance(e, ev.Line)]
    phase, *report, verdict = fleet_own
    assert isinstance(phase, ev.Phase) and phase.step is ev.Step.REPORTING, fleet_own
    assert [(n.host, n.words) for n in report if isinstance(n, ev.Note)] == [
        ("node1", "succeeded (exit 0)"), ("node2", "succeeded (exit 0)")], fleet_own
    assert len(report) == 2, fleet_own
    assert isinstance(verdict, ev.Verdict) and verdict.exit_code == 0
    assert {o.name for o in verdict.nodes} == {"node1", "node2"}
    # The report's facts came with the ends: the verdict says what the NodeEnded events said.
    said = {e.outcome.name: e.outcome for e in every if isinstance(e, ev.NodeEnded)}
    assert {o.name: o for o in verdict.nodes} == said
    # Nothing between a node's end and the report is fleet's: no line after the report.
    assert every.index(verdict) == len(every) - 1

    # The same run for a person: after the last node started, fleet's own lines are the
    # report alone (each node's end, then the verdict), and the record has the verdict.
    plain = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert plain.returncode == 0, plain.stderr
    lines = plain.stderr.splitlines()
    last_start = max(i for i, line in enumerate(lines) if line.endswith(("started",))
                     or " started (pid " in line or "started master" in line)
    tail = [line for line in lines[last_start + 1:] if line.startswith("fleet: ")]
    assert tail[:-1] == ["fleet: node1  succeeded (exit 0)", "fleet: node2  succeeded (exit 0)"], \
        tail
    assert tail[-1].startswith("fleet: run ") and tail[-1].endswith("succeeded on all 2 node(s)")
    run_id = tail[-1].split()[2]
    status = cli("status", run_id)
    assert status.returncode == 0 and "as fleet saw it end: exit 0" in status.stdout, status

