"""`fleet doctor`'s figures of one host (fleet/nodeside/hostcheck.py): CPUs, steal and
throttling over an interval, memory, the workdir's disk; one command and a pure parser of its
lines, which are untrusted input (a line it does not print is ignored, a figure out of bounds is
none)."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.console import printable
from fleet.facts.links import bounded
from fleet.nodedata import number
from fleet.nodeside import python_program
from fleet.shell import home_word

MAX_COUNT = 1 << 40


@dataclass(frozen=True)
class HostFigures:
    """One host as `fleet doctor` measured it; None where a figure could not be taken."""

    cores: int | None = None  # this process may use
    steal: float | None = None  # share of the CPU time stolen (0..1) over the interval
    throttled: int | None = None  # thermal throttle events in the interval
    memory: int | None = None  # bytes, total
    available: int | None = None  # bytes available
    disk_write: float | None = None  # bytes a second, flushed to the device
    disk_read: float | None = None  # bytes a second, page cache dropped
    errors: tuple[str, ...] = ()  # what could not be measured, as the node said it


def host_script(python: str, workdir: str, size: int, seconds: float) -> str:
    limit = int(seconds) + 120
    guard = f"T=; command -v timeout >/dev/null 2>&1 && T='timeout {limit}'"
    return guard + "\n" + python_program(
        "$T " + home_word(python), "hostcheck.py", workdir, str(size), f"{seconds:g}",
        flags=("-I", "-S"), redirect="2>&1")


def _rate(words: list[str]) -> float | None:
    got, spent = number(words[1], MAX_COUNT), bounded(words[2], 1e6)
    if got is None or not spent:
        return None
    return got / spent


def parse_host(out: str) -> HostFigures:
    f: dict[str, object] = {}
    errors: list[str] = []
    for line in out.splitlines():
        words = line.split()
        key = words[0] if words else ""
        if key == "cores" and len(words) == 3:
            f["cores"] = number(words[1], 1 << 20)
        elif key == "steal" and len(words) == 3:
            stolen, total = number(words[1], MAX_COUNT), number(words[2], MAX_COUNT)
            if stolen is not None and total and stolen <= total:
                f["steal"] = stolen / total
        elif key == "throttle" and len(words) == 2:
            f["throttled"] = number(words[1], MAX_COUNT, signed=True)
        elif key == "memory" and len(words) == 3:
            f["memory"], f["available"] = number(words[1], 1 << 60), number(words[2], 1 << 60)
        elif key in ("write", "read") and len(words) == 3:
            f[f"disk_{key}"] = _rate(words)
        elif key == "error" and len(words) >= 2:
            errors.append(printable(" ".join(words[1:]))[:200])
    throttled = f.get("throttled")
    if isinstance(throttled, int) and throttled < 0:
        f["throttled"] = None  # counters reset meanwhile: nothing known
    return HostFigures(errors=tuple(errors), **f)  # type: ignore[arg-type]
