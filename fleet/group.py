"""Runs one function for many hosts in parallel, with a bound; results per host are data."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from fleet.errors import FleetError, host_error

T = TypeVar("T")
R = TypeVar("R")
MAX_PARALLEL = 32


def each(items: Iterable[tuple[str, T]], fn: Callable[[T], R],
         limit: int = MAX_PARALLEL,
         cancel: Callable[[], None] | None = None) -> dict[str, R | Exception]:
    """fn(item) for every (host name, item); each host's result or the exception it raised.
    `cancel`, where given, is called on an interrupt to cut short what runs (a long setup)."""
    pairs = list(items)
    if not pairs:
        return {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(limit, len(pairs))))
    try:
        futures = {name: pool.submit(fn, item) for name, item in pairs}
        pool.shutdown(wait=True)
    except BaseException:
        # Interrupted (a signal in the main thread): what runs finishes (or is cut short by
        # `cancel`), so that a teardown that follows knows everything that may have started;
        # what waits is dropped.
        if cancel is not None:
            cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    out: dict[str, R | Exception] = {}
    for name, fut in futures.items():
        try:
            out[name] = fut.result()
        except Exception as e:  # a failure on one host is data, not a crash of the others
            out[name] = e
    return out


def reason(e: Exception) -> str:
    if isinstance(e, FleetError):
        return str(e)
    return f"{type(e).__name__}: {e}"


def failures(results: dict[str, R | Exception]) -> dict[str, str]:
    return {name: reason(r) for name, r in results.items() if isinstance(r, Exception)}


def all_ok(action: str, results: dict[str, R | Exception]) -> dict[str, R]:
    """The results, or a HostError naming every host that failed and why."""
    bad = {name: r for name, r in results.items() if isinstance(r, Exception)}
    if bad:
        raise host_error(action, bad)
    return {name: r for name, r in results.items() if not isinstance(r, Exception)}
