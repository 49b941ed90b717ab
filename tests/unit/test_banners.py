"""torchrun's own banners and warnings before a node's first rank line: recognised (a pure
classifier), kept from the terminal, shown again with --debug; a rank's line, an error and a
job's own `*****` never hidden."""

from __future__ import annotations

import io

import pytest

from fleet.banners import Banner, noise, ranked
from fleet.console import Console

# What torchrun 2.x printed on this machine (glog's format), then c10d's agent warnings.
GLOG = """\
W1126 08:43:23.620000 1132 torch/distributed/run.py:982]\x20
W1126 08:43:23.620000 1132 torch/distributed/run.py:982] *****************************************
W1126 08:43:23.620000 1132 torch/distributed/run.py:982] Setting OMP_NUM_THREADS environment \
variable for each process to be 1 in default, to avoid your system being overloaded, please \
further tune the variable for optimal performance in your application as needed.\x20
W1126 08:43:23.620000 1132 torch/distributed/run.py:982] *****************************************
[W1122 02:09:24.909136767 socket.cpp:207] [c10d] The hostname of the client socket cannot be \
retrieved. err=-3
[W socket.cpp:601] [c10d] The IPv6 network addresses of (node1, 29500) cannot be retrieved \
(gai error: -2 - Name or service not known).
[I socket.cpp:787] [c10d] The client socket has connected to [node1]:29500 on [node2]:46672.
""".splitlines()
# torch 1.x/2.0's logging format: a header, then the bare rules and sentence.
LEGACY = """\
WARNING:torch.distributed.run:
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid \
your system being overloaded, please further tune the variable for optimal performance in \
your application as needed.
*****************************************
""".splitlines()
# Bare, as a node's log holds it under fleet (torch's loggers without their format).
BARE = ["", *LEGACY[1:], GLOG[4]]
KEPT = [
    "E1126 08:43:23.620000 1132 torch/distributed/run.py:982] failed to start",
    "[W socket.cpp:663] [c10d] The client socket has failed to connect to [node1]:29500",
    "W1126 08:43:23.620000 1132 torch/distributed/elastic/agent/server/api.py:700] restarting",
    "*****************************************",  # a bare rule with no torchrun line before it
    "Traceback (most recent call last):",
    "hello from the job",
]


def test_every_known_banner_line_is_recognised_in_both_formats() -> None:
    for block in (GLOG, LEGACY, BARE):
        after = True  # the log's start
        for line in block:
            after = noise(line, after)
            assert after, line


def test_what_is_not_torchruns_known_banner_is_never_noise() -> None:
    for line in KEPT:
        assert not noise(line), line


def test_hidden_only_before_the_nodes_first_rank_line() -> None:
    b = Banner()
    assert [b.shown("node1", line) for line in BARE] == [False] * 5
    assert b.shown("node1", KEPT[1])
    assert b.shown("node1", "")  # a blank line after one that is not the banner's: said
    assert b.shown("node1 setup", "installing")  # the setup's lines are the job's
    fresh = Banner()  # ... a blank line or a rule of the setup's included, at the log's start
    assert fresh.shown("node1 setup", "") and fresh.shown("node1 setup", "*****")
    assert not fresh.shown("node1", BARE[0]) and fresh.hidden == 1
    assert not b.shown("node1", GLOG[4])
    assert b.shown("node1 r0", "hello from rank 0") and b.over
    assert b.shown("node1", GLOG[4])  # after the job's first line, everything is shown
    assert b.hidden == 6
    assert ranked("node1 r12") and ranked("node1 l0") and not ranked("node1 setup")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("debug", [False, True])
def test_the_terminal_hides_them_per_node_and_debug_shows_them(
        debug: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_DEBUG", raising=False)
    if debug:
        monkeypatch.setenv("FLEET_DEBUG", "1")
    out = io.StringIO()
    console = Console(out=out, err=io.StringIO(), color=False)
    console.lines(0, [("node1", line) for line in GLOG], "node1")
    console.lines(1, [("node2", LEGACY[0])], "node2")
    console.lines(0, [("node1 r0", "hello from 0")], "node1")
    console.lines(1, [("node2", LEGACY[1]), ("node2 r1", "hello from 1")], "node2")
    shown = out.getvalue().splitlines()
    if debug:
        assert len(shown) == len(GLOG) + 4
    else:
        assert shown == ["node1 r0 | hello from 0", "node2 r1 | hello from 1"]


def test_json_gets_every_line() -> None:
    got: list[object] = []

    class Sink:
        def emit(self, event: object) -> None:
            got.append(event)
    Console(out=io.StringIO(), err=io.StringIO(), sink=Sink()).lines(
        0, [("node1", line) for line in GLOG], "node1")
    assert len(got) == len(GLOG)
