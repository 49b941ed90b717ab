"""The run's typed events: every type round-trips through its JSON object, the JSON-lines view
writes one object a line and nothing else, the console renders them with the words it always
printed, and a command's session ends a JSON stream with its error."""

from __future__ import annotations

import io
import json
import threading
from dataclasses import fields

import pytest

from fleet import events as ev
from fleet.console import Console, Meaning
from fleet.errors import ExitCode, Interrupted, JobFailed
from fleet.lifecycle.session import Session
from fleet.run.jsonl import JsonLines, read, status_json
from fleet.states import NodeOutcome, NodeStatus, RunStatus

FAILED = NodeOutcome("n2", 1, NodeStatus.FAILED, 1, "", "", 12)
STOPPED = NodeOutcome("n1", 0, NodeStatus.STOPPED, 143, "fail-fast: n2 failed", "", None)

ONE_OF_EACH: list[ev.Event] = [
    ev.Phase(ev.Step.UPLOADING, "r1", "n1"),
    ev.NodeStarted("n1", 0, (0, 1), 4242, True),
    ev.NodeEnded(FAILED),
    ev.Quiet(12.5),
    ev.Attempt(2, 3, 1.5, "n2 failed"),
    ev.Transfer("n1", "code", 3, 1024, 7, 0.25),
    ev.Line("n2", 2, "boom \x1b[31m\r", "n2 r2", 1),
    ev.Note("stopping the job on 2 node(s)", ev.Tone.WARN, "n1"),
    ev.Verdict("r1", RunStatus.FAILED, 1, (STOPPED, FAILED), "run r1 failed"),
    ev.Error("run r1 failed", 1),
    ev.Stopping(3, 4, "n2", ev.Ending.TORCHRUN_WORKERS, 2.0),
    ev.Straggler(1, "n2", 1.52, 0.38, "all_reduce()", "rank 1 (n2) is the straggler: the "
                 "others wait for it in all_reduce() 38% of the time"),
]


def test_every_event_type_is_in_the_schema_once() -> None:
    assert {type(e) for e in ONE_OF_EACH} == set(ev.TYPES.values())
    assert len(ev.NAMES) == len(ev.TYPES)


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: ev.NAMES[type(e)])
def test_every_event_round_trips_through_json(event: ev.Event) -> None:
    d = ev.as_json(event)
    assert d["v"] == ev.SCHEMA and d["event"] == ev.NAMES[type(event)]
    text = json.dumps(d)  # plain JSON: no enum, no tuple, no dataclass left in it
    assert ev.from_json(json.loads(text)) == event


