"""A queue agent's book (fleet/nodeside/queue_agent.py, the parser in
fleet/nodeside/shared/queue_files.py): what it waits on is written down as it starts a run and
forgotten once the runner heard the run's end; a new agent on the host adopts what the one
before it left, waiting again on a run still alive (with its lease) and saying the end of one
that ended meanwhile; the book is read as any host file is, and the runner forgets an end that
is no longer news."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from fleet.nodeside import queue_agent, queue_runner
from fleet.nodeside.shared.nodemap import run_dir
from fleet.nodeside.shared.queue_files import parse_book
from fleet.nodeside.shared.queue_rules import spec_json
from tests.unit.test_queue_rules import FakeLink, hello, spec

GOOD = {"gpus": [1], "pid": 4242, "start": 99, "t0": 10.5, "lease": "a.lease",
        "metrics": {"loss": "loss (?P<v>[0-9.]+)"}}


def test_a_book_reads_back_and_what_does_not_parse_is_left_out() -> None:
    bad = [{**GOOD, "pid": "4242"}, {**GOOD, "pid": -1}, {**GOOD, "pid": True},
           {**GOOD, "gpus": [1, 1]}, {**GOOD, "t0": "soon"}, {**GOOD, "t0": float("nan")},
           {**GOOD, "t0": True}, {**GOOD, "metrics": []},
           {**GOOD, "metrics": {"loss": 1}}, {k: v for k, v in GOOD.items() if k != "lease"}, "run"]
    book = {"sw-1": GOOD, "../etc": GOOD, **{f"sw-b{i}": e for i, e in enumerate(bad)}}
    assert parse_book(json.dumps(book)) == {"sw-1": GOOD}
    assert parse_book("[1]") == parse_book("{") == {}


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[19])


def test_a_new_agent_adopts_what_the_one_before_it_waited_on(tmp_path: Path) -> None:
    work, q = tmp_path / "work", tmp_path / "queue"
    q.mkdir()
    live = subprocess.Popen(["sleep", "30"])
    try:
        old = queue_agent.Agent(str(q), "a", str(work), str(tmp_path / "leases"), None)
        for run in ("sw-1", "sw-2"):
            os.makedirs(run_dir(str(work), run, "a"))
        old.leases["sw-1"] = "x.lease"
        old.keep("sw-1", {**GOOD, "pid": live.pid, "start": start_time(live.pid),
                          "lease": "x.lease", "t0": time.time()})
        old.keep("sw-2", {**GOOD, "gpus": [0], "pid": 1 << 40, "t0": time.time() - 5})
        Path(run_dir(str(work), "sw-2", "a"), "exit_code").write_text("3\n")
        assert (q / "agent-a.runs.json").stat().st_mode & 0o777 == 0o600
        new = queue_agent.Agent(str(q), "a", str(work), str(tmp_path / "leases"), None)
        new.adopt()
        deadline = time.monotonic() + 10
        while "sw-2" not in new.ends:
            assert time.monotonic() < deadline, new.ends
            time.sleep(0.05)
        assert new.running == {"sw-1": (1,)} and new.leases == {"sw-1": "x.lease"}
        assert new.ends["sw-2"]["code"] == 3 and new.ended_on["sw-2"] == (0,)
        assert set(new.report()["running"]) == {"sw-1", "sw-2"}
        new.heard(FakeLink(), "ack", {"run": "sw-2"})  # type: ignore[arg-type]
        assert set(parse_book((q / "agent-a.runs.json").read_text())) == {"sw-1"}
    finally:
        live.kill()
        live.wait(timeout=10)


def test_the_runner_forgets_an_end_that_is_no_longer_news(tmp_path: Any) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "sw-1.json").write_text(spec_json(spec("sw-1", hosts=("a",))))
    r = queue_runner.Runner(str(tmp_path), b"k" * 64)
    r.scan()
    link = FakeLink()
    hello(r, link, "a", [])
    r.heard(link, "ended", {"run": "sw-1", "code": 0, "started": 1.0, "ended": 2.0,
                            "metrics": {}, "stopped": False})  # type: ignore[arg-type]
    assert r.runs["sw-1"]["state"] == "queued"  # never told to run there: nothing changes
    assert link.told == [("ack", {"run": "sw-1"})]  # and the agent may forget it


def test_an_end_is_said_with_a_beat_at_once_so_its_gpus_are_free_now(tmp_path: Path) -> None:
    """The runner places on the GPUs an agent last called free: the beat after an end says the
    ended run's GPUs are free at once (a GPU waited up to a beat, 2 s, between runs before)."""
    agent = queue_agent.Agent(str(tmp_path), "a", str(tmp_path / "w"), str(tmp_path / "l"), None)
    link: Any = FakeLink()
    now = time.time()
    assert agent.tell(link, now) == now and link.told == []  # nothing new, no beat due
    agent.ends["sw-1"] = {"run": "sw-1", "code": 0, "started": now - 9, "ended": now - 1,
                          "stopped": False, "metrics": {}}
    agent.ended_on["sw-1"] = (2,)
    beat = agent.tell(link, now)
    assert [k for k, _ in link.told] == ["ended", "beat"] and beat >= now
    assert link.told[0][1]["run"] == "sw-1" and "said" not in link.told[0][1]
    assert link.told[1][1]["running"] == {"sw-1": [2]}  # until the runner acknowledges it
    link.told.clear()
    assert agent.tell(link, beat) == beat and link.told == []  # said once
    assert agent.tell(link, beat - queue_agent.BEAT_S) > beat
    assert [k for k, _ in link.told] == ["beat"]  # and the beats go on
