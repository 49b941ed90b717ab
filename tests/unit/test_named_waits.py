"""Waits that name the host they wait for, and words said once for many hosts: the rendezvous'
nodes not joined yet, the host still running `fleet exec`'s command, the host slow to answer
`fleet gpus` or a lease, a node slow to connect to or to record a stop; and the same error or
end said once, naming the hosts, also where each host's words name the host itself."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleet import events as ev
from fleet.backends.hosts import backend as hosts_backend
from fleet.backends.hosts import execute as fleet_exec
from fleet.backends.hosts import gpus, node, recorded
from fleet.backends.hosts.events import Joining, joining_words
from fleet.config.inventory import Host, Inventory
from fleet.config.select import Selection
from fleet.console import Console
from fleet.errors import FleetError, NotEveryNode, TransportError, once, said_once
from fleet.facts.leases import LeaseOrder
from fleet.facts.stopping import StillEnding, StopStep
from fleet.phrases import wait_words
from fleet.run.stopping import StopProgress
from fleet.waits import Pending, shown_by
from tests.unit.test_waits import Clock, Tty


# ---- said once ---------------------------------------------------------------------------------
def test_words_that_differ_only_in_the_hosts_own_name_are_said_once() -> None:
    full = "cannot write /w/f on {}: 0 bytes of 1 MiB arrived; the disk or your quota is full"
    said = {"node1": full.format("node1"), "node3": "node3: " + full.format("node3"),
            "node10": full.format("node1"),  # another host's name: its own words
            "node2": "cannot write /w/g on node2: 0 bytes of 1 MiB arrived"}
    assert said_once(said) == [
        (["node1", "node3"], full.format("each host")),
        (["node10"], full.format("node1")),
        (["node2"], "cannot write /w/g on node2: 0 bytes of 1 MiB arrived")]
    # one host alone keeps its words as they were
    assert said_once({"node3": full.format("node3")}) == [(["node3"], full.format("node3"))]
    # a `host: ` inside the words (an error's own) is said of several hosts as nothing
    assert once({"n3": "could not stop: n3: refused", "n4": "could not stop: n4: refused"}) \
        == ["n3, n4: could not stop: refused"]


def test_words_said_once_never_merge_what_differs_otherwise() -> None:
    # each names the other: not the same words
    assert len(said_once({"a": "no route to b", "b": "no route to a"})) == 2
    # a name inside a longer one is not the host's name
    assert len(said_once({"n1": "n1x is down", "n2": "n2 is down"})) == 2
    # words that hold the placeholder itself are compared as they are
    odd = "\x00host\x00 on n1"
    assert said_once({"n1": odd, "n2": "\x00host\x00 on n2"}) == [(["n1"], odd),
                                                                  (["n2"], "\x00host\x00 on n2")]
    assert once({"n1": "stopped", "n2": "stopped", "n3": "lost"}) == ["n1, n2: stopped",
                                                                      "n3: lost"]


def test_the_console_says_the_same_words_once_naming_the_hosts() -> None:
    err = io.StringIO()
    console = Console(out=io.StringIO(), err=err, color=False, live=False)
    console.phases({"n1": "warning: torch 2.1 here", "n2": "warning: torch 2.1 here",
                    "n3": "warning: no GPU"})
    assert err.getvalue().splitlines() == ["fleet: n1, n2  warning: torch 2.1 here",
                                           "fleet: n3  warning: no GPU"]


def test_to_a_json_sink_each_host_is_a_note_of_its_own() -> None:
    got = ev.Collected()
    Console(out=io.StringIO(), err=io.StringIO(), sink=got).phases({"n1": "stopped",
                                                                     "n2": "stopped"})
    assert got.events == [ev.Note("stopped", host="n1"), ev.Note("stopped", host="n2")]


def test_fleet_stop_says_each_end_once_naming_the_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["n1", "n2", "n3", "n4"]
    rec = SimpleNamespace(run_id="r1", nodes=[SimpleNamespace(host=SimpleNamespace(name=n))
                                              for n in names])
    results = {"n1": node.Stopped([]), "n2": node.Stopped([]),
               "n3": TransportError("n3: connection refused"),
               "n4": TransportError("n4: connection refused")}
    monkeypatch.setattr(recorded, "stop_recorded", lambda *a, **k: results)
    err = io.StringIO()
    console = Console(out=io.StringIO(), err=err, color=False, live=False)
    with pytest.raises(NotEveryNode, match="on 2 node"):
        hosts_backend.HostsBackend().cancel(rec, console)  # type: ignore[arg-type]
    lines = [line.removeprefix("fleet: ") for line in err.getvalue().splitlines()]
    assert lines == ["n3, n4  could not stop: connection refused; the run may still be running "
                     "there: run `fleet stop r1` again once it answers",
                     "n1, n2  stopped (nothing of the run left that fleet can find: by run id, "
                     "session or descent)"], lines


# ---- the rendezvous ----------------------------------------------------------------------------
def test_the_rendezvous_names_the_nodes_not_joined_once_it_is_slow() -> None:
    assert joining_words(2, 4, "workers", ["node2"], 0.5) == "workers joining: 2/4"
    assert (joining_words(2, 4, "workers", ["node2"], 3.2)
            == "workers joining: 2/4; node2 not yet (3 s)")
    assert (joining_words(1, 4, "nodes", ["b", "c", "d"], 2)
            == "nodes joining: 1/4; b, c and 1 more not yet (2 s)")
    assert (joining_words(0, 4, "workers", ["a", "b"], 5)
            == "workers joining: 0/4; no node's workers have started yet (5 s)")
    assert joining_words(4, 4, "workers", [], 9).startswith("workers joined: 4/4")


def test_the_joining_spinner_names_the_node_that_has_not_joined(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    err, clock = Tty(), Clock()
    console = Console(out=io.StringIO(), err=err, color=False, live=True)
    joining = Joining(console, {"node1": 2, "node2": 2, "node3": 2}, clock)
    try:
        joining.show({"node1": 2, "node3": 2})
        assert joining.words() == "workers joining: 4/6"
        clock.now += 2
        joining.show({"node2": 1})  # one of its two workers: not joined yet
        assert err.getvalue().endswith("workers joining: 5/6; node2 not yet (2 s)")
    finally:
        joining.end()
    # where a node's count is its own ("auto"), a node is joined once any worker of it is
    auto = Joining(console, {"node1": 2, "node2": "auto", "node3": "auto"}, clock)
    auto.show({"node1": 1, "node2": 3})
    clock.now += 2
    assert auto.words() == "nodes joining: 2/3; node3 not yet (2 s)"
    auto.end()


# ---- waits announced below a command -----------------------------------------------------------
class Drawn:
    """A command's drawer (fleet.waits.shown_by) on a clock of the test's."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.pending = clock, list[Pending]()

    @contextlib.contextmanager
    def __call__(self, what: str, hosts: Iterable[str]) -> Iterator[Pending]:
        p = Pending(what, hosts, self.clock)
        self.pending.append(p)
        yield p


