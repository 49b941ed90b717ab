"""What a person sees while fleet waits, in its pure parts: how many workers have joined, the
spinner's line (nested waits, a bar in its place, cut to the terminal's width), the transfer
bar where a person watches and where nobody does, and the Slurm queue's spinner."""

from __future__ import annotations

import io
import re

import pytest
from rich.cells import cell_len

from fleet.backends.hosts.events import Joining, joined, joining_words
from fleet.backends.slurm.watch import Announcer
from fleet.console import Console
from fleet.facts import slurm as sj
from fleet.transport.transfer import progress, report

_ESC = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen_lines(text: str) -> list[str]:
    """Every stretch of text a terminal would draw on one line: split at CR and LF, the
    escape sequences (colour, erase) taking no cell."""
    return [_ESC.sub("", part) for part in re.split(r"[\r\n]", text)]


def live(columns: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Console, Tty]:
    monkeypatch.setenv("COLUMNS", str(columns))
    err = Tty()
    return Console(out=io.StringIO(), err=err, color=False, live=True), err


# ---- workers joining -------------------------------------------------------------------------
def test_workers_are_counted_where_every_node_knows_its_process_count() -> None:
    nprocs: dict[str, int | str] = {"node1": 2, "node2": 2, "node3": 2}
    assert joined({}, nprocs) == (0, 6, "workers")
    assert joined({"node1": 2, "node2": 1}, nprocs) == (3, 6, "workers")
    # a node's rank files from torchrun's own restart of its workers count once
    assert joined({"node1": 5, "node2": 2, "node3": 2}, nprocs) == (6, 6, "workers")
    assert joined({"node1": -1}, nprocs) == (0, 6, "workers")


def test_nodes_are_counted_where_a_node_decides_its_process_count() -> None:
    nprocs: dict[str, int | str] = {"node1": "auto", "node2": 2}
    assert joined({}, nprocs) == (0, 2, "nodes")
    assert joined({"node1": 4}, nprocs) == (1, 2, "nodes")
    assert joined({"node1": 4, "node2": 1}, nprocs) == (2, 2, "nodes")


def test_joining_words_say_the_count_then_what_is_waited_for() -> None:
    assert joining_words(4, 6, "workers") == "workers joining: 4/6"
    assert joining_words(6, 6, "workers") == ("workers joined: 6/6; waiting for the job's "
                                              "first line")


def test_the_joining_spinner_counts_then_ends_once(monkeypatch: pytest.MonkeyPatch) -> None:
    console, err = live(80, monkeypatch)
    joining = Joining(console, {"node1": 2, "node2": 2})
    assert err.getvalue().endswith("workers joining: 0/4")
    joining.show({"node1": 2})
    assert joining.full("node1") and not joining.full("node2")
    assert err.getvalue().endswith("workers joining: 2/4")
    joining.show({"node2": 2})
    assert err.getvalue().endswith("workers joined: 4/4; waiting for the job's first line")
    joining.end()
    assert err.getvalue().endswith("\r\x1b[K") and not console._waits
    joining.end()  # the first line, the run's end and the count's own end may each end it
    joining.show({"node1": 2})  # a count that comes late draws nothing
    assert err.getvalue().endswith("\r\x1b[K")


# ---- the spinner's line ------------------------------------------------------------------------
def test_without_a_person_watching_a_wait_prints_nothing() -> None:
    err = Tty()
    console = Console(out=io.StringIO(), err=err, live=False)
    with console.waiting("connecting 0/3") as w:
        w.update("connecting 1/3")
        console.info("node1  connected")
    assert err.getvalue() == "fleet: node1  connected\n"


def test_a_nested_wait_gives_the_line_back_to_the_one_around_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    console, err = live(80, monkeypatch)
    with console.waiting("sending the code to 3 node(s)"):
        with console.waiting("preflight: rendezvous port 29500 on node1"):
            assert err.getvalue().endswith("preflight: rendezvous port 29500 on node1")
        assert err.getvalue().endswith("sending the code to 3 node(s)")
        console.info("node1  code: sent 3 file(s)")
        assert err.getvalue().endswith("sending the code to 3 node(s)")  # drawn again under it
    assert err.getvalue().endswith("\r\x1b[K")  # erased at the end
    assert "\n" not in err.getvalue().replace("fleet: node1  code: sent 3 file(s)\n", "")


def test_a_spinner_line_fits_the_terminal_whatever_its_words(
        monkeypatch: pytest.MonkeyPatch) -> None:
    console, err = live(40, monkeypatch)
    with console.waiting("x" * 100) as w:
        w.update("界" * 60)  # wide characters: two cells each
    drawn = [line for line in screen_lines(err.getvalue()) if line]
    assert drawn and all(cell_len(line) <= 39 for line in drawn), drawn
    assert any(line.endswith("…") for line in drawn)


def test_the_transfer_bar_takes_the_spinners_place_then_gives_it_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    console, err = live(80, monkeypatch)
    with console.waiting("sending the code and data to 2 node(s)"):
        console.redraw("fleet: data 8.0 MiB of 64.0 MiB in place")
        console._draw_status()  # what the spinner's ticker does ten times a second
        assert err.getvalue().endswith("\r\x1b[Kfleet: data 8.0 MiB of 64.0 MiB in place")
        console.settle()
        assert err.getvalue().endswith("sending the code and data to 2 node(s)")


def bar_states(at: int, expected: int) -> dict[str, report.NodeState]:
    return {"node1": report.NodeState("node1", expected=expected, at=at)}


def test_the_bar_is_redrawn_only_where_a_person_watches() -> None:
    now = [0.0]
    for watched in (True, False):
        now[0] = 0.0
        err = Tty()  # a terminal either way: FLEET_PLAIN or TERM=dumb make it plain
        states = bar_states(0, 64 << 20)
        bar = progress.Bar(Console(out=io.StringIO(), err=err, live=watched), 64 << 20,
                           states, ["node1"], lambda: now[0])
        for _ in range(30):
            now[0] += 0.5
            states["node1"].at += 2 << 20
            bar.tick()
        bar.end()
        if watched:
            assert "\n" not in err.getvalue() and "\r\x1b[Kfleet: data" in err.getvalue()
        else:
            assert "\r" not in err.getvalue()
            assert err.getvalue().splitlines()[0].startswith("fleet: data 40.0 MiB of 64.0 MiB")


# ---- Slurm: the wait in the queue -------------------------------------------------------------
def info(state: str, reason: str = "", nodes: str = "") -> sj.JobInfo:
    return sj.JobInfo("42", state, reason=reason, nodes=nodes)


def test_a_job_in_the_queue_has_a_spinner_until_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    console, err = live(80, monkeypatch)
    announce = Announcer(console, "42")
    announce(info("PENDING", "Resources"))
    assert err.getvalue().endswith("job 42 is PENDING (Resources)")
    announce(info("PENDING", "Priority"))
    assert err.getvalue().endswith("job 42 is PENDING (Priority)")
    announce(info("RUNNING", nodes="c[1-2]"))
    assert err.getvalue().endswith("fleet: slurm  job 42 is RUNNING on c[1-2]\n")
    assert not console._waits


def test_plain_slurm_words_are_unchanged() -> None:
    err = io.StringIO()
    console = Console(out=io.StringIO(), err=err, live=False)
    announce = Announcer(console, "42")
    announce(info("PENDING", "Resources"))
    announce(info("PENDING", "Resources"))
    announce(info("RUNNING", nodes="c1"))
    announce.close()
    assert err.getvalue() == ("fleet: slurm  job 42 is PENDING (Resources)\n"
                              "fleet: slurm  job 42 is RUNNING on c1\n")
