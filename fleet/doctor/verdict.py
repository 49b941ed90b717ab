"""`fleet doctor`'s verdict: a pure function over an Examination. A host or link well below its
peers' median is named on one line, with its figure and the median; a link is the slower of
its two directions. A host is named for its links only where it is the common end of its slow
pairs (more than half of its pairs, and at least two): one slow link alone pins no host, and is
named as a link. The bounds are relative (fleet.config.doctor.Bounds, the inventory's
`[doctor]`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from fleet.config.doctor import Bounds
from fleet.doctor.figures import (
    Examination,
    Link,
    bits_words,
    bytes_words,
    size_words,
    time_words,
)
from fleet.facts.hostfigs import HostFigures


@dataclass(frozen=True)
class Finding:
    """One thing named: the host it pins (None: a link that pins neither end), what kind of
    figure, the line a person reads."""

    host: str | None
    kind: str
    line: str


def judge(exam: Examination, bounds: Bounds) -> list[Finding]:
    """Everything named, hosts in the inventory's order within each kind."""
    out = _bandwidth(exam, bounds) + _latency(exam, bounds)
    out += _disk(exam, bounds) + _cpu(exam, bounds) + _clock(exam, bounds) + _gpus(exam)
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _pairs_of(links: list[Link], slow: set[int]) -> dict[str, tuple[int, int]]:
    """Per host: (its slow pairs, its pairs measured)."""
    out: dict[str, tuple[int, int]] = {}
    for i, link in enumerate(links):
        for h in (link.a, link.b):
            s, n = out.get(h, (0, 0))
            out[h] = (s + (i in slow), n + 1)
    return out


def _common_ends(links: list[Link], slow: set[int], order: list[str]) -> list[str]:
    counts = _pairs_of(links, slow)
    return [h for h in order if h in counts
            and counts[h][0] >= 2 and 2 * counts[h][0] > counts[h][1]]


def _links_named(exam: Examination, kind: str, links: list[Link], slow: set[int],
                 worst: Callable[[list[Link]], Link], words: Callable[[Link], str],
                 median: str) -> list[Finding]:
    order = list(exam.hosts)
    ends = _common_ends(links, slow, order)
    counts = _pairs_of(links, slow)
    out = []
    for h in ends:
        mine = [links[i] for i in sorted(slow) if h in (links[i].a, links[i].b)]
        w = worst(mine)
        n = counts[h][0]
        out.append(Finding(h, kind, f"{h}: {kind} to {w.other(h)} {words(w)} ({median}); {h} "
                                    f"is the common end of the {n} slow pairs"))
    for i in sorted(slow):
        link = links[i]
        if link.a in ends or link.b in ends:
            continue
        out.append(Finding(None, kind, f"{link.a}-{link.b}: {kind} {words(link)} ({median}); "
                                       "neither end is slow with its other peers"))
    return out


def slow_bandwidth(links: list[Link], bounds: Bounds) -> tuple[float, set[int]]:
    """The median of each host's best link, and the links (by place) below its bound."""
    best: dict[str, float] = {}
    for link in links:
        for h in (link.a, link.b):
            best[h] = max(best.get(h, 0.0), link.bits or 0.0)
    ref = _median(list(best.values())) or 0.0
    return ref, {i for i, link in enumerate(links) if (link.bits or 0.0) < bounds.link * ref}


def slow_latency(links: list[Link], bounds: Bounds) -> tuple[float, set[int]]:
    """The median of each host's lowest round trip, and the links (by place) past its bound."""
    best: dict[str, float] = {}
    for link in links:
        for h in (link.a, link.b):
            best[h] = min(best.get(h, float("inf")), link.rtt_us or 0.0)
    ref = _median(list(best.values())) or 0.0
    floor = bounds.latency_floor_ms * 1000
    return ref, {i for i, link in enumerate(links) if (rtt := link.rtt_us or 0.0)
                 > bounds.latency * ref and rtt - ref > floor}


def suspects(links: list[Link], bounds: Bounds) -> list[tuple[str, str]]:
    """The pairs the verdict would call slow, by bandwidth or round trip (measured again
    before it is given: one noisy moment should name nothing)."""
    fast = [x for x in links if x.bits is not None]
    timed = [x for x in links if x.rtt_us is not None and not x.error]
    out = [(fast[i].a, fast[i].b) for i in sorted(slow_bandwidth(fast, bounds)[1])]
    out += [(timed[i].a, timed[i].b) for i in sorted(slow_latency(timed, bounds)[1])]
    return list(dict.fromkeys(out))


