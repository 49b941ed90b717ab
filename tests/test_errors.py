"""Exit codes mean what happened: hosts that could not be reached (3) apart from hosts that
answered but are not ready (5) and hosts busy with another run (6)."""

from __future__ import annotations

from fleet.errors import (
    CommandTimedOut,
    HostError,
    HostsBusy,
    HostsUnreachable,
    StartError,
    TransportError,
    WriteError,
    host_error,
)
from fleet.group import all_ok


def test_not_ready_is_5_and_names_each_host() -> None:
    e = host_error("prepare", {"node2": WriteError("disk full"), "node3": RuntimeError("x")})
    assert type(e) is HostError and e.exit_code == 5
    assert str(e) == ("prepare failed on 2 host(s); nothing was started:\n  node2: disk full\n"
                      "  node3: RuntimeError: x")


def test_any_unreachable_host_makes_it_3() -> None:
    for lost in (TransportError("connection lost"), CommandTimedOut("node3", "probe", 30)):
        e = host_error("probe", {"node2": WriteError("disk full"), "node3": lost})
        assert isinstance(e, HostsUnreachable) and e.exit_code == 3


def test_a_start_keeps_its_words_and_takes_3_when_unreachable() -> None:
    e = host_error("starting the job", {"node2": TransportError("lost")}, StartError)
    assert isinstance(e, StartError) and e.exit_code == 3
    assert "nothing was started" not in str(e)
    assert host_error("starting the job", {"node2": WriteError("x")}, StartError).exit_code == 5


def test_busy_is_6_and_all_ok_classifies() -> None:
    assert HostsBusy("preflight", {"node1": "held by run r"}).exit_code == 6
    assert all_ok("x", {"a": 1, "b": 2}) == {"a": 1, "b": 2}
    try:
        all_ok("probe", {"a": 1, "b": TransportError("refused")})
    except HostsUnreachable as e:
        assert e.failures == {"b": "refused"}
    else:
        raise AssertionError("no error")


def test_an_interrupt_never_waits_on_a_blocked_call() -> None:
    """A call blocked for good (open() of a FIFO nobody writes) holds neither the interrupt
    (it returns within the grace) nor the process's exit (the thread is a daemon)."""
    import os
    import signal
    import tempfile
    import threading
    import time

    import pytest

    from fleet import group

    fifo = os.path.join(tempfile.mkdtemp(), "fifo")
    os.mkfifo(fifo)

    def blocked(path: str) -> bytes:
        with open(path, "rb") as f:  # no writer: blocks
            return f.read()

    def interrupt() -> None:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        group.each([("node1", fifo), ("node2", fifo)], blocked)
    assert time.monotonic() - t0 < group.INTERRUPT_GRACE_S + 5
    stuck = [th for th in threading.enumerate() if th.name.startswith("fleet-node")]
    assert stuck and all(th.daemon for th in stuck)
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # let the threads go
    os.close(fd)
