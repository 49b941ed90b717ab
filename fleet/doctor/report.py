"""`fleet doctor`'s figures as rows for a person and as JSON for a program; the verdict's lines
are fleet.doctor.verdict's."""

from __future__ import annotations

from typing import Any

from fleet.doctor.figures import (
    Examination,
    Link,
    bits_words,
    bytes_words,
    size_words,
    time_words,
)
from fleet.doctor.verdict import Finding, named_hosts

HOST_HEADERS = ("HOST", "CPUS", "STEAL", "MEMORY", "DISK WRITE", "DISK READ", "CLOCK", "GPUS")
LINK_HEADERS = ("LINK", "BANDWIDTH", "ROUND TRIP")


def _or(value: Any, words: Any) -> str:
    return "-" if value is None else str(words(value))


def host_rows(exam: Examination) -> list[list[str]]:
    rows = []
    for h, f in exam.hosts.items():
        g = exam.gpus.get(h)
        gpus = "-" if g is None or not g.smi else (
            f"{len(g.gpus)}" + (f" ({g.error})" if g.error else ""))
        off = exam.offsets.get(h)
        rows.append([h, _or(f.cores, str), _or(f.steal, lambda v: f"{v:.0%}"),
                     _or(f.memory, size_words), _or(f.disk_write, bytes_words),
                     _or(f.disk_read, bytes_words), _or(off, lambda v: f"{v:+.1f} s"), gpus])
    return rows


def link_rows(exam: Examination) -> list[list[str]]:
    return [[f"{x.a}-{x.b}", f"failed: {x.error}" if x.error else _or(x.bits, bits_words),
             _or(x.rtt_us, time_words)] for x in exam.links]


def summary(exam: Examination, findings: list[Finding], regressions: list[str] | None = None
            ) -> str:
    """The last line: what was measured, and what is named."""
    what = (f"{len(exam.hosts)} hosts, {len(exam.links)} links in {exam.rounds} rounds"
            f"{' (quick)' if exam.quick else ''}")
    ring = exam.ring
    if ring is not None and ring.busbw:
        what += (f", all-reduce ({ring.backend}, {ring.ranks} ranks) bus bandwidth "
                 f"{bytes_words(ring.busbw)}")
    hosts = named_hosts(findings)
    if hosts:
        return f"{what}: {len(hosts)} host{'s' * (len(hosts) > 1)} named: {', '.join(hosts)}"
    if findings:
        return f"{what}: {len(findings)} link{'s' * (len(findings) > 1)} named, no host"
    if regressions:
        return f"{what}: slower than before ({len(regressions)} figures)"
    if exam.unreached:
        return f"{what}: {len(exam.unreached)} not examined: {', '.join(exam.unreached)}"
    return f"{what}: every host and link within bounds"


def _link(x: Link) -> dict[str, Any]:
    def side(s: Any) -> dict[str, Any]:
        return {"bits_per_s": s.bits, "rtt_us": s.rtt_us, "error": s.error or None}

    return {"a": x.a, "b": x.b, "bits_per_s": x.bits, "rtt_us": x.rtt_us,
            "error": x.error or None, "a_to_b": side(x.ab), "b_to_a": side(x.ba)}


def as_json(exam: Examination, findings: list[Finding],
            regressions: list[str] | None = None) -> dict[str, Any]:
    hosts: dict[str, Any] = {}
    for h, f in exam.hosts.items():
        g = exam.gpus.get(h)
        hosts[h] = {"cores": f.cores, "steal": f.steal, "throttled": f.throttled,
                    "memory": f.memory, "available": f.available,
                    "disk_write_bytes_per_s": f.disk_write, "disk_read_bytes_per_s": f.disk_read,
                    "clock_offset_s": exam.offsets.get(h), "errors": list(f.errors),
                    "gpus": None if g is None or not g.smi else [
                        {"index": x.index, "faults": x.faults(), "ecc_uncorrected":
                         x.ecc_uncorrected, "ecc_corrected": x.ecc_corrected,
                         "retired_pending": x.retired_pending, "throttle": x.throttle,
                         "pcie_gen": x.pcie_gen, "pcie_width": x.pcie_width,
                         "pcie_width_max": x.pcie_width_max} for x in g.gpus],
                    "xid": None if g is None else g.xid}
    return {"v": 1, "quick": exam.quick, "rounds": exam.rounds, "hosts": hosts,
            "links": [_link(x) for x in exam.links], "unreached": exam.unreached,
            "findings": [{"host": f.host, "kind": f.kind, "line": f.line} for f in findings],
            "named": named_hosts(findings), "regressions": regressions or [],
            "allreduce": None if exam.ring is None else {
                "backend": exam.ring.backend or None, "ranks": exam.ring.ranks,
                "busbw_bytes_per_s": exam.ring.busbw, "error": exam.ring.error or None}}
