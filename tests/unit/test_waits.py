"""What fleet waits for, said on a terminal: the count of hosts done, and once a wait is slow
(over a second) the hosts not done and what they are on; drawn only where a person watches."""

from __future__ import annotations

import contextlib
import io
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from fleet.backends.hosts import check
from fleet.console import Console
from fleet.transport.group import each
from fleet.waits import Pending, named, over, shown_by, slow_words


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_words_count_first_then_name_the_slowest_hosts() -> None:
    assert slow_words("probe", 4, 3, [("node2", "", 0.5)], 0.5) == "waiting: probe 3/4 hosts done"
    assert (slow_words("probe", 4, 3, [("node2", "", 2.4)], 2.4)
            == "waiting: probe 3/4 hosts done; node2 still answering (2 s)")
    assert (slow_words("check", 3, 0, [("a", "the probe", 3), ("b", "the GPU query", 9),
                                       ("c", "", 1)], 9)
            == "waiting: check 0/3 hosts done; b still on the GPU query (9 s), a still on the "
               "probe (3 s) and 1 more")
    assert slow_words("rm", 1, 0, [("n1", "", 5)], 5) == "waiting: rm; n1 still answering (5 s)"
    assert slow_words("probe", 2, 2, [], 7) == "waiting: probe 2/2 hosts done"


def test_pending_tracks_each_host_and_its_step_with_its_own_clock() -> None:
    clock = Clock()
    p = Pending("check", ["node1", "node2", "node3"], clock)
    told: list[str] = []
    p.changed = lambda: told.append(p.words())
    p.start("node2", "the probe")
    p.finish("node1")
    clock.now += 0.5
    assert p.words() == "waiting: check 1/3 hosts done"
    clock.now += 3
    p.start("node3", "the write test")
    clock.now += 1
    assert p.words() == ("waiting: check 1/3 hosts done; node2 still on the probe (4 s), "
                         "node3 still on the write test (1 s)")
    p.finish("node2")
    p.start("node2", "late")  # a host done stays done
    assert p.done == 2 and "node2" not in p.words()
    assert told[0] == "waiting: check 0/3 hosts done" and len(told) == 5
    p.again("node2", "the look at node1's copy")  # ... unless it is on another part again
    clock.now += 2
    assert p.done == 1 and "node2 still on the look at node1's copy (2 s)" in p.words()


def test_a_fanout_finishes_each_host_however_its_call_ends() -> None:
    p = Pending("probe", ["a", "b"])

    def one(x: int) -> int:
        if x == 2:
            raise RuntimeError("boom")
        return x
    out = each(named([("a", 1), ("b", 2)]), p.tracked(one))
    assert out["a"] == 1 and isinstance(out["b"], RuntimeError) and p.done == 2


def test_a_wait_on_hosts_is_drawn_on_a_terminal_and_redrawn_as_seconds_go(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    err = Tty()
    console = Console(out=io.StringIO(), err=err, color=False, live=True)
    with console.hosts_waiting("probe", ["node1", "node2"]) as p:
        p.finish("node1")
        p.t0 -= 5  # as if it had waited 5 s: the ticker's next draw names node2
        p._doing["node2"] = ("", p.t0)
        deadline = time.monotonic() + 10
        while "node2 still" not in err.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err.getvalue())
    assert "waiting: probe 1/2 hosts done" in drawn
    assert "waiting: probe 1/2 hosts done; node2 still answering (5 s)" in drawn
    assert err.getvalue().endswith("\r\x1b[K")  # erased once the wait is over


def test_nothing_is_drawn_without_a_person_or_with_json() -> None:
    for console in (Console(out=io.StringIO(), err=io.StringIO()),
                    Console(out=io.StringIO(), err=Tty(), live=True, sink=_Sink())):
        with console.hosts_waiting("probe", ["a"]) as p:
            p.finish("a")
        assert console.err.getvalue() == ""  # type: ignore[attr-defined]


def test_a_wait_on_no_host_says_nothing() -> None:
    err = Tty()
    with Console(out=io.StringIO(), err=err, live=True).hosts_waiting("the report", []):
        pass
    assert err.getvalue() == ""


class _Sink:
    def emit(self, event: object) -> None:
        raise AssertionError("a wait is no event")


