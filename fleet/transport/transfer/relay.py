"""One transfer to many nodes: their receivers started, linked in chains (each node passing the
stream on to the next), the stream sent to the head of each chain, and every report collected
and checked; every receiver ends on every way out."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet.console import Console
from fleet.errors import (
    HostError,
    WorkdirError,
)
from fleet.nodeside import ferry
from fleet.transport import openssh
from fleet.transport.base import Transport
from fleet.transport.transfer import verdict
from fleet.transport.transfer.plan import Move, Moved, chains, moved_bytes
from fleet.transport.transfer.progress import Bar
from fleet.transport.transfer.receiver import Receiver
from fleet.transport.transfer.report import (
    NodeState,
    human,
    takes_nothing,
)
from fleet.transport.transfer.verdict import STALL_S, STUCK_S, TAKES_S

START_S = 30.0  # a receiver that has not said it started by then: the node is not answering
LINK_S = ferry.CONNECT_S + 10.0
EXIT_S = 5.0  # a receiver that said it is done exits within this
TAMPER_GRACE_S = 5.0  # for the nodes of a broken stream to say their own word (_settle)


@dataclass(frozen=True)
class Target:
    """One node that receives: its connection, interpreter, the address the node before it
    connects to, and its absolute directory for each synced root."""

    name: str
    t: Transport
    python: str
    address: str
    roots: tuple[str, ...]


@dataclass
class Outcome:
    """What the transfer did: per node the sha256 of every file placed, by (root, rel), and
    what it got of each root."""

    placed: dict[str, dict[tuple[int, str], str]] = field(default_factory=dict)
    moved: dict[str, dict[int, Moved]] = field(default_factory=dict)


class Transfer:
    """One transfer to the targets: start, link, stream, collect; every receiver is ended on
    every way out (close())."""

    def __init__(self, targets: list[Target], moves: list[Move], console: Console,
                 relay: bool = True) -> None:
        self.targets = {t.name: t for t in targets}
        self.order = [t.name for t in targets]
        self.moves = moves
        self.console = console
        self.relay = relay and len(targets) > 1
        self.changed = threading.Condition()
        self.states = {n: NodeState(n) for n in self.order}
        self.recv: dict[str, Receiver] = {}
        self.key = secrets.token_hex(32)
        self.shas: dict[tuple[int, str], str] = {}  # what was sent, as hashed here
        self.cause: str | None = None  # the first receiver that ended before the end
        self.silent = False  # ... or stopped answering (_watch)
        self.stuck = False  # ... or, with every other, placed nothing for STUCK_S
        self.deaf: tuple[str, str] | None = None  # ... or took nothing from the one before it
        self.routes: list[list[str]] = [[n] for n in self.order]
        self.finished = False
        for m in moves:
            for w in m.writers:
                self.states[self.order[w]].expected += m.local.size

    def run(self) -> Outcome:
        out = Outcome()
        try:
            self._start()
            routes = self._link()
            total = sum(moved_bytes(m) for m in self.moves)
            if total:
                way = "; ".join(" -> ".join(["this machine", *c]) for c in routes)
                files = sum(1 for m in self.moves if m.writers and moved_bytes(m))
                nodes = len({w for m in self.moves for w in m.writers})
                self.console.info(f"data: streaming {human(total)} ({files} file(s)) to "
                                  f"{nodes} node(s): {way}")
            heads = [self.recv[c[0]] for c in routes]
            for st in self.states.values():
                st.last = st.moved = time.monotonic()
            threading.Thread(target=self._watch, daemon=True, name="ferry-watch").start()
            self._stream(heads)
            self._wait_done()
            with self.changed:
                self.finished = True
            self._check()
            for r in self.recv.values():  # each receiver has exited before fleet goes on
                r.pipe.status(EXIT_S)
            for i, name in enumerate(self.order):
                out.placed[name] = self._placed(i, name)
            return out
        finally:
            self.close()

    def close(self) -> None:
        for r in list(self.recv.values()):
            r.close()

    def _lost(self, name: str) -> None:
        """A receiver ended before the end: the transfer cannot complete, so it ends now for
        every node (one waiting on the lost one would wait for its stall deadline). One that
        found what reached it altered first lets the nodes before it in its chain finish
        their own look at the same bytes (at most TAMPER_GRACE_S): the first of a chain to
        find it names the one that altered it, and closing them sooner would blame an
        innocent relay (verdict.check_tampered). One that could not pass the data on lets
        the nodes after it say why (one that found it altered among them)."""
        with self.changed:
            if self.cause is not None or self.finished:
                return
            self.cause = name
            error = self.states[name].error or {}
            if error.get("tampered") or error.get("relay") == "out":
                self._settle([n for route in self.routes if name in route
                              for n in (route[:route.index(name)] if error.get("tampered")
                                        else route[route.index(name) + 1:])])
        self.close()

    def _settle(self, names: list[str]) -> None:
        """Until each of these nodes has said its end (ended, done or its error), at most
        TAMPER_GRACE_S; with self.changed held."""
        deadline = time.monotonic() + TAMPER_GRACE_S
        while any(not (self.states[n].ended or self.states[n].done or self.states[n].error)
                  for n in names):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.changed.wait(left)

    def _placed(self, i: int, name: str) -> dict[tuple[int, str], str]:
        """Every file node i should have placed, with the hash it reported: equal to this
        machine's, else the transfer failed (HostError)."""
        ok = self.states[name].ok
        placed, wrong = {}, []
        for m in self.moves:
            key = (m.root, m.local.rel)
            if i in m.touchers:
                if key not in ok:
                    wrong.append(f"{m.local.rel} (not confirmed)")
                placed[key] = m.local.sha or ""
            elif i in m.writers:
                sha, mine = ok.get(key), self.shas.get(key)
                if sha is None or sha != mine:
                    why = "not confirmed" if sha is None else "a different sha256"
                    wrong.append(f"{m.local.rel} ({why})")
                placed[key] = sha or ""
        if wrong:
            raise HostError("sending data", {name: "did not verify " + ", ".join(wrong[:3]) +
                                             (" and more" if len(wrong) > 3 else "")})
        return placed

    # -- start and link
    def _start(self) -> None:
        bulk = sum(moved_bytes(m) for m in self.moves) >= openssh.BULK_MIN

        def start(i: int, name: str) -> None:
            tg = self.targets[name]
            listen = tg.address if self.relay and i > 0 else None
            # The head of the chain is fed from here: the bulk of the bytes (openssh).
            self.recv[name] = Receiver(name, tg.t, tg.python, listen, self.states[name],
                                       self.changed, self._lost,
                                       bulk=bulk and (i == 0 or not self.relay))
        for i, name in enumerate(self.order):
            start(i, name)
        # Nothing is sent before the program said it runs: /bin/sh, which reads the program
        # from the same stdin, might take it as more of its script.
        listening = {n for i, n in enumerate(self.order) if self.relay and i > 0}
        self._wait(lambda s: s.started and (s.port is not None or s.name not in listening),
                   START_S, "start its receiver", self.order)
        for i, name in enumerate(self.order):
            nxt = self.order[i + 1] if self.relay and i + 1 < len(self.order) else None
            if nxt and not self.states[nxt].port:  # it cannot listen: fed from here
                self.states[name].linked = False
                self.states[name].link_why = self.states[nxt].link_why
                nxt = None
            self.recv[name].send({
                "key": self.key, "me": i, "roots": list(self.targets[name].roots),
                "next": [self.targets[nxt].address, self.states[nxt].port] if nxt else None})

    def _link(self) -> list[list[str]]:
        linking = self.order[:-1] if self.relay else []
        self._wait(lambda s: s.linked is not None, LINK_S, "connect to the next node", linking)
        linked = {n: bool(self.states[n].linked) for n in linking}
        routes = self.routes = chains(self.order, linked)
        for n in linking:
            if not linked[n]:
                nxt = self.order[self.order.index(n) + 1]
                self.console.info(
                    f"data: {n} cannot reach {nxt} ({self.targets[nxt].address}) for the relay "
                    f"({self.states[n].link_why}): {nxt} gets the data from this machine "
                    "directly (this machine's uplink carries it once more)")
        for route in routes:
            for j, name in enumerate(route):
                self.recv[name].send({"source": "stdin" if j == 0 else "socket",
                                      "forward": j + 1 < len(route)})
        return routes

    # -- the stream
    def _stream(self, heads: list[Receiver]) -> None:
        total = sum(moved_bytes(m) for m in self.moves)
        bar = Bar(self.console, total, self.states, self.order)
        relayed = [self.recv[n] for n in self.order if self.recv[n] not in heads]

        def word(obj: dict[str, object]) -> None:
            """fleet's own word to the nodes the stream reaches through another node (see
            ferry.Word): what they verify against, over their own connection."""
            for r in relayed:
                r.send(obj)

        frames = [0]

        def write(data: bytes) -> None:
            frames[0] += 1
            for h in heads:
                if self.states[h.name].ended:
                    raise OSError(f"{h.name} stopped reading")
                h.pipe.send(data)
            bar.tick()

        changed: list[str] = []
        try:
            for m in self.moves:
                lf = m.local
                if m.writers:
                    blocks = None if m.blocks is None else list(m.blocks)
                    word({"file": [m.root, lf.rel, lf.size, lf.mode, lf.mtime_ns, blocks,
                                   list(m.writers)]})
                    began = frames[0]
                    try:
                        sha = self.shas[(m.root, lf.rel)] = ferry.send_file(
                            write, m.root, lf.rel, str(lf.path), lf.size, lf.mtime_ns, lf.mode,
                            blocks, list(m.writers), list(lf.blocks) if lf.blocks else None,
                            lf.sha)
                        word({"sha": [m.root, lf.rel, sha]})
                    except (ferry.Changed, ferry.Unreadable) as e:
                        changed.append(str(lf.path) if isinstance(e, ferry.Changed)
                                       else f"{lf.path} ({e})")
                        if frames[0] == began:  # not one frame of it sent: the next is another
                            word({"skip": [m.root, lf.rel]})
                if m.touchers:
                    touch = {"root": m.root, "path": lf.rel, "mtime": lf.mtime_ns,
                             "mode": lf.mode, "for": list(m.touchers)}
                    write(ferry.meta(b"T", touch))
                    word({"touch": touch})
            write(ferry.frame(b"Z", b""))
            word({"end": True})
        except OSError as e:
            with self.changed:  # a node's own error says more than the broken pipe: heard out
                self._settle(self.order)
            self._check()
            raise HostError("sending data", {h.name: f"the transfer broke: {e}"
                                             for h in heads}) from e
        finally:
            bar.end()
        if changed:
            raise WorkdirError(
                f"{', '.join(changed[:3])}{' and more' if len(changed) > 3 else ''} changed "
                "while fleet sent it (or could no longer be read); nothing was started. What "
                "arrived on the nodes is kept: run `fleet up` again once the files are "
                "written, and only the rest moves")

    def _wait_done(self) -> None:
        def finished() -> bool:
            return all(s.done or s.ended or s.error for s in self.states.values())
        with self.changed:
            while not finished() and self.cause is None:
                self.changed.wait(0.2)

    def _watch(self) -> None:
        """From the first frame to the end: the first node (in the relay's order) silent for
        STALL_S ends the transfer for all, named (a write to a node behind a cut link would
        otherwise wait for TCP's own limit, about 15 minutes)."""
        while True:
            time.sleep(0.5)
            with self.changed:
                if self.finished or self.cause is not None:
                    return
                now = time.monotonic()
                going = [n for n in self.order if not (self.states[n].done
                                                        or self.states[n].ended)]
                silent = [n for n in going if now - self.states[n].last > STALL_S]
                stuck = [n for n in going if now - self.states[n].moved > STUCK_S]
                deaf = takes_nothing(self.routes, self.states, now, TAKES_S)
                if not silent and not deaf and len(stuck) < len(going):
                    continue
                self.cause = silent[0] if silent else deaf[1] if deaf else stuck[0]
                self.silent = bool(silent)
                self.deaf = None if silent else deaf
                self.stuck = not silent and not deaf
                self.changed.notify_all()
            self.close()
            return

    def _check(self) -> None:
        """Every node that failed, judged by verdict.check from what the receivers said and
        how the watch ended the transfer."""
        verdict.check(self.states, self.routes, verdict.Ending(self.cause, self.silent,
                                                               self.stuck, self.deaf),
                      self._last_err)

    def _check_tampered(self) -> None:
        verdict.check_tampered(self.states, self.routes)

    def _last_err(self, name: str) -> list[str]:
        """The last line its receiver wrote on stderr, if any."""
        return self.recv[name].pipe.err().strip().splitlines()[-1:] if name in self.recv else []

    def _wait(self, said: Callable[[NodeState], bool], timeout: float, what: str,
              names: list[str]) -> None:
        """Until every named receiver said it (`said`); else HostError naming each that did
        not, and why."""
        deadline = time.monotonic() + timeout
        states = [self.states[n] for n in names]
        with self.changed:
            while not all(said(s) for s in states):
                if any(s.ended and not said(s) for s in states) or time.monotonic() > deadline:
                    break
                self.changed.wait(0.2)
        bad = {}
        for s in states:
            if said(s) or (self.cause is not None and s.name != self.cause):
                continue
            if s.ended:
                err = self.recv[s.name].pipe.err().strip()
                bad[s.name] = f"its receiver ended before it could {what}" + \
                    (f": {err.splitlines()[-1]}" if err else "")
            else:
                bad[s.name] = f"no answer in {timeout:.0f}s to {what}"
        if bad:
            raise HostError("sending data", bad)
