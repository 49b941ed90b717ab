"""What a stop says while it waits: stop.sh's `ending=` lines parsed as untrusted input, the
summary of several nodes as typed events, and the words the terminal draws from them (the
spinner's line, never a line of its own; --json gets the event)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import events as ev
from fleet import phrases
from fleet.backends.hosts import node as remote
from fleet.config.inventory import Host
from fleet.console import Console
from fleet.facts.stopping import StillEnding, parse_ending
from fleet.run.stopping import StopProgress
from fleet.states import NodeStatus
from fleet.transport import open_transport
from tests.unit.test_lifecycle import _rendered_node


def test_an_ending_line_parses_to_what_is_still_alive() -> None:
    still = parse_ending("ending=2050 torchrun=1 workers=2 wrapper=1 other=0")
    assert still == StillEnding(2.05, 1, 2, True, 0)
    assert still.what is ev.Ending.TORCHRUN_WORKERS


@pytest.mark.parametrize("line", [
    "", "ending=", "ending=50 torchrun=1", "ending=-5 torchrun=1 workers=0 wrapper=0 other=0",
    "ending=50 torchrun=1 workers=0 wrapper=2 other=0",  # a wrapper is one or none
    "ending=50 torchrun=x workers=0 wrapper=0 other=0",
    "ending=50 torchrun=1 workers=0 wrapper=0 other=0 alive",  # more than the line says
    "left=12 ending=50 torchrun=1 workers=0 wrapper=0 other=0",
    "ending=9999999999 torchrun=1 workers=0 wrapper=0 other=0",  # no such wait
    "ending=50 torchrun=0 workers=0 wrapper=0 other=0",  # nothing alive: nothing to name
    "ending=50 torchrun=1 workers=0 wrapper=0 other=0\nleft=",
    "ending=\u0665\u0660 torchrun=1 workers=0 wrapper=0 other=0",  # digits, but not 0-9
])
def test_anything_else_a_node_prints_is_no_ending(line: str) -> None:
    assert parse_ending(line) is None


@pytest.mark.parametrize(("still", "what"), [
    (StillEnding(1, 1, 0, True, 0), ev.Ending.TORCHRUN),
    (StillEnding(1, 0, 3, True, 0), ev.Ending.WORKERS),
    (StillEnding(1, 0, 0, True, 2), ev.Ending.OTHER),
    (StillEnding(1, 0, 0, True, 0), ev.Ending.WRAPPER),
])
def test_the_one_thing_a_node_waits_for(still: StillEnding, what: ev.Ending) -> None:
    assert still.what is what


def test_the_summary_names_the_node_waited_for_longest_and_changes_only_when_its_words_do(
        ) -> None:
    got: list[ev.Stopping] = []
    p = StopProgress(["n1", "n2", "n3", "n4"], got.append)
    p.heard("n1", None)
    p.heard("n2", StillEnding(0.5, 1, 1, True, 0))
    p.heard("n3", StillEnding(0.5, 0, 0, True, 0))  # as long: the later name
    p.heard("n2", StillEnding(0.9, 1, 1, True, 0))
    p.heard("n2", StillEnding(0.95, 1, 1, True, 0))  # the same words: no event
    p.heard("n9", None)  # not a node of this stop
    p.heard("n2", StillEnding(2.0, 1, 0, True, 0))
    p.heard("n3", None)
    p.heard("n2", None)
    assert got == [ev.Stopping(1, 4),
                   ev.Stopping(1, 4, "n2", ev.Ending.TORCHRUN_WORKERS, 0.0),
                   ev.Stopping(1, 4, "n3", ev.Ending.WRAPPER, 0.0),
                   ev.Stopping(1, 4, "n2", ev.Ending.TORCHRUN_WORKERS, 0.0),
                   ev.Stopping(1, 4, "n2", ev.Ending.TORCHRUN, 2.0),
                   ev.Stopping(2, 4, "n2", ev.Ending.TORCHRUN, 2.0),
                   ev.Stopping(3, 4)]
    assert p.summary() == ev.Stopping(3, 4)


def test_the_words_say_what_the_stop_waits_for() -> None:
    assert phrases.wait_words(ev.Stopping(3, 4, "node2", ev.Ending.TORCHRUN_WORKERS, 2.0)) == (
        "stopping: 3/4 nodes done; node2: torchrun still ending its workers (SIGTERM 2 s ago)")
    assert phrases.wait_words(ev.Stopping(0, 2, "n1", ev.Ending.WORKERS, 1.0, 3)) == (
        "stopping: 0/2 nodes done; n1: 3 worker(s) still ending (SIGTERM 1 s ago)")
    assert phrases.wait_words(ev.Stopping(1, 2)) == "stopping: 1/2 nodes done"
    assert phrases.wait_words(ev.Note("x")) is None


def test_a_terminal_draws_it_as_the_waits_line_and_json_gets_the_event() -> None:
    err = io.StringIO()
    console = Console(out=io.StringIO(), err=err, color=False, live=True)
    with console.waiting("stopping: 0/2 nodes done") as wait:
        console.event(ev.Stopping(1, 2, "n2", ev.Ending.WRAPPER, 1.0))
        assert wait.text == ("stopping: 1/2 nodes done; n2: run.sh recording how torchrun ended "
                             "(SIGTERM 1 s ago)")
    assert "fleet:" not in err.getvalue()  # never a line of its own
    sink = ev.Collected()
    Console(out=io.StringIO(), err=io.StringIO(), sink=sink).event(ev.Stopping(1, 2))
    assert sink.events == [ev.Stopping(1, 2)]


SLOW = """
import os, signal, time
def end(*a):
    time.sleep(4)
    os._exit(143)
