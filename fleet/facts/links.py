"""`fleet doctor`'s link test as facts: the sink each node runs for the rounds and the sender
one node runs towards another (fleet/nodeside/linktest.py), each a command and a pure parser of
what the node printed, which is untrusted input: a line that is not what the program prints is
ignored, and a figure out of bounds is none."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleet.console import printable
from fleet.nodedata import number
from fleet.nodeside import loader, python_program, shell_program
from fleet.shell import quote, sh

SINK_MARK = "fleet-doctor-sink"  # in a sink's command line: how fleet knows it before a kill
PINGS = 20
MAX_BYTES = 1 << 50  # past this no link test sent it
MAX_RATE = 1e13  # bits a second: past this a figure is no measurement


def bounded(text: str, limit: float) -> float | None:
    """A node's decimal figure, finite, 0 or more and below `limit`; else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value < limit else None


@dataclass(frozen=True)
class Sent:
    """One direction of a link, as its sender saw it: round trips (µs) and what the sink said
    arrived, in how long; or why not."""

    rtt_us: float | None = None
    rtt_min_us: float | None = None
    bytes: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def bits(self) -> float | None:
        """Bits a second, or None where no bulk figure came."""
        if self.error or self.seconds <= 0 or not self.bytes:
            return None
        rate = self.bytes * 8 / self.seconds
        return rate if rate < MAX_RATE else None


def sink_script(python: str, seconds: int, expect: int) -> str:
    """A sink in the background on the node, bounded by `timeout` as well as by itself; prints
    what parse_sink reads."""
    return shell_program("listen.sh", str(seconds + 5), python, "-I", "-S", "-c",
                         loader("linktest.py"), "sink", str(seconds), str(expect), SINK_MARK,
                         python="linktest.py")


def parse_sink(out: str) -> tuple[int, int] | str:
    """(port, pid) of a sink that listens, or why it does not."""
    for line in out.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "listening":
            port, pid = number(words[1], 65536), number(words[2], 1 << 22)
            if port and pid and pid > 1:
                return port, pid
    said = printable(out.strip().removeprefix("busy ").strip())[-200:]
    return said or "the sink did not start"


def send_script(python: str, address: str, port: int, source: str | None, seconds: float,
                pings: int = PINGS) -> str:
    """The sender towards address:port (from `source`, the node's own address fleet chose),
    bounded by `timeout` where the node has it."""
    limit = int(seconds) + 45
    guard = f"T=; command -v timeout >/dev/null 2>&1 && T='timeout {limit}'"
    return guard + "\n" + python_program(
        "$T " + quote(python), "linktest.py", "send", address, str(port), source or "-",
        f"{seconds:g}", str(pings), flags=("-I", "-S"), redirect="2>&1")


def parse_send(out: str) -> Sent:
    rtt: tuple[float | None, float | None] = (None, None)
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["fail"]:
            return Sent(rtt[0], rtt[1], error=printable(" ".join(words[1:]))[:200] or "failed")
        if words[:1] == ["rtt"] and len(words) == 3:
            rtt = (bounded(words[1], 1e9), bounded(words[2], 1e9))
        if words[:1] == ["bulk"] and len(words) == 3:
            got, spent = number(words[1], MAX_BYTES), bounded(words[2], 1e6)
            if got is None or spent is None:
                return Sent(*rtt, error="the sink's answer was no figure")
            return Sent(rtt[0], rtt[1], got, spent)
    said = [line for line in out.strip().splitlines() if line.split()[:1] != ["rtt"]]
    last = printable(said[-1])[:200] if said else ""
    return Sent(*rtt, error=last or "the sender said nothing of the bulk transfer")


def free_port_script(python: str) -> str:
    """A port free on the node now (the kernel's choice), for the all-reduce's rendezvous."""
    return sh(python, "-I", "-S", "-c", "import socket;s=socket.socket();s.bind(('',0));"
                                        "print('port',s.getsockname()[1])")


def parse_free_port(out: str) -> int | None:
    for line in out.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "port":
            return number(words[1], 65536) or None
    return None


def allreduce_script(python: str, master: str, port: int, rank: int, world: int,
                     interface: str | None) -> str:
    guard = "T=; command -v timeout >/dev/null 2>&1 && T='timeout 120'"
    return guard + "\n" + python_program(
        "$T " + quote(python), "allreduce.py", master, str(port), str(rank), str(world),
        interface or "-", flags=("-I",), redirect="2>&1")


def parse_allreduce(out: str) -> tuple[str, float] | str:
    """Rank 0's word: (the backend, bus bandwidth in bytes a second), or why none came."""
    for line in out.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "busbw" and words[1] in ("gloo", "nccl"):
            rate = bounded(words[2], MAX_RATE)
            if rate:
                return words[1], rate
        if words[:1] == ["fail"]:
            return printable(" ".join(words[1:]))[:300] or "failed"
    said = [line for line in out.strip().splitlines() if line.strip()]
    return printable(said[-1])[:300] if said else "rank 0 said nothing"
