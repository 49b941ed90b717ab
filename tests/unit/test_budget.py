"""The bounds under stock sshd limits (fleet/transport/budget.py): sessions per connection and
connections set up per host, with fake connections that count what is open at once."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import paramiko
import pytest

from fleet.config.inventory import Host
from fleet.errors import TransportError
from fleet.transport import budget, connection, ssh
from fleet.transport.budget import MAX_SESSIONS, MAX_STARTUPS, Budget, PerKey


class Peak:
    """How many are open now, and the most ever open at once."""

    def __init__(self) -> None:
        self.now = self.most = self.total = 0
        self.lock = threading.Lock()

    def up(self) -> None:
        with self.lock:
            self.now += 1
            self.total += 1
            self.most = max(self.most, self.now)

    def down(self) -> None:
        with self.lock:
            self.now -= 1


def test_a_budget_never_lends_more_than_its_limit_and_every_waiter_gets_its_turn() -> None:
    b, peak = Budget(3), Peak()

    def use() -> None:
        slot = b.take()
        peak.up()
        time.sleep(0.01)
        peak.down()
        slot.release()
        slot.release()  # twice: harmless

    threads = [threading.Thread(target=use) for _ in range(30)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert peak.total == 30 and peak.most == 3 and b.held == 0


def test_waiters_are_served_in_order_and_a_lost_connection_ends_the_wait() -> None:
    b = Budget(1)
    first = b.take()
    order: list[int] = []

    def wait(i: int) -> None:
        b.take().release()
        order.append(i)

    threads = []
    for i in range(5):
        threads.append(threading.Thread(target=wait, args=(i,)))
        threads[-1].start()
        time.sleep(0.02)  # queued one after the other
    first.release()
    for th in threads:
        th.join(10)
    assert order == [0, 1, 2, 3, 4]
    held = b.take()
    with pytest.raises(ConnectionError, match="gone"):
        b.take(lambda: "gone")
    held.release()
    with pytest.raises(ValueError):
        Budget(0)


def test_per_key_budgets_are_apart_and_taken_in_one_order() -> None:
    pk, peak = PerKey(2), Peak()

    def use(keys: list[object]) -> None:
        with pk.holding(keys):
            peak.up()
            time.sleep(0.01)
            peak.down()

    threads = [threading.Thread(target=use, args=([("a", 22), ("b", 22)][:: 1 - 2 * (i % 2)],))
               for i in range(12)]  # half want a then b, half b then a: no deadlock
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert not any(th.is_alive() for th in threads)
    assert peak.most == 2 and peak.total == 12
    assert pk.budget(("a", 22)).held == 0 and pk.budget(("c", 22)).held == 0


class FakeChannel:
    """An exec session that answers its framed script after `hold` seconds."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.status_event = threading.Event()
        self.closed = False
        self._out = b""
        self._ready = threading.Event()

    def exec_command(self, command: str) -> None:
        assert command == ssh.BOOT

    def settimeout(self, timeout: float | None) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        token = re.search(rb"FLEET-([0-9a-f]+)-BEGIN", data)
        assert token is not None
        t = token[1]
        self._out = b"\nFLEET-" + t + b"-BEGIN\nhi\nFLEET-" + t + b"-END\n"

    def shutdown_write(self) -> None:
        threading.Timer(self.server.hold, self._ready.set).start()

    def recv(self, n: int) -> bytes:
        self._ready.wait()
        out, self._out = self._out, b""
        if not out:
            self.status_event.set()
        return out

    def recv_stderr(self, n: int) -> bytes:
        self._ready.wait()
        return b""

    def recv_exit_status(self) -> int:
        return 0

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.server.peak.down()


class FakeServer:
    """A paramiko Transport as sshd with MaxSessions `limit`: a session past it is refused as
    sshd refuses it; the first `refuse` opens are refused whatever the count (a close not yet
    read)."""

    def __init__(self, limit: int = 10, hold: float = 0.02, refuse: int = 0) -> None:
        self.limit, self.hold, self.refuse = limit, hold, refuse
        self.peak = Peak()

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float | None = None) -> FakeChannel:
        with self.peak.lock:
            if self.peak.now >= self.limit or self.refuse > 0:
                self.refuse -= 1
                raise paramiko.ChannelException(2, "Connect failed")
        self.peak.up()
        return FakeChannel(self)


