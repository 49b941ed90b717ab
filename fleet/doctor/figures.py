"""What one `fleet doctor` found, as data: every host's figures, its GPUs' counters, its clock
against the laptop's, every link measured (both ways), and the hosts that could not be asked;
and the words for its figures."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fleet.config.doctor import Bounds
from fleet.facts.gpuhealth import GpuHealthFacts
from fleet.facts.hostfigs import HostFigures
from fleet.facts.links import Sent


@dataclass(frozen=True)
class Link:
    """A pair of hosts, measured from both ends at once."""

    a: str
    b: str
    ab: Sent  # a's sender towards b's sink
    ba: Sent

    @property
    def error(self) -> str:
        return self.ab.error or self.ba.error

    @property
    def bits(self) -> float | None:
        """The slower direction's bits a second (0 where the test failed), None where unknown."""
        if self.error:
            return 0.0
        rates = [r for r in (self.ab.bits, self.ba.bits) if r is not None]
        return min(rates) if len(rates) == 2 else None

    @property
    def rtt_us(self) -> float | None:
        """The round trip, the lower of the two ends' medians."""
        rtts = [r for r in (self.ab.rtt_us, self.ba.rtt_us) if r is not None]
        return min(rtts) if rtts else None

    def other(self, host: str) -> str:
        return self.b if host == self.a else self.a

    def better(self, again: Link) -> Link:
        """This link and a second measure of it: the higher bandwidth's figures, with the
        lower round trips of the two (a slow moment is no slow link)."""
        best = again if (again.bits or 0.0) > (self.bits or 0.0) else self

        def rtt(side: str) -> float | None:
            got = [r for r in (getattr(self, side).rtt_us, getattr(again, side).rtt_us)
                   if r is not None]
            return min(got) if got else None

        return Link(self.a, self.b, dataclasses.replace(best.ab, rtt_us=rtt("ab")),
                    dataclasses.replace(best.ba, rtt_us=rtt("ba")))


@dataclass(frozen=True)
class Ring:
    """A ring all-reduce over every host (the full form): its bus bandwidth (bytes a second, as
    nccl-tests define it), or why none came."""

    backend: str = ""
    busbw: float | None = None
    ranks: int = 0
    error: str = ""


@dataclass(frozen=True)
class Examination:
    """Every figure of one `fleet doctor`, hosts in the inventory's order."""

    hosts: dict[str, HostFigures]
    gpus: dict[str, GpuHealthFacts] = field(default_factory=dict)
    offsets: dict[str, float] = field(default_factory=dict)  # node clock minus the laptop's
    links: tuple[Link, ...] = ()
    unreached: dict[str, str] = field(default_factory=dict)  # host -> why it has no figures
    rounds: int = 0
    quick: bool = False
    workdir: dict[str, str] = field(default_factory=dict)  # where each disk was measured
    bounds: Bounds = Bounds()  # the inventory's [doctor]
    ring: Ring | None = None  # the full form's all-reduce


def bits_words(bits: float) -> str:
    """48 Mbit/s, 9.4 Gbit/s."""
    for unit, size in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= size:
            return f"{_short(bits / size)} {unit}"
    return f"{bits:.0f} bit/s"


def bytes_words(rate: float) -> str:
    """Bytes a second: 850 MB/s, 1.2 GB/s."""
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if rate >= size:
            return f"{_short(rate / size)} {unit}"
    return f"{rate:.0f} B/s"


def size_words(n: float) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{_short(n / size)} {unit}"
    return f"{n:.0f} B"


def time_words(us: float) -> str:
    """A round trip: 80 µs, 3.1 ms."""
    if us >= 1000:
        return f"{_short(us / 1000)} ms"
    return f"{us:.0f} µs"


def _short(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0") if x < 100 else f"{x:.0f}"
