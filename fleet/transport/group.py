"""Runs one function for many hosts in parallel, with a bound; results per host are data."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from fleet.errors import FleetError, host_error

T = TypeVar("T")
R = TypeVar("R")
MAX_PARALLEL = 32


INTERRUPT_GRACE_S = 3.0  # how long an interrupt waits for the calls under way to end


def each(items: Iterable[tuple[str, T]], fn: Callable[[T], R],
         limit: int = MAX_PARALLEL,
         cancel: Callable[[], None] | None = None) -> dict[str, R | Exception]:
    """fn(item) for every (host name, item); each host's result or the exception it raised.
    `cancel`, where given, is called on an interrupt to cut short what runs (a long setup).

    The calls run in daemon threads: on an interrupt (a signal in the main thread) what waits
    is dropped, and what runs gets INTERRUPT_GRACE_S to end (or be cut short by `cancel`), so
    that a teardown that follows knows what may have started; a call blocked for good (a node
    that stopped answering, a file that never gives data) can neither hold the interrupt nor
    keep the process from exiting."""
    pairs = list(items)
    if not pairs:
        return {}
    out: dict[str, R | Exception] = {}
    slots = threading.Semaphore(max(1, min(limit, len(pairs))))

    def run(name: str, item: T) -> None:
        try:
            out[name] = fn(item)
        except Exception as e:  # a failure on one host is data, not a crash of the others
            out[name] = e
        except BaseException as e:  # noqa: BLE001 - a thread's own exit is its host's failure
            out[name] = RuntimeError(f"{type(e).__name__}: {e}")
        finally:
            slots.release()

    threads: list[threading.Thread] = []
    try:
        for name, item in pairs:
            slots.acquire()
            th = threading.Thread(target=run, args=(name, item), daemon=True,
                                  name=f"fleet-{name}")
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
    except BaseException:
        if cancel is not None:
            cancel()
        deadline = time.monotonic() + INTERRUPT_GRACE_S
        for th in threads:
            th.join(max(0.0, deadline - time.monotonic()))
        raise
    return {name: out[name] for name, _ in pairs}


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