class FakeClient:
    def __init__(self, server: FakeServer) -> None:
        self.server = server

    def get_transport(self) -> FakeServer:
        return self.server


def transport(server: FakeServer) -> ssh.SSHTransport:
    t = ssh.SSHTransport(Host(name="node1", address="10.0.0.1"))
    t._client = FakeClient(server)  # type: ignore[assignment]
    return t


def test_many_commands_at_once_on_one_connection_stay_within_max_sessions() -> None:
    """64 port checks at once on the master's connection (a 64-host up): never more than
    MAX_SESSIONS open, the others wait their turn, all of them run."""
    server = FakeServer(limit=10)
    t = transport(server)
    results: list[Any] = []

    def one() -> None:
        results.append(t.run("true", timeout=30))

    threads = [threading.Thread(target=one) for _ in range(64)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert len(results) == 64 and all(r.ok and r.out == "hi" for r in results)
    assert server.peak.most == MAX_SESSIONS < 10 and server.peak.total == 64
    assert t.sessions.held == 0


def test_a_session_refused_for_a_moment_is_asked_for_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh, "REFUSED_PAUSES_S", (0.0, 0.0, 0.0))
    t = transport(FakeServer(refuse=2))
    assert t.run("true").out == "hi"
    stuck = transport(FakeServer(refuse=10))
    with pytest.raises(TransportError, match="refused a new session .* MaxSessions"):
        stuck.run("true")
    assert stuck.sessions.held == 0


def test_a_session_sshd_is_slow_to_open_is_not_called_a_lost_connection() -> None:
    """paramiko's open timing out on a connection still up: the host is said to be slow (64
    hosts on a loaded laptop), not lost; the slot goes back."""
    class Slow(FakeServer):
        def open_session(self, timeout: float | None = None) -> FakeChannel:
            raise paramiko.SSHException("Timeout opening channel.")

    t = transport(Slow())
    with pytest.raises(TransportError, match="node1's sshd did not open a session within 15s"
                       ) as e:
        t.run("true")
    assert "lost connection" not in str(e.value) and t.sessions.held == 0


def test_connections_set_up_at_once_per_sshd_stay_within_max_startups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight nodes behind one jump host, and a host listed twice: every sshd sees at most
    MAX_STARTUPS logins at once."""
    peaks: dict[tuple[str, int], Peak] = {}

    class FakeConn:
        def __init__(self, host: str, port: int, gateway: FakeConn | None = None) -> None:
            self.host, self.port, self.gateway = host, port, gateway
            self.connect_kwargs: dict[str, object] = {}
            self.connect_timeout = 5
            self.client = None

        def open(self) -> None:
            hops = [self] + ([self.gateway] if self.gateway else [])
            for c in hops:
                peaks.setdefault((c.host, c.port), Peak()).up()
            time.sleep(0.02)
            for c in hops:
                peaks[(c.host, c.port)].down()
            raise OSError("enough")  # the rest of open_client is not under test

    def fake(host: Host) -> FakeConn:
        if host.name == "twin":
            return FakeConn("10.0.0.9", 22)
        return FakeConn(host.address, 22, FakeConn("bastion", 2222))

    monkeypatch.setattr(connection, "ssh_connection", fake)
    monkeypatch.setattr(budget, "STARTUPS", PerKey(MAX_STARTUPS))
    monkeypatch.setattr(connection, "STARTUPS", budget.STARTUPS)
    hosts = [Host(name=f"n{i}", address=f"10.0.0.{i}") for i in range(8)] + \
        [Host(name="twin", address="10.0.0.9")] * 8

    def connect(h: Host) -> None:
        with pytest.raises(TransportError, match="enough"):
            connection.open_client(h)

    threads = [threading.Thread(target=connect, args=(h,)) for h in hosts]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert peaks[("bastion", 2222)].total == 8 and peaks[("10.0.0.9", 22)].total == 8
    assert peaks[("bastion", 2222)].most == MAX_STARTUPS
    assert peaks[("10.0.0.9", 22)].most == MAX_STARTUPS
