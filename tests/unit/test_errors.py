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
from fleet.transport.group import all_ok


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
    import contextlib
    import os
    import signal
    import tempfile
    import threading
    import time

    import pytest

    from fleet.transport import group

    fifo = os.path.join(tempfile.mkdtemp(), "fifo")
    os.mkfifo(fifo)

    returned: list[str] = []

    def blocked(path: str) -> bytes:
        with open(path, "rb") as f:  # no writer: blocks
            data = f.read()
        returned.append(path)
        return data

    def unblock() -> None:
        with contextlib.suppress(OSError):  # no reader left: nothing to let go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    def interrupt() -> None:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    # A hang guard: were the interrupt to wait on the calls, they end after 30 s (far past the
    # grace) and the test fails below instead of hanging.
    guard = threading.Timer(30, unblock)
    guard.start()
    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            group.each([("node1", fifo), ("node2", fifo)], blocked)
        assert returned == []  # the interrupt came while both calls were still blocked
        stuck = [th for th in threading.enumerate() if th.name.startswith("fleet-node")]
        assert stuck and all(th.daemon for th in stuck)
    finally:
        guard.cancel()
        unblock()  # let the threads go


def test_a_write_over_the_exec_channel_is_not_cut_by_the_sftp_watch() -> None:
    """The progress watch is SFTP's: a write over the exec channel (no SFTP, or a garbled one),
    as slow as it is, keeps its own per-chunk deadlines and is never aborted by it."""
    import time

    from fleet.config.inventory import Host
    from fleet.transport.ssh import SSHTransport

    class NoSftp(SSHTransport):
        STALL_S = 0.3
        aborted = False

        def _sftp_client(self) -> None:  # type: ignore[override]
            return None

        def _exec_put(self, path: str, data: bytes, mode: int) -> str:
            time.sleep(1.0)  # three stall limits, moving nothing the watch could see
            return ""

        def _abort(self) -> None:
            NoSftp.aborted = True

    t = NoSftp(Host("node1", "10.0.0.1"))
    assert t._put("/x", b"data", 0o600) == ""
    time.sleep(0.5)
    assert not NoSftp.aborted


def test_paramiko_thread_errors_stay_off_stderr_unless_debug() -> None:
    """A transport thread's error (a node's sshd gone mid-handshake) is logged by paramiko with a
    traceback; fleet says what failed in its own words, and shows paramiko's only with --debug."""
    import subprocess
    import sys

    program = ("import logging, sys\n"
               "from fleet.cli import _quiet_libraries\n"
               "_quiet_libraries(sys.argv[1] == 'debug')\n"
               "logging.getLogger('paramiko.transport').error("
               "'Traceback (most recent call last): banner')\n")
    quiet = subprocess.run([sys.executable, "-c", program, "plain"], capture_output=True,
                           text=True, timeout=60)
    loud = subprocess.run([sys.executable, "-c", program, "debug"], capture_output=True,
                          text=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert "Traceback (most recent call last): banner" in loud.stderr