def test_the_checks_say_which_check_each_host_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet check`'s progress: a slow host is named with the check it is on (here its
    connection, which never comes), and every host is counted done as its checks end."""
    from fleet.config.inventory import Host, Inventory
    from fleet.config.job import Job

    ticks = iter(range(0, 10_000, 10))  # every look at the clock: 10 s later

    class Slow(Pending):
        def __init__(self, what: str, hosts: list[str]) -> None:
            super().__init__(what, hosts, clock=lambda: float(next(ticks)))

    shown: list[Callable[[], str]] = []
    said: list[str] = []

    def refuse(host: Host, *a: object, **k: object) -> object:
        said.append(shown[0]())  # what a person sees while this host connects
        raise OSError("refused")

    monkeypatch.setattr(check, "Pending", Slow)
    monkeypatch.setattr(check, "open_transport", refuse)
    inv = Inventory(Path("inv.toml"), (Host("n1", "127.0.0.1"),))
    found = check.run_checks(inv, Job.__new__(Job),
                             lambda w: shown.append(w) if callable(w) else None)
    assert [c.host for c in found] == ["n1"] and found[0].status.value == "fail"
    assert re.fullmatch(r"waiting: check; n1 still on the ssh connection \(\d+ s\)", said[0]), said
    assert shown[0]() == "waiting: check"  # done: nothing slow is named


# ---- waits announced below a command, drawn by its console -------------------------------------
def test_a_wait_announced_below_a_command_is_drawn_by_its_console(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    err = Tty()
    console = Console(out=io.StringIO(), err=err, color=False, live=True)
    with over("nobody draws this", ["a"]) as p:  # no command said who draws: nothing drawn
        p.finish("a")
    with shown_by(console.hosts_waiting), over("the state of r", ["n1", "n2"]) as p:
        p.finish("n1")
        deadline = time.monotonic() + 10
        while "the state of r 1/2" not in err.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    with over("after the command", ["a"]):
        pass
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err.getvalue())
    assert "waiting: the state of r 1/2 hosts done" in drawn, drawn
    assert "nobody" not in drawn and "after the command" not in drawn


def test_a_recorded_runs_silent_node_is_named_while_status_waits_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """recorded.ask, as status and ps ask a live run: each node's connection and question are
    the wait's, and the node that does not answer is the one named."""
    from fleet.backends.hosts import recorded
    from fleet.config.inventory import Host
    from fleet.run import record as state

    rec = state.RunRecord("r", "job.toml", 0.0, tuple(
        state.NodeRecord(Host(n, "192.0.2.1"), i, f"/r/{n}", i, 1)
        for i, n in enumerate(("n1", "n2"))))
    released = threading.Event()

    @contextlib.contextmanager
    def transport(host: Host, hello: bool = True) -> Iterator[_T]:
        if host.name == "n2":
            released.wait(10)  # n2 never connects, while the test looks
        yield _T()

    drawn: list[Pending] = []

    @contextlib.contextmanager
    def draw(what: str, hosts: Iterable[str]) -> Iterator[Pending]:
        drawn.append(Pending(what, hosts))
        yield drawn[-1]

    monkeypatch.setattr(recorded, "open_transport", transport)
    monkeypatch.setattr(recorded, "ASK_S", 0.5)
    try:
        with shown_by(draw):
            got = recorded.ask(rec, lambda t, d: d)
    finally:
        released.set()
    assert got["n1"] == "/r/n1" and isinstance(got["n2"], Exception)
    [p] = drawn
    assert p.what == "the state of r" and p.hosts == ["n1", "n2"] and p.done == 1
    p.clock = lambda: p.t0 + 5.5
    assert p.words() == ("waiting: the state of r 1/2 hosts done; n2 still on its connection "
                         "(5 s)")


class _T:
    def path(self, p: str) -> str:
        return p


def test_the_wait_for_the_logs_ends_once_every_node_is_reached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet logs`: the count and the slow node until every node's log is reached, gone as
    the last one is (its lines go on printing with no wait drawn under them)."""
    from fleet.backends.hosts.logs import _Reaching

    monkeypatch.setenv("COLUMNS", "120")
    err = Tty()
    console = Console(out=io.StringIO(), err=err, color=False, live=True)
    reaching = _Reaching(console, ["n1", "n2"])
    with reaching.node("n1"):
        reaching.on("n1", "its run's state")
        reaching.ready("n1")
        assert reaching.wait.words() == "waiting: reaching each node's log 1/2 hosts done"
        reaching.wait.t0 -= 3
        reaching.wait._doing["n2"] = ("its connection", reaching.wait.t0)
        assert "n2 still on its connection (3 s)" in reaching.wait.words()
        assert console._waits
    with pytest.raises(OSError), reaching.node("n2"):
        raise OSError("refused")  # a node that fails is reached too
    assert not console._waits and err.getvalue().endswith("\r\x1b[K")
    reaching.close()  # once only
