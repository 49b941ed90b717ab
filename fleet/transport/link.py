"""A node's connection through a run: asked every HEARTBEAT_S, replaced by a fresh one when it no
longer answers, and given up only when neither answers within the job's `unreachable_after`.

A cut link does not end a TCP stream for many minutes, and a stalled sshd keeps it open without
a word: only a question with a deadline tells. Each wait here has its own thread and deadline,
so that no call blocked inside paramiko (opening a channel, a banner) can stretch the limit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from fleet.config.watchdog import HEARTBEAT_S
from fleet.errors import FleetError, TransportError
from fleet.transport import open_transport
from fleet.transport.base import Transport
from fleet.transport.group import reason

R = TypeVar("R")
RETRY_S = 1.0  # between fresh connections tried for one purpose


def within(fn: Callable[[], R], timeout: float,
           late: Callable[[R], None] | None = None) -> R | Exception | None:
    """fn() in a thread of its own, waited for `timeout` seconds at most: its result, the
    exception it raised, or None if it had not finished; a result that comes after that goes
    to late() (a connection nobody will use is closed there)."""
    box: list[R | Exception] = []
    lock = threading.Lock()
    given_up = [False]

    def run() -> None:
        try:
            value: R | Exception = fn()
        except Exception as e:
            value = e
        with lock:
            if not given_up[0]:
                box.append(value)
                return
        if late is not None and not isinstance(value, Exception):
            late(value)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(max(timeout, 0.0))
    with lock:
        if box:
            return box[0]
        given_up[0] = True
        return None


def reconnect(old: Transport, timeout: float) -> Transport:
    """A fresh connection to old's host that answered a command within `timeout`, knowing what
    the old one learnt of the node (home, shell, rc noise, clock)."""
    def connect() -> Transport:
        t = open_transport(old.host, hello=False)
        try:
            t.run("true", timeout=max(timeout, 1.0), what="answer on a fresh connection")
        except BaseException:
            t.close()
            raise
        t.home, t.shell, t.noise = old.home, old.shell, old.noise
        t.clock_offset, t.sftp_problem = old.clock_offset, old.sftp_problem
        return t

    got = within(connect, timeout, late=lambda t: t.close())
    if isinstance(got, Transport):
        return got
    if got is None:
        raise TransportError(f"a fresh connection to {old.host.address} did not answer within "
                             f"{timeout:.0f}s")
    if isinstance(got, FleetError):
        raise got
    raise TransportError(f"a fresh connection to {old.host.address} failed: {reason(got)}")


def refused(e: BaseException) -> bool:
    """Whether a connection failed because the node refused it (nothing listens on its ssh
    port: sshd gone, the host rebooting): an answer, unlike silence, so nothing to wait for."""
    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Link:
    """One node's connection in a run, shared by everything that talks to the node (its log,
    its end, the heartbeat, the stop): `t` is the one in place now. A stream that broke waits
    for a newer one (recover), which the heartbeat, the stop or the stream itself puts in
    place, until the link is given up."""

    def __init__(self, transports: dict[str, Transport], name: str, limit: float,
                 connect: Callable[[Transport, float], Transport] = reconnect) -> None:
        self.transports, self.name, self.limit, self.connect = transports, name, limit, connect
        self.cond = threading.Condition()
        self.generation = 0  # how many times the connection was replaced
        self.given_up = False

    @property
    def t(self) -> Transport:
        return self.transports[self.name]

    def fresh(self, timeout: float, generation: int) -> Transport:
        """A fresh connection that answered, now in place of the one of `generation` (unless
        another has replaced that already: then that other one); TransportError says why
        not."""
        old = self.t
        t = self.connect(old, timeout)
        with self.cond:
            newer = generation != self.generation
            if not newer:
                self.transports[self.name] = t
                self.generation += 1
                self.cond.notify_all()
        (t if newer else old).close()
        return self.t

    def give_up(self) -> None:
        """Nothing waits for a newer connection any more; the one in place is closed."""
        with self.cond:
            self.given_up = True
            self.cond.notify_all()
        self.t.close()

    def recover(self, generation: int, stop: threading.Event) -> bool:
        """After a stream on the connection of `generation` broke: True once a newer one is in
        place (tried here, every RETRY_S), False once the link is given up or `stop` is set."""
        while not stop.is_set():
            with self.cond:
                if self.given_up:
                    return False
                if self.generation != generation:
                    return True
            try:
                self.fresh(self.limit, generation)
                return True
            except FleetError as e:
                if refused(e):  # its connection broke and the node refuses a new one: down
                    self.give_up()
                    return False
                with self.cond:
                    self.cond.wait(RETRY_S)
        return False

    def answers(self, timeout: float) -> tuple[str | None, bool]:
        """(None, False) if the node answers within `timeout`, on its connection or else a
        fresh one (then put in place); else why not, and whether that is final (its
        connection broke and it refused a fresh one)."""
        deadline = time.monotonic() + timeout
        generation, t = self.generation, self.t
        probe = max(timeout / 2, min(timeout, HEARTBEAT_S))
        got = within(lambda: t.run("true", timeout=probe, what="heartbeat"), probe)
        if got is not None and not isinstance(got, Exception):
            return None, False
        why = f"no answer within {probe:.0f}s" if got is None else reason(got)
        try:
            self.fresh(max(deadline - time.monotonic(), 0.5), generation)
        except FleetError as e:
            return f"{why}; {e}", got is not None and refused(e)
        return None, False

    def keep(self, stop: threading.Event, ended: Callable[[], bool],
             on_lost: Callable[[str], None]) -> None:
        """Ask the node every HEARTBEAT_S until `stop` or ended(); on_lost(why) once it has
        answered nothing for `limit` seconds."""
        last = time.monotonic()
        while not stop.wait(HEARTBEAT_S):
            if ended():
                return
            why, final = self.answers(max(self.limit - (time.monotonic() - last), 1.0))
            if why is None:
                last = time.monotonic()
                continue
            if final and not stop.is_set() and not ended():
                on_lost(f"its connection broke and it refuses new ones (sshd is gone, or the "
                        f"host restarts): {why}")
                return
            silent = time.monotonic() - last
            if silent >= self.limit and not stop.is_set() and not ended():
                on_lost(f"no answer for {silent:.0f}s on its connection or a fresh one "
                        f"(watchdog.unreachable_after = {self.limit:g}s): {why}")
                return