def test_fields_are_flat_and_named_as_documented() -> None:
    """docs/EVENTS.md names every field of every type: a field added or renamed here without
    it fails."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "EVENTS.md").read_text()
    for name, kind in ev.TYPES.items():
        assert f"`{name}`" in doc, name
        names = ["host", "node_rank", "status", "exit_code", "detail", "own_failure", "elapsed"] \
            if kind is ev.NodeEnded else [f.name for f in fields(kind)]
        for f in names:
            assert f"`{f}`" in doc, (name, f)
    assert f"`v`: {ev.SCHEMA}" in doc


def test_node_ended_is_flat() -> None:
    d = ev.as_json(ev.NodeEnded(FAILED))
    assert d == {"v": ev.SCHEMA, "event": "node_ended", "host": "n2", "node_rank": 1,
                 "status": "failed", "exit_code": 1, "detail": "", "own_failure": "",
                 "elapsed": 12}


def test_from_json_refuses_another_schema_or_type() -> None:
    with pytest.raises(ValueError):
        ev.from_json({"v": ev.SCHEMA + 1, "event": "note", "words": "x"})
    with pytest.raises(ValueError):
        ev.from_json({"v": ev.SCHEMA, "event": "nonsense"})


def test_json_lines_one_object_a_line_whole_across_threads() -> None:
    out = io.StringIO()
    sink = JsonLines(out)

    def many() -> None:
        for _ in range(200):
            for e in ONE_OF_EACH:
                sink.emit(e)

    threads = [threading.Thread(target=many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 * 200 * len(ONE_OF_EACH)
    assert read(out.getvalue())[: len(ONE_OF_EACH)] == ONE_OF_EACH


def test_console_with_a_sink_prints_nothing_and_sends_every_word_as_an_event() -> None:
    out, err = io.StringIO(), io.StringIO()
    got = ev.Collected()
    c = Console(out, err, color=False, live=True, sink=got)
    assert not c.live  # no spinner on a JSON stream
    c.info("restart soon", Meaning.WARN)
    c.phase("n1", "code: shared")
    c.lines(0, [("n1 r0", "hello\r"), ("n1", "torchrun says")], "n1", [0, None])
    c.emit("a table")
    c.redraw("50%")
    with c.waiting("waiting"):
        pass
    assert out.getvalue() == err.getvalue() == ""
    assert got.events == [ev.Note("restart soon", ev.Tone.WARN), ev.Note("code: shared", host="n1"),
                          ev.Line("n1", 0, "hello", "n1 r0", 0),
                          ev.Line("n1", None, "torchrun says", "n1", 0), ev.Note("a table")]


def test_the_terminal_renders_events_with_the_words_it_always_printed() -> None:
    out, err = io.StringIO(), io.StringIO()
    c = Console(out, err, color=False, live=False)
    c.hosts(["n1", "node2"])
    for e in ONE_OF_EACH:
        c.event(e)
    c.event(ev.NodeStarted("node2", 1, (), 77))
    c.event(ev.Verdict("r2", RunStatus.SUCCEEDED, 0, (), "run r2 succeeded on all 2 node(s)"))
    c.event(ev.Verdict("r3", RunStatus.RUNNING, 0, (), "run r3 started; follow it"))
    assert err.getvalue().splitlines() == [
        "fleet: n1     started master (pid 4242)",
        "fleet: restart: attempt 2/3 in 1.5s (n2 failed)",
        "fleet: n1     code: sent 3 file(s), 1 KiB (7 unchanged, 0.25s)",
        "fleet: n1     stopping the job on 2 node(s)",
        "fleet: straggler: rank 1 (n2) is the straggler: the others wait for it in all_reduce() "
        "38% of the time",
        "fleet: node2  started (pid 77)",
        "fleet: run r2 succeeded on all 2 node(s)",
        "fleet: run r3 started; follow it",
    ]  # a Phase, a node's end, the clock, a failed verdict and the error say nothing here
    assert out.getvalue() == "n2 r2 | boom ^[[31m\n"  # made harmless, the CR of a CRLF gone


def test_a_session_ends_a_json_stream_with_the_error_and_its_exit_code() -> None:
    got = ev.Collected()
    with pytest.raises(JobFailed), Session(Console(sink=got), got):
        raise JobFailed("run r1 failed", exit_code=3)
    with pytest.raises(Interrupted), Session(Console(sink=got), got):
        raise Interrupted("SIGINT", "the job was stopped on every node")
    with pytest.raises(KeyError), Session(Console(sink=got), got):
        raise KeyError("x")
    assert got.events[0] == ev.Error("run r1 failed", 3)
    assert got.events[1] == ev.Error(str(Interrupted("SIGINT", "the job was stopped on every "
                                                     "node")), int(ExitCode.INTERRUPTED))
    assert isinstance(got.events[2], ev.Error) and got.events[2].exit_code == ExitCode.INTERNAL
    terminal = Session(Console(io.StringIO(), io.StringIO()))
    with pytest.raises(JobFailed), terminal:  # the terminal's words come from the handler
        raise JobFailed("x")


def test_status_json_gives_each_node_as_kept() -> None:
    d = status_json("r1", RunStatus.FAILED, [("n1", 0, STOPPED), ("n2", 1, FAILED),
                                              ("n3", 2, None)], ["run r1 ...: failed"])
    assert d["v"] == ev.SCHEMA and d["status"] == "failed" and d["exit_code"] == 1
    assert [(n["host"], n["status"], n["exit_code"]) for n in d["nodes"]] == [
        ("n1", "stopped", 143), ("n2", "failed", 1), ("n3", None, None)]
