"""`fleet up --json` end to end: the run's events alone, read as a dashboard would, rebuild its
outcome (the run's state, each node's state and exit code, fleet's exit code), and it is what
`fleet status --json` and the process say."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fleet import events as ev
from fleet.run.jsonl import read
from tests.conftest import CLI, JOBS
from tests.e2e.test_e2e_up import failing_job
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


@dataclass
class Rebuilt:
    """What a consumer of the stream knows at its end, from the events alone."""

    run_id: str = ""
    status: str = ""
    exit_code: int | None = None
    nodes: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # host: status, code
    told: dict[str, tuple[str, int | None]] = field(default_factory=dict)  # by the Verdict
    started: set[str] = field(default_factory=set)
    lines: list[ev.Line] = field(default_factory=list)


def rebuild(stdout: str) -> Rebuilt:
    every = read(stdout)  # every line of stdout is an event of the schema, or this fails
    assert every, "no event on stdout"
    assert all(json.loads(line)["v"] == ev.SCHEMA for line in stdout.splitlines())
    out = Rebuilt()
    for e in every:
        if isinstance(e, ev.Phase) and e.run_id:
            out.run_id = out.run_id or e.run_id
        elif isinstance(e, ev.NodeStarted):
            out.started.add(e.host)
        elif isinstance(e, ev.NodeEnded):  # as each node ends: a later word for it stands
            out.nodes[e.outcome.name] = (e.outcome.status.value, e.outcome.code)
        elif isinstance(e, ev.Line):
            out.lines.append(e)
        elif isinstance(e, ev.Verdict):
            out.run_id, out.status, out.exit_code = e.run_id, e.status.value, e.exit_code
            out.told = {o.name: (o.status.value, o.code) for o in e.nodes}
        elif isinstance(e, ev.Error):
            out.exit_code = e.exit_code
    # The stream's last word is its verdict, or (fleet ending non-zero) the error after it.
    assert isinstance(every[-1], ev.Verdict | ev.Error), every[-1]
    return out


def status_json(cli: CLI, run_id: str) -> tuple[dict[str, Any], int]:
    r = cli("status", run_id, "--json")
    return json.loads(r.stdout), r.returncode


def check_matches(cli: CLI, got: Rebuilt, code: int) -> None:
    st, st_code = status_json(cli, got.run_id)
    assert st["v"] == ev.SCHEMA and st["run_id"] == got.run_id
    assert got.status == st["status"]
    assert {n["host"]: (n["status"], n["exit_code"]) for n in st["nodes"]} == got.nodes
    assert got.exit_code == code == st_code == st["exit_code"]
    assert got.told == got.nodes  # the Verdict sums up what the NodeEnded events said


def test_events_of_a_run_that_succeeds_rebuild_its_outcome(cli: CLI, tb2: Testbed,
                                                           tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", "--json", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    got = rebuild(r.stdout)
    assert got.status == "succeeded" and got.exit_code == 0
    assert got.nodes == {"node1": ("succeeded", 0), "node2": ("succeeded", 0)}
    assert got.started == {"node1", "node2"}
    # Every rank's line, with its host and rank as fields, not in a tag to parse.
    said = {(e.host, e.rank) for e in got.lines if "all_reduce = 10 ok" in e.text}
    assert said == {("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)}
    check_matches(cli, got, r.returncode)
    # The words went nowhere near stdout: stderr has none of fleet's either (the view is JSON).
    assert "| rank" not in r.stdout


def test_events_of_a_run_where_one_rank_fails_rebuild_its_outcome(cli: CLI, tb2: Testbed,
                                                                 tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = failing_job(tmp_path, "import os, sys, time\n"
                      "if os.environ['RANK'] == '2':\n"
                      "    sys.exit('boom from rank 2')\n"
                      "time.sleep(120)\n")
    r = cli("up", str(job), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    got = rebuild(r.stdout)
    assert got.status == "failed" and got.exit_code == 1
    assert got.nodes["node2"] == ("failed", 1)
    assert got.nodes["node1"][0] == "stopped"  # the fail-fast's doing
    assert any(e.host == "node2" and e.rank == 2 and "boom from rank 2" in e.text
               for e in got.lines)
    check_matches(cli, got, r.returncode)
    # The error is also said in words, on stderr, by the one handler.
    assert f"run {got.run_id} failed" in r.stderr
    # `fleet logs --json` of the ended run: its lines as events too, and with -f its verdict.
    logs = cli("logs", got.run_id, "-f", "--json")
    assert logs.returncode == 1, logs.stdout + logs.stderr
    after = rebuild(logs.stdout)
    assert (after.status, after.exit_code, after.told) == (got.status, 1, got.nodes)
    assert after.run_id == got.run_id
    assert any("boom from rank 2" in e.text and e.rank == 2 for e in after.lines)
