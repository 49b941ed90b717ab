"""Local port forwarding through fleet's own connection to a node: a listener on this machine's
127.0.0.1 (never another address), and for each connection made to it one made from the node
(Transport.open_port: an SSH direct-tcpip channel, or a plain socket for a local node), the
bytes relayed both ways by two threads, at most MAX_CONNECTIONS connections at once."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko

from fleet.config.inventory import Host
from fleet.config.schema import PortSpec
from fleet.console import Console, Meaning
from fleet.errors import FleetError, PortClosed, TransportError, UsageError
from fleet.transport.base import CHUNK, Stream, Transport

LOOPBACK = "127.0.0.1"
MAX_CONNECTIONS = 64  # at once; more wait in the listener's backlog until one ends
ACCEPT_TICK_S = 0.2  # how often the accepting thread looks up to see whether it should end


@dataclass(frozen=True)
class Tunnel:
    """What reaches a node's ports: a connected transport, the node's name, and the address
    the transport's end connects to (the node's own 127.0.0.1; on Slurm, the login node's
    connection to a compute node by its name)."""

    transport: Transport
    node: str
    address: str = LOOPBACK


class Forward:
    """One port forwarded: open() binds the listener, close() ends it and every connection;
    a connection the node refuses is said (`said`) and closed, the listener goes on. A lost
    connection to the node ends the forward: `lost` holds why."""

    def __init__(self, tunnel: Tunnel, spec: PortSpec, said: Callable[[str], None]) -> None:
        self.tunnel, self.spec, self.said = tunnel, spec, said
        self.local = spec.local
        self.lost: FleetError | None = None
        self.ended = threading.Event()
        self._listener: socket.socket | None = None
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: set[socket.socket | Stream] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.local}/"

    @property
    def where(self) -> str:
        return f"{self.tunnel.node}:{self.spec.port}"

    def open(self) -> Forward:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # A LOCALPORT given again right after a forward ended: its closed connections linger
        # in TIME_WAIT; they must not refuse the new listener (Linux still refuses a second one).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, self.spec.local))
            sock.listen(16)
        except OSError as e:
            sock.close()
            raise UsageError(f"cannot listen on {LOOPBACK}:{self.spec.local} here ({e.strerror}):"
                             " pick another LOCALPORT, or leave it out for a free one") from e
        sock.settimeout(ACCEPT_TICK_S)
        self._listener, self.local = sock, sock.getsockname()[1]
        self._start(self._accept)
        return self

    def _start(self, target: Callable[..., None], *args: object) -> None:
        th = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [th]
        th.start()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self.ended.is_set():
            if not self._slots.acquire(timeout=ACCEPT_TICK_S):
                continue
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                self._slots.release()
                continue
            except OSError:  # the listener was closed: the forward ends
                self._slots.release()
                return
            client.settimeout(None)
            self._start(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        node: Stream | None = None
        try:
            self._keep(client)
            try:
                node = self.tunnel.transport.open_port(self.tunnel.address, self.spec.port)
            except PortClosed as e:
                self.said(f"{e} (a service bound to another address of the node only is not "
                          f"reached: bind it to {LOOPBACK} or 0.0.0.0); still listening on "
                          f"{self.url}")
                return
            except FleetError as e:
                self.lost = e
                self.ended.set()
                return
            self._keep(node)
            up = threading.Thread(target=_pump, args=(client, node), daemon=True)
            up.start()
            _pump(node, client)
            up.join()
        finally:
            for s in (client, node):
                if s is not None:
                    self._drop(s)
            self._slots.release()

    def _keep(self, s: socket.socket | Stream) -> None:
        with self._lock:
            self._open.add(s)
        if self.ended.is_set():  # close() ran meanwhile: this one must not outlive it
            _close(s)

    def _drop(self, s: socket.socket | Stream) -> None:
        with self._lock:
            self._open.discard(s)
        _close(s)

    def close(self) -> None:
        """The listener and every connection closed, their threads ended."""
        self.ended.set()
        if self._listener is not None:
            _close(self._listener)
        with self._lock:
            streams, threads = list(self._open), list(self._threads)
        for s in streams:
            _close(s)
        for th in threads:
            th.join(5)


def direct_tcpip(t: paramiko.Transport, host: Host, address: str, port: int) -> Stream:
    """An SSH direct-tcpip channel on a node's connection: its sshd connects to address:port."""
    try:
        chan = t.open_channel("direct-tcpip", (address, port), (LOOPBACK, 0), timeout=10)
    except paramiko.ChannelException as e:
        if e.code == paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
            raise TransportError(f"{host.name}'s sshd does not forward connections "
                                 f"({e.text}: AllowTcpForwarding is off there)") from e
        raise PortClosed(f"{host.name}: nothing accepts connections on {address}:{port} "
                         f"there ({e.text})") from e
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise TransportError(f"lost connection to {host.address}: {e}") from e
    return chan  # type: ignore[no-any-return]


def _pump(src: socket.socket | Stream, dst: socket.socket | Stream) -> None:
    """src to dst until src ends; then dst hears the end (a half close: the other way may go
    on, as an HTTP client that sent its request waits for the answer)."""
    with contextlib.suppress(OSError, EOFError):
        while data := src.recv(CHUNK):
            dst.sendall(data)
    with contextlib.suppress(OSError, EOFError):
        dst.shutdown(socket.SHUT_WR)


def _close(s: socket.socket | Stream) -> None:
    """A shutdown first: a thread blocked in recv on a plain socket wakes only so."""
    with contextlib.suppress(OSError, EOFError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError, EOFError):
        s.close()


@contextlib.contextmanager
def forwarding(tunnel: Tunnel, specs: tuple[PortSpec, ...],
               console: Console) -> Iterator[list[Forward]]:
    """Each port forwarded, its URL said once; all of them closed at the end, however it
    comes. A local port that cannot be bound raises UsageError (nothing is left open)."""
    forwards: list[Forward] = []

    def said(text: str) -> None:
        console.phase(tunnel.node, text, Meaning.WARN)

    try:
        for spec in specs:
            forwards.append(Forward(tunnel, spec, said).open())
        for f in forwards:
            console.phase(tunnel.node, f"port {f.spec.port} forwarded: {f.url}", Meaning.OK)
        yield forwards
    finally:
        for f in forwards:
            f.close()


@contextlib.contextmanager
def declared(tunnel_of: Callable[[], Tunnel], specs: tuple[PortSpec, ...], console: Console,
             owned: bool = False) -> Iterator[None]:
    """The job's `forward` ports while fleet is attached (fleet up, fleet logs -f): a forward
    that cannot be made is said, and the run goes on without it. `owned`: the tunnel's
    transport is closed at the end too (a connection opened for the forwards alone)."""
    if not specs:
        yield
        return
    try:
        tunnel = tunnel_of()
    except FleetError as e:
        console.info(f"forward: not forwarded ({e})", Meaning.WARN)
        yield
        return
    with contextlib.ExitStack() as stack:
        if owned:
            stack.callback(tunnel.transport.close)
        for spec in specs:
            try:
                stack.enter_context(forwarding(tunnel, (spec,), console))
            except UsageError as e:
                console.info(f"forward: port {spec.port} not forwarded: {e}", Meaning.WARN)
        yield


def recorded(manifest: Path) -> tuple[PortSpec, ...]:
    """The job's `forward` as a run's manifest recorded it; none where it has none (an older
    run, or one not started yet)."""
    try:
        job = json.loads(manifest.read_text()).get("job", {})
        return tuple(PortSpec(int(f["port"]), int(f.get("local", 0)))
                     for f in job.get("forward", []))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return ()