def _bandwidth(exam: Examination, bounds: Bounds) -> list[Finding]:
    links = [link for link in exam.links if link.bits is not None]
    ref, slow = slow_bandwidth(links, bounds)
    if not ref:
        return []

    def words(link: Link) -> str:
        return f"failed ({link.error})" if link.error else bits_words(link.bits or 0.0)

    return _links_named(exam, "link", links, slow, lambda ls: min(ls, key=lambda x: x.bits or 0),
                        words, f"median {bits_words(ref)}")


def _latency(exam: Examination, bounds: Bounds) -> list[Finding]:
    links = [link for link in exam.links if link.rtt_us is not None and not link.error]
    if not links:
        return []
    ref, slow = slow_latency(links, bounds)
    return _links_named(exam, "round trip", links, slow,
                        lambda ls: max(ls, key=lambda x: x.rtt_us or 0.0),
                        lambda link: time_words(link.rtt_us or 0.0), f"median {time_words(ref)}")


def _below(exam: Examination, kind: str, figure: Callable[[str], float | None], share: float,
           words: Callable[[float], str], where: Callable[[str], str] = lambda h: ""
           ) -> list[Finding]:
    """Hosts whose figure is below `share` of the hosts' median."""
    got = {h: v for h in exam.hosts if (v := figure(h)) is not None}
    ref = _median(list(got.values()))
    if not ref or len(got) < 2:
        return []
    return [Finding(h, kind, f"{h}: {kind} {words(v)}{where(h)} (median {words(ref)})")
            for h, v in got.items() if v < share * ref]


def disk_suspects(hosts: dict[str, HostFigures], bounds: Bounds) -> list[str]:
    """The hosts whose disk the verdict would call slow (measured again, alone, before it is
    given: hosts that share a disk and measure at once slow each other down)."""
    out = []
    for key in ("disk_write", "disk_read"):
        got = {h: v for h, f in hosts.items() if (v := getattr(f, key)) is not None}
        ref = _median(list(got.values()))
        if ref and len(got) >= 2:
            out += [h for h, v in got.items() if v < bounds.disk * ref]
    return list(dict.fromkeys(out))


def _disk(exam: Examination, bounds: Bounds) -> list[Finding]:
    def where(h: str) -> str:
        return f" in {exam.workdir[h]}" if h in exam.workdir else ""

    return (_below(exam, "disk write", lambda h: exam.hosts[h].disk_write, bounds.disk,
                   bytes_words, where)
            + _below(exam, "disk read", lambda h: exam.hosts[h].disk_read, bounds.disk,
                     bytes_words, where))


def _cpu(exam: Examination, bounds: Bounds) -> list[Finding]:
    out = _below(exam, "CPUs", lambda h: _f(exam.hosts[h].cores), bounds.cores,
                 lambda v: f"{v:.0f}")
    out += _below(exam, "memory", lambda h: _f(exam.hosts[h].memory), bounds.memory, size_words)
    for h, f in exam.hosts.items():
        if f.steal is not None and f.steal > bounds.steal:
            out.append(Finding(h, "steal", f"{h}: {f.steal:.0%} of its CPU time stolen by the "
                                           f"hypervisor (bound {bounds.steal:.0%})"))
        if f.throttled:
            out.append(Finding(h, "throttle", f"{h}: its CPUs throttled for heat {f.throttled} "
                                              "times while measured"))
    return out


def _f(value: int | None) -> float | None:
    return None if value is None else float(value)


def _clock(exam: Examination, bounds: Bounds) -> list[Finding]:
    ref = _median(list(exam.offsets.values()))
    if ref is None or len(exam.offsets) < 2:
        return []
    out = []
    for h, off in exam.offsets.items():
        d = off - ref
        if abs(d) > bounds.clock_skew_s:
            out.append(Finding(h, "clock", f"{h}: clock {abs(d):.1f} s "
                                           f"{'ahead of' if d > 0 else 'behind'} the hosts' "
                                           f"median (bound {bounds.clock_skew_s:g} s)"))
    return out


def _gpus(exam: Examination) -> list[Finding]:
    out = []
    for h, g in exam.gpus.items():
        faults = [f"GPU{x.index}: {'; '.join(x.faults())}" for x in g.gpus if x.faults()]
        if g.xid:
            faults.append(f"{g.xid} Xid errors in the kernel log")
        if faults:
            out.append(Finding(h, "GPU", f"{h}: " + "; ".join(faults)))
    return out


def named_hosts(findings: list[Finding]) -> list[str]:
    """The hosts the verdict pins, each once, in the order named."""
    return list(dict.fromkeys(f.host for f in findings if f.host is not None))