def _after_the_others(p: Pending, others: int) -> None:
    deadline = time.monotonic() + 10
    while p.done < others and time.monotonic() < deadline:
        time.sleep(0.01)


class FakeT:
    """A connection whose command fails at once, but on the slow host only after the others
    are done and 3 s of the test's clock: what the wait says then is kept."""

    def __init__(self, host: Host, slow: str, drawn: Drawn, said: list[str]) -> None:
        self.host, self.slow, self.drawn, self.said = host, slow, drawn, said

    def __enter__(self) -> FakeT:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass

    def look(self) -> None:
        if self.host.name == self.slow:
            p = self.drawn.pending[-1]
            _after_the_others(p, len(p.hosts) - 1)
            self.drawn.clock.now += 3
            self.said.append(p.words())
        raise FleetError("not asked in this test")

    def run(self, *a: Any, **k: Any) -> None:
        self.look()


INV = Inventory(Path("inv.toml"), (Host("n1", "127.0.0.1"), Host("n2", "127.0.0.2")))


def test_exec_names_the_host_still_running_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn, said = Drawn(Clock()), list[str]()
    monkeypatch.setattr(fleet_exec, "open_transport",
                        lambda h, hello: FakeT(h, "n2", drawn, said))
    with shown_by(drawn):
        out = fleet_exec.execute(INV, None, ["sleep", "30"], Selection(), None)
    assert set(out) == {"n1", "n2"} and all(isinstance(o, FleetError) for o in out.values())
    assert said == ["waiting: the command 1/2 hosts done; n2 still on `sleep 30` (3 s)"]
    assert drawn.pending[0].done == 2
    assert fleet_exec.doing(["x" * 60]) == "`" + "x" * 37 + "...`"