signal.signal(signal.SIGTERM, end)
print("ready", flush=True)
time.sleep(30)
"""


def test_stop_sh_says_what_is_still_ending_and_still_leaves_nothing(tmp_path: Path) -> None:
    """A process that takes 4 s to end after SIGTERM: stop.sh, waiting on it without searching
    /proc every tick, says so (a line the parser takes) and ends once it is gone."""
    node = _rendered_node(tmp_path, (sys.executable, "-c", SLOW), "j-slow")
    run_dir = Path(node.run_dir)
    log = open(run_dir / "node.log", "w")  # noqa: SIM115
    wrapper = subprocess.Popen(["sh", "run.sh"], cwd=run_dir, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "FLEET_RUN_ID": "j-slow"})
    try:
        deadline = time.monotonic() + 20
        while "ready" not in (run_dir / "node.log").read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.01)
        heard: list[StillEnding] = []
        host = Host(name="local", address="localhost", transport="local")
        with open_transport(host) as t:
            # As `fleet stop` does: what is still ending as it is said, and the state after.
            stopped = remote.stop(t, str(run_dir), "fleet stop", "k", on_ending=heard.append,
                                  with_state=True)
        assert heard
        assert heard[-1].since >= 1 and heard[0].what in (ev.Ending.OTHER, ev.Ending.WRAPPER)
        assert stopped.left == [] and stopped.found
        assert stopped.state is not None and stopped.state.done
        assert stopped.state.status is NodeStatus.STOPPED
        assert stopped.state.stopped_by == "fleet stop"
        assert wrapper.wait(timeout=20) == 143
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait(timeout=10)
        log.close()


DEAF = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def test_stop_sh_kills_after_its_grace_though_fleet_stopped_listening(tmp_path: Path) -> None:
    """fleet gone mid-stop (Ctrl-C, a dropped link: stop.sh's output has no reader): stop.sh
    goes on to its KILL of a process that ignores SIGTERM, instead of dying of SIGPIPE at its
    next progress line and leaving it running."""
    node = _rendered_node(tmp_path, (sys.executable, "-c", DEAF), "j-deaf", grace=2)
    run_dir = Path(node.run_dir)
    log = open(run_dir / "node.log", "w")  # noqa: SIM115
    wrapper = subprocess.Popen(["sh", "run.sh"], cwd=run_dir, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "FLEET_RUN_ID": "j-deaf"})
    stop = None
    try:
        deadline = time.monotonic() + 20
        while "ready" not in (run_dir / "node.log").read_text():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.01)
        stop = subprocess.Popen(["sh", "-c", remote.stop_script(str(run_dir), "fleet stop", "k")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        assert stop.stdout is not None
        while not stop.stdout.readline().startswith(b"ending="):  # it waits on the deaf one
            assert time.monotonic() < deadline, "no progress line"
        stop.stdout.close()  # fleet is gone
        assert wrapper.wait(timeout=30) != 0  # KILLed after the grace: the job is over
        assert stop.wait(timeout=10) is not None
    finally:
        for p in (wrapper, stop):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        log.close()