def test_gpus_and_a_lease_name_the_slow_host(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn, said = Drawn(Clock()), list[str]()
    monkeypatch.setattr(gpus, "open_transport", lambda h: FakeT(h, "n2", drawn, said))
    monkeypatch.setattr(gpus, "gpu_facts", lambda t: t.look())
    with shown_by(drawn):
        found = gpus.Survey(list(INV.hosts)).look()
        assert found == {"n1": "not asked in this test", "n2": "not asked in this test"}
        with pytest.raises(FleetError):
            gpus.lease(INV.hosts[1], LeaseOrder.give(None))
    assert said == ["waiting: the GPUs 1/2 hosts done; n2 still on nvidia-smi and its leases "
                    "(3 s)", "waiting: the lease; n2 still on its lease file (3 s)"]


# ---- a stop --------------------------------------------------------------------------------
def test_a_node_slow_to_connect_or_record_its_stop_is_named_after_a_second() -> None:
    clock, got = Clock(), list[ev.Stopping]()
    p = StopProgress(["n1", "n2", "n3"], got.append, clock)
    for n in ("n1", "n2", "n3"):
        p.heard(n, ev.Ending.CONNECTING)
    p.heard("n1", ev.Ending.RECORDING)
    p.heard("n1", None)
    clock.now += 0.5
    p.tick()  # under a second: counted, not named
    clock.now += 1.7
    p.heard("n2", ev.Ending.RECORDING)
    p.tick()
    assert got == [ev.Stopping(0, 3), ev.Stopping(1, 3),
                   ev.Stopping(1, 3, "n3", ev.Ending.CONNECTING, 2.0)]
    assert wait_words(got[-1]) == "stopping: 1/3 nodes done; n3: connecting (2 s)"
    clock.now += 0.5
    p.heard("n3", ev.Ending.RECORDING)
    clock.now += 1
    p.tick()
    assert wait_words(got[-1]) == "stopping: 1/3 nodes done; n2: recording the stop (1 s)"
    # stop.sh's own words, as before, once it speaks
    p.heard("n2", StillEnding(4.0, 1, 2, True, 0))
    assert wait_words(got[-1]) == ("stopping: 1/3 nodes done; n2: torchrun still ending its "
                                   "workers (SIGTERM 4 s ago)")
    p.heard("n2", None)
    p.heard("n3", None)
    assert got[-1] == ev.Stopping(3, 3)


def test_held_the_stop_looks_again_as_the_seconds_go() -> None:
    clock, got = Clock(), list[ev.Stopping]()
    with StopProgress(["n1"], got.append, clock) as p:
        p.heard("n1", ev.Ending.CONNECTING)
        clock.now += 3
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert got[-1] == ev.Stopping(0, 1, "n1", ev.Ending.CONNECTING, 3.0)
    assert not (p._ticker and p._ticker.is_alive())


def test_each_node_is_heard_through_fleets_own_steps_then_stop_sh(
        monkeypatch: pytest.MonkeyPatch) -> None:
    heard: dict[str, list[StopStep | None]] = {}
    lock = threading.Lock()

    def hear(name: str, what: StopStep | None) -> None:
        with lock:
            heard.setdefault(name, []).append(what)

    ending = StillEnding(0.5, 1, 0, True, 0)

    def stop(t: object, run_dir: str, by: str, key: str, wrapper: object,
             on: Any, with_state: bool) -> node.Stopped:
        on(ending)
        return node.Stopped([])

    monkeypatch.setattr(node, "mark", lambda *a: None)
    monkeypatch.setattr(node, "stop", stop)

    @contextlib.contextmanager
    def target() -> Iterator[tuple[Any, str, str, None]]:
        yield object(), "/r", "k", None

    results = node.stop_together([(n, target) for n in ("n1", "n2")], "test", hear)
    assert all(isinstance(r, node.Stopped) for r in results.values())
    steps: list[StopStep | None] = [ev.Ending.CONNECTING, ev.Ending.RECORDING,
                                    ev.Ending.SIGNALLING, ending, None]
    assert heard == {"n1": steps, "n2": steps}


def test_a_lost_nodes_stop_on_a_fresh_connection_is_a_wait_named_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.backends.hosts import stop as hosts_stop

    clock, got = Clock(), list[ev.Stopping]()
    p = StopProgress(["n1", "n2"], got.append, clock)
    p.heard("n2", None)
    monkeypatch.setattr(hosts_stop, "stop_afresh", lambda *a: node.Stopped([]))
    n1 = SimpleNamespace(host=SimpleNamespace(name="n1"), run_dir="/r")
    said: list[StopStep | None] = []

    def hear(name: str, what: StopStep | None) -> None:
        said.append(what)
        p.heard(name, what)
        if what is ev.Ending.CONNECTING:
            clock.now += 4
            p.tick()

    console = Console(out=io.StringIO(), err=io.StringIO(), color=False, live=False)
    problems = hosts_stop.stop_nodes(
        SimpleNamespace(transports={}), [n1], console, "test",  # type: ignore[arg-type]
        lambda n: "k", lambda n: None, {"n1": object()}, {"n1"}, 5.0,  # type: ignore[dict-item]
        hear)
    assert problems == {} and said == [ev.Ending.CONNECTING, None]
    assert ev.Stopping(1, 2, "n1", ev.Ending.CONNECTING, 4.0) in got
    assert got[-1] == ev.Stopping(2, 2)
    p.heard("n1", ev.Ending.CONNECTING)  # tried again once done: not done any more
    assert p.summary() == ev.Stopping(1, 2)


def test_the_very_same_words_naming_both_ends_are_said_once_as_they_are() -> None:
    """Both ends of a stalled relay link say the same words, each naming both hosts: one line,
    the names kept (not `each host`, which would blur which end is which)."""
    words = ("the relay link node1 -> node2 stalled: node1 says it waited 20s to pass data on "
             "to node2; node2 placed none meanwhile")
    assert said_once({"node1": words, "node2": words, "node3": "no answer"}) == [
        (["node1", "node2"], words), (["node3"], "no answer")]
    assert said_once({"node1": f"node1: {words}", "node2": f"node2: {words}"}) == [
        (["node1", "node2"], words)]
