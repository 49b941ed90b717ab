"""Moving large files to nodes: streamed, verified, only what changed, each byte once over this
machine's uplink.

The engine is fleet.nodeside.ferry (its docstring has the stream's format); this module is this
machine's side of it, in four steps:

1. What each node lacks (`needs`, pure): from its listing, the files whose size or time differ;
   of those it holds (the file, or a partial one an interrupted transfer left), the blocks whose
   hashes differ, from one `ferry hash` on the node (`parse_held`) and the same hashes here. A
   file whose content is already there (a `touch`) only gets its time set.
2. The route (`chains`, pure): the nodes in one chain, this machine sending to the first and
   each node passing the stream on to the next over TCP (they reach each other for torch
   anyway), pipelined, so that N nodes take about as long as one. A link that cannot be made
   splits the chain there: the node after it is fed from here, and the console says so.
3. The stream: every file once, read here in blocks, hashed as it is read, sent to the head of
   every chain. Nothing is held whole in memory.
4. The reports (`parse_report`, pure): every node says what it placed, what it verified
   (sha256 of what it assembled, compared with this machine's), and what failed, which ends
   in one HostError naming the host, the path and what to do.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.console import Console, printable
from fleet.errors import (
    FleetError,
    HostError,
    RemoteCommandError,
    TransportError,
    WorkdirError,
    host_error,
)
from fleet.nodedata import number
from fleet.nodeside import ferry
from fleet.shell import quote
from fleet.transport import Pipe, Transport
from fleet.transport.group import each
from fleet.transport.sync import (
    Manifest,
    Scan,
    SyncStats,
    changed,
    code_entries,
    listing_script,
    parse_listing,
    send,
)

AGENT = Path(ferry.__file__).read_text()
# The node's python runs the agent from file descriptor 3 (a here-document): its command line
# stays short (`ps` shows this, not the whole program) and its stdin free for the stream.
LOADER = ("import os,sys;sys.argv[0]='fleet-ferry';"
          "exec(compile(os.fdopen(3,encoding='utf-8').read(),'fleet-ferry','exec'))")


def agent(python: str, args: str, stdin: str = "") -> str:
    """The sh command that runs the agent with these (already quoted) arguments, a
    here-document as its stdin where given."""
    text = f"{quote(python)} -c {quote(LOADER)} {args} 3<<'FLEET_FERRY_CODE'"
    if stdin:
        text += " <<'FLEET_FERRY_IN'"
    text += f"\n{AGENT}\nFLEET_FERRY_CODE"
    if stdin:
        text += f"\n{stdin}\nFLEET_FERRY_IN"
    return text
START_S = 30.0  # a receiver that has not said it started by then: the node is not answering
LINK_S = ferry.CONNECT_S + 10.0
# A node that says nothing for this long, before its end, stopped answering (a cut link, a
# frozen host): every receiver says where it is twice a second, whatever it waits on.
STALL_S = 25.0
# No byte placed on any node for this long: the transfer is stuck (a link between two nodes
# that moves nothing, a node that talks but does not take the stream).
STUCK_S = ferry.STALL_S + 30.0
EXIT_S = 5.0  # a receiver that said it is done exits within this
LINE_MAX = 1 << 16  # a report line longer than this is not a report
PROGRESS_LINE_S = 10.0  # without a terminal, a progress line this often


# ---- 0. whether a node's changes are streamed at all -------------------------------------------
BUNDLE_MAX = 8 << 20  # a node's changes up to this size go in its one bundle (transport.sync.send)


def streams(changed_bytes: int, resumes: bool) -> bool:
    """A node's changes are streamed when they are larger than BUNDLE_MAX, or when a partial
    file of an interrupted transfer is there to resume; else they go in its one bundle, with
    the run's own files (one round trip, no receiver to start)."""
    return changed_bytes > BUNDLE_MAX or resumes


# ---- 1. what each node lacks --------------------------------------------------------------------
@dataclass(frozen=True)
class Held:
    """What a node holds of a file: its partial file's pieces ("part") or the file's ("file")."""

    kind: str
    size: int
    sha: str
    blocks: tuple[str, ...]


def hash_script(python: str, root: str, rels: list[str]) -> str:
    return agent(python, f"hash {quote(root)}", json.dumps(rels))


def parse_held(out: str, asked: set[str]) -> dict[str, Held]:
    """`ferry hash`'s lines; a line for a path not asked, or malformed, is skipped."""
    held: dict[str, Held] = {}
    d = ferry.DIGEST_HEX
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) != 5:
            continue
        try:
            rel = json.loads(parts[0])
        except ValueError:
            continue
        size = number(parts[2])
        blocks = parts[4]
        if (not isinstance(rel, str) or rel not in asked or parts[1] not in ("part", "file")
                or size is None or len(parts[3]) != 64 or len(blocks) % d
                or len(blocks) // d != ferry.blocks_of(size)):
            continue
        held[rel] = Held(parts[1], size, parts[3],
                         tuple(blocks[i:i + d] for i in range(0, len(blocks), d)))
    return held


@dataclass(frozen=True)
class Local:
    """A file here, as the stream sends it."""

    rel: str
    path: Path
    size: int
    mtime_ns: int
    mode: int
    sha: str | None = None  # known only where a node holds a version to compare with
    blocks: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Need:
    """What one node needs of one file: nothing, its time only ("touch"), some blocks, or all
    (blocks None)."""

    touch: bool = False
    blocks: tuple[int, ...] | None = None


def need(local: Local, held: Held | None) -> Need:
    if held is None or local.blocks is None:
        return Need()
    if held.kind == "file" and held.size == local.size and held.sha == local.sha:
        return Need(touch=True)
    return Need(blocks=tuple(i for i, b in enumerate(local.blocks)
                             if i >= len(held.blocks) or held.blocks[i] != b))


def candidates(rels: list[str], there: Manifest) -> list[str]:
    """Of the changed files, those the node holds something of (the file, a partial one)."""
    return [r for r in rels if r in there or ferry.part_name(r) in there]


@dataclass(frozen=True)
class Move:
    """One file of the stream: the blocks sent (None: all) and who writes or only touches it."""

    root: int
    local: Local
    blocks: tuple[int, ...] | None
    writers: tuple[int, ...]
    touchers: tuple[int, ...]


def plan_moves(files: list[tuple[int, Local, dict[int, Need]]]) -> list[Move]:
    """Per file, what the stream carries: the union of what its writers need (every block if
    any needs every block; each writer takes the others from what it holds)."""
    moves = []
    for root, local, needs in files:
        writers = tuple(sorted(n for n, nd in needs.items() if not nd.touch))
        touchers = tuple(sorted(n for n, nd in needs.items() if nd.touch))
        if not writers and not touchers:
            continue
        blocks: tuple[int, ...] | None = ()
        for n in writers:
            nb = needs[n].blocks
            blocks = None if nb is None or blocks is None else tuple(sorted({*blocks, *nb}))
        moves.append(Move(root, local, blocks, writers, touchers))
    return moves


def moved_bytes(m: Move) -> int:
    if m.blocks is None:
        return m.local.size
    return sum(ferry.block_len(m.local.size, i) for i in m.blocks)


# ---- 2. the route -------------------------------------------------------------------------------
def chains(order: list[str], linked: dict[str, bool]) -> list[list[str]]:
    """The nodes in order, cut after every node whose link to the next failed."""
    out: list[list[str]] = []
    for name in order:
        if out and linked.get(out[-1][-1], False):
            out[-1].append(name)
        else:
            out.append([name])
    return out


# ---- 4. reports ---------------------------------------------------------------------------------
@dataclass
class NodeState:
    """What one receiver said so far."""

    name: str
    expected: int = 0  # bytes it places
    at: int = 0
    started: bool = False  # its program runs: what is sent now reaches it, not the shell
    port: int | None = None
    linked: bool | None = None
    link_why: str = ""
    ok: dict[tuple[int, str], str] = field(default_factory=dict)  # (root, rel) -> sha256
    error: dict[str, object] | None = None
    done: bool = False
    ended: bool = False  # its output ended
    last: float = field(default_factory=time.monotonic)  # when it last said anything
    moved: float = field(default_factory=time.monotonic)  # when its bytes in place last grew


def parse_report(line: bytes) -> dict[str, object] | None:
    """One report line as a dict of known shape, or None (noise, or not a report)."""
    if len(line) > LINE_MAX:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not obj:
        return None
    key, value = next(iter(obj.items()))
    if len(obj) > 1 and not (key in ("linked", "port") and set(obj) == {key, "why"}):
        return None
    checks: dict[str, Callable[[object], bool]] = {
        "port": lambda v: _int(v) and 0 <= v < 65536,  # type: ignore[operator]
        "linked": lambda v: isinstance(v, bool),
        "at": lambda v: _int(v) and v >= 0,  # type: ignore[operator]
        "ok": lambda v: (isinstance(v, list) and len(v) == 3 and isinstance(v[0], int)
                         and not isinstance(v[0], bool) and isinstance(v[1], str)
                         and isinstance(v[2], str) and len(v[2]) in (0, 64)),
        "gave_up": lambda v: isinstance(v, list),
        "error": lambda v: isinstance(v, dict),
        "done": lambda v: isinstance(v, dict),
    }
    if key not in checks or not checks[key](value):
        return None
    if key in ("linked", "port"):
        why = obj.get("why")
        return {key: value, "why": why if isinstance(why, str) else ""}
    return obj


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def problem_text(err: dict[str, object]) -> str:
    """A receiver's error, as the user reads it: what, where, what to do."""
    path = printable(str(err.get("path") or ""))  # a node's words: shown, never obeyed
    msg = printable(str(err.get("msg") or "failed"))
    free = err.get("free")
    if err.get("errno") in ("ENOSPC", "EDQUOT"):
        room = f" ({_size(free)} free there)" if isinstance(free, int) else ""
        part = posixpath.join(posixpath.dirname(path), "." + posixpath.basename(path) +
                              ferry.PART)
        kept = (f"What arrived is kept (in {part}): the next `fleet up` sends only the rest"
                if err.get("kept") else "Nothing of that file was kept")
        return (f"no space left writing {path}{room}: free space there, or set `workdir` for "
                f"this host to a larger disk. {kept}")
    if path:
        return f"cannot write {path}: {msg}"
    return msg


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "?"
    if n < 1024:
        return f"{n} bytes"
    x = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        x /= 1024
        if x < 1024 or unit == "TiB":
            break
    return f"{x:.1f} {unit}"


def human(n: int) -> str:
    return _size(n)


# ---- the receivers ------------------------------------------------------------------------------
class Receiver:
    """One node's `ferry recv`, its reports read in a thread of their own."""

    def __init__(self, name: str, t: Transport, python: str, listen: str | None,
                 state: NodeState, changed: threading.Condition,
                 lost: Callable[[str], None]) -> None:
        self.name, self.state, self.changed, self.lost = name, state, changed, lost
        self.mark = f"FERRY-{secrets.token_hex(8)}"
        script = "exec " + agent(python, f"recv {self.mark}" +
                                 (f" {quote(listen)}" if listen else ""))
        self.pipe: Pipe = t.pipe(script)
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"ferry-{name}")
        self.reader.start()

    def _read(self) -> None:
        buf = b""
        started = False
        try:
            while chunk := self.pipe.recv(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not started:
                        started = line.strip() == self.mark.encode()
                        if started:
                            with self.changed:
                                self.state.started = True
                                self.changed.notify_all()
                        continue
                    self._take(parse_report(line))
                if len(buf) > LINE_MAX:
                    break  # not a report: the node is not speaking the protocol
        finally:
            with self.changed:
                self.state.ended = True
                self.changed.notify_all()
            if not self.state.done:
                self.lost(self.name)

    def _take(self, r: dict[str, object] | None) -> None:
        if r is None:
            return
        s = self.state
        with self.changed:
            s.last = time.monotonic()
            if "port" in r:
                s.port = r["port"]  # type: ignore[assignment]
                s.link_why = printable(str(r["why"]))  # 0: it cannot listen, and why
            elif "linked" in r:
                s.linked, s.link_why = bool(r["linked"]), printable(str(r["why"]))
            elif "at" in r:
                if r["at"] != s.at:
                    s.moved = s.last
                s.at = r["at"]  # type: ignore[assignment]
            elif "ok" in r:
                ok: list[object] = r["ok"]  # type: ignore[assignment]
                s.ok[(int(ok[0]), str(ok[1]))] = str(ok[2])  # type: ignore[call-overload]
            elif "error" in r and s.error is None:
                s.error = r["error"]  # type: ignore[assignment]
            elif "done" in r:
                s.done = True
            self.changed.notify_all()

    def send(self, obj: dict[str, object]) -> None:
        self.pipe.send(json.dumps(obj).encode() + b"\n")

    def close(self) -> None:
        self.pipe.close()


@dataclass(frozen=True)
class Target:
    """One node that receives: its connection, interpreter, the address the node before it
    connects to, and its absolute directory for each synced root."""

    name: str
    t: Transport
    python: str
    address: str
    roots: tuple[str, ...]


@dataclass(frozen=True)
class Moved:
    """What one node got of one synced directory: files written, the bytes sent for them,
    the bytes of them it already held (verified, kept), files only touched."""

    files: int = 0
    sent: int = 0
    kept: int = 0
    touched: int = 0


def moved_per_node(moves: list[Move]) -> dict[tuple[int, int], Moved]:
    """(node index, root) -> Moved. A writer writes every block the stream carries for its
    file (the union of what its writers need), and keeps the rest from what it holds."""
    out: dict[tuple[int, int], Moved] = {}
    for mv in moves:
        sent = moved_bytes(mv)
        for i in mv.writers:
            m = out.get((i, mv.root), Moved())
            out[(i, mv.root)] = Moved(m.files + 1, m.sent + sent,
                                      m.kept + mv.local.size - sent, m.touched)
        for i in mv.touchers:
            m = out.get((i, mv.root), Moved())
            out[(i, mv.root)] = Moved(m.files, m.sent, m.kept, m.touched + 1)
    return out


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
        every node (one waiting on the lost one would wait for its stall deadline)."""
        with self.changed:
            if self.cause is not None or self.finished:
                return
            self.cause = name
        self.close()

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
        def start(i: int, name: str) -> None:
            tg = self.targets[name]
            listen = tg.address if self.relay and i > 0 else None
            self.recv[name] = Receiver(name, tg.t, tg.python, listen, self.states[name],
                                       self.changed, self._lost)
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
        routes = chains(self.order, linked)
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

        def write(data: bytes) -> None:
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
                    try:
                        sha = self.shas[(m.root, lf.rel)] = ferry.send_file(
                            write, m.root, lf.rel, str(lf.path), lf.size, lf.mtime_ns, lf.mode,
                            None if m.blocks is None else list(m.blocks), list(m.writers),
                            list(lf.blocks) if lf.blocks else None, lf.sha)
                        word({"sha": [m.root, lf.rel, sha]})
                    except ferry.Changed:
                        changed.append(str(lf.path))
                    except ferry.Unreadable as e:
                        changed.append(f"{lf.path} ({e})")
                if m.touchers:
                    touch = {"root": m.root, "path": lf.rel, "mtime": lf.mtime_ns,
                             "mode": lf.mode, "for": list(m.touchers)}
                    write(ferry.meta(b"T", touch))
                    word({"touch": touch})
            write(ferry.frame(b"Z", b""))
            word({"end": True})
        except OSError as e:
            self._check()  # a node's own error says more than the broken pipe
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
                if not silent and len(stuck) < len(going):
                    continue
                self.cause = (silent or stuck)[0]
                self.silent = bool(silent)
                self.stuck = not silent
                self.changed.notify_all()
            self.close()
            return

    def _check(self) -> None:
        """Every node that failed, by its own words first; then those only the chain broke.
        A node lost or silent makes it HostsUnreachable (exit 3), as any unreachable host."""
        problems: dict[str, Exception] = {}
        for n, s in self.states.items():
            if s.error is not None and not s.error.get("relay"):
                problems[n] = FleetError(problem_text(s.error))
            elif n == self.cause and self.stuck:
                problems[n] = TransportError(
                    f"nothing moved for {STUCK_S:.0f}s on any node: the stream stopped here "
                    "(the link from the node before it, or this node, takes nothing)")
            elif n == self.cause and self.silent:
                problems[n] = TransportError(
                    f"no progress for {STALL_S:.0f}s while data was sent: it stopped answering "
                    "(a cut link, a frozen host?). What arrived is kept: the next `fleet up` "
                    "sends only the rest")
            elif s.ended and not s.done and s.error is None and self.cause in (None, n):
                err = self.recv[n].pipe.err().strip().splitlines()[-1:] if n in self.recv else []
                problems[n] = TransportError(
                    "lost mid-transfer (its connection or its receiver ended" +
                    (f": {printable(err[0])}" if err else "") + ")")
        if not problems:
            for n, s in self.states.items():
                if s.error is not None:
                    problems[n] = FleetError(problem_text(s.error))
        if problems:
            raise host_error("sending data", problems)

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


class Bar:
    """Progress: bytes in place on the nodes against what they place, the rate and the time
    left; on a terminal one line redrawn, else a line now and then."""

    def __init__(self, console: Console, total: int, states: dict[str, NodeState],
                 order: list[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.total, self.states, self.order = console, total, states, order
        self.clock = clock
        self.tty = _isatty(console.err)
        self.t0 = clock()
        self.shown = self.t0

    def tick(self) -> None:
        now = self.clock()
        every = 0.25 if self.tty else PROGRESS_LINE_S
        if now - self.shown < every or self.total < (8 << 20):
            return
        self.shown = now
        text = self.text(now)
        if self.tty:
            self.console.redraw(f"fleet: {text}")
        else:
            self.console.info(text)

    def text(self, now: float) -> str:
        want = sum(s.expected for s in self.states.values()) or 1
        at = sum(min(s.at, s.expected) for s in self.states.values())
        rate = at / max(now - self.t0, 1e-6)
        eta = (want - at) / rate if rate > 0 else 0.0
        per = {n: s.at * 100 // max(s.expected, 1) for n, s in self.states.items()
               if s.expected}
        nodes = ""
        if len(set(per.values())) > 1:
            nodes = "  " + " ".join(f"{n} {p}%" for n, p in per.items())
        return (f"data {human(at)} of {human(want)} in place, {human(int(rate))}/s, "
                f"{eta:.0f}s left{nodes}")

    def end(self) -> None:
        self.console.settle()


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


# ---- hashing here, beside the nodes' hashing ----------------------------------------------------
def local_file(rel: str, path: Path, with_hashes: bool) -> Local:
    st = os.stat(path)
    lf = Local(rel, path, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    if with_hashes:
        size, sha, blocks = ferry.hash_file(str(path))
        if size != st.st_size:
            raise WorkdirError(f"{path}: changed while fleet read it; start again once it is "
                               "written")
        lf = Local(rel, path, size, st.st_mtime_ns, lf.mode, sha, tuple(blocks))
    return lf



# ---- the whole of it ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Dir:
    """One synced directory: what is sent (a scan of it), and per node its absolute path there,
    its listing, and the files it gets through the transfer."""

    scan: Scan
    roots: dict[str, str]
    there: dict[str, Manifest]
    rels: dict[str, list[str]]


def held_script(python: str, asks: list[tuple[str, list[str]]]) -> str:
    """One round trip: `ferry hash` of each (root, paths), each after a `#dir N` line."""
    lines = []
    for i, (root, rels) in enumerate(asks):
        lines.append(f"echo '#dir {i}'")
        lines.append(hash_script(python, root, rels))
    return "\n".join(lines)


def parse_helds(out: str, asks: list[tuple[str, list[str]]]) -> list[dict[str, Held]]:
    parts: list[list[str]] = [[] for _ in asks]
    at = -1
    for line in out.splitlines():
        if line.startswith("#dir ") and (n := number(line[5:], len(asks))) is not None:
            at = n
        elif 0 <= at < len(asks):
            parts[at].append(line)
    return [parse_held("\n".join(p), set(asks[i][1])) for i, p in enumerate(parts)]


def move(nodes: list[Target], dirs: list[Dir], console: Console) -> tuple[Outcome, list[Move]]:
    """Makes every node hold what `dirs` says it gets; see the module's docstring."""
    asks = {tg.name: [(tg.roots[k], candidates(d.rels.get(tg.name, []),
                                              d.there.get(tg.name, {})))
                      for k, d in enumerate(dirs)] for tg in nodes}
    asking = [tg for tg in nodes if any(rels for _, rels in asks[tg.name])]
    hashed: set[tuple[int, str]] = {(k, r) for tg in asking
                                    for k, (_, rels) in enumerate(asks[tg.name]) for r in rels}
    locals_: dict[tuple[int, str], Local] = {}
    problem: list[BaseException] = []

    def here() -> None:
        try:
            for k, d in enumerate(dirs):
                for rel in sorted({r for rels in d.rels.values() for r in rels}):
                    path = d.scan.files[rel]
                    try:
                        locals_[(k, rel)] = local_file(rel, path, (k, rel) in hashed)
                    except OSError as e:
                        raise WorkdirError(
                            f"{path}: cannot be read any more ({e.strerror or e}); nothing "
                            "was started: make it readable, or leave it out with `exclude`"
                        ) from e
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            problem.append(e)
    th = threading.Thread(target=here, daemon=True)
    th.start()

    def ask(tg: Target) -> list[dict[str, Held]]:
        r = tg.t.run(held_script(tg.python, asks[tg.name]), timeout=None,
                     what="hash what is there")
        r.check(tg.name)
        return parse_helds(r.out, asks[tg.name])
    results: dict[str, list[dict[str, Held]] | Exception] = each(
        ((tg.name, tg) for tg in asking), ask)
    bad = {n: r for n, r in results.items() if isinstance(r, Exception)}
    th.join()
    if problem:
        raise problem[0]
    if bad:
        raise host_error("hashing what the nodes hold", bad)
    held = {n: r for n, r in results.items() if not isinstance(r, Exception)}
    order = {tg.name: i for i, tg in enumerate(nodes)}
    files = []
    for (k, rel), lf in sorted(locals_.items()):
        needs = {order[tg.name]: need(lf, held[tg.name][k].get(rel) if tg.name in held else None)
                 for tg in nodes if rel in dirs[k].rels.get(tg.name, ())}
        files.append((k, lf, needs))
    moves = plan_moves(files)
    outcome = Transfer(nodes, moves, console).run() if moves else Outcome()
    for (i, root), m in moved_per_node(moves).items():
        outcome.moved.setdefault(nodes[i].name, {})[root] = m
    return outcome, moves


# ---- one directory to one node (the Slurm login node) -----------------------------------------
def sync_dir(t: Transport, python: str, scan: Scan, dest: str, tag: str,
             console: Console) -> SyncStats:
    """Make `dest` on the node hold every file of the scan (extra files there are kept): one
    listing, then what changed streamed (streams()) or in one bundle."""
    r = t.run(listing_script([dest]), what=f"list {dest}")
    if not r.ok:
        raise RemoteCommandError(t.host.name, f"list {dest}", r.code, r.err)
    there = parse_listing(r.out, 1)[0]
    rels = changed(scan.manifest, there)
    size = sum(scan.manifest[rel][0] for rel in rels)
    if not streams(size, any(ferry.part_name(rel) in there for rel in rels)):
        if rels:
            send(t, code_entries(scan, dest, rels), tag)
        return SyncStats(len(rels), size, len(scan.manifest) - len(rels))
    name, root = t.host.name, t.path(dest)
    out, _ = move([Target(name, t, python, t.host.address, (root,))],
                  [Dir(scan, {name: root}, {name: there}, {name: rels})], console)
    m = out.moved.get(name, {}).get(0, Moved())
    return SyncStats(m.files, m.sent, len(scan.manifest) - m.files)


# ---- the other way: files from a node (the engine of a pull) -----------------------------------
def fetch(t: Transport, python: str, root: str, rels: list[str], dest: Path) -> dict[str, str]:
    """The node's files root/rel into dest/rel, streamed by `ferry send` and written here by the
    same Receiver, strictly: a node is untrusted, so no path may leave dest or pass through a
    link there, each file is verified against the hash the node sent, and each replaces its
    target only whole. Returns rel -> sha256 of what was placed; a file the node did not send
    is missing from it. WorkdirError if the stream breaks the protocol."""
    mark = f"FERRY-{secrets.token_hex(8)}"
    rels = [ferry.safe_rel(r) for r in rels]
    pipe = t.pipe(agent(python, f"send {quote(root)} {mark}", json.dumps(rels)))
    got: dict[str, str] = {}
    errors: list[dict[str, object]] = []

    def report(obj: dict[str, object]) -> None:
        ok = obj.get("ok")
        if isinstance(ok, list) and len(ok) == 3:
            got[str(ok[1])] = str(ok[2])
        elif "error" in obj:
            errors.append(obj["error"])  # type: ignore[arg-type]

    recv = ferry.Receiver([str(dest)], 0, report, strict=True,
                          only={(0, r) for r in rels})
    reader = _PipeReader(pipe)
    idle = threading.Thread(target=reader.watch, args=(FETCH_IDLE_S,), daemon=True)
    idle.start()
    buf = bytearray()
    try:
        while not buf.endswith(mark.encode() + b"\n"):  # rc noise first, bounded
            chunk = reader.read(1)
            if not chunk or len(buf) > LINE_MAX:
                raise WorkdirError(f"{t.host.name}: no files came from {root} "
                                   f"({pipe.err().strip()[-200:] or 'its sender did not start'})")
            buf += chunk
        while True:
            kind, payload = ferry.read_frame(reader.read)
            if not kind:
                raise EOFError("the stream ended before its end" +
                               (f" (nothing for {FETCH_IDLE_S:.0f}s)" if reader.idle else ""))
            if not recv.apply(kind, payload):
                break
    except (ferry.Bad, EOFError, ValueError, TypeError, RecursionError) as e:
        raise WorkdirError(f"{t.host.name}: the files sent from {root} broke the protocol "
                           f"({printable(str(e))}); nothing more was written") from e
    finally:
        reader.done = True
        pipe.close()
    if errors:
        raise WorkdirError(f"{t.host.name}: {problem_text(errors[0])}")
    return got


FETCH_IDLE_S = 60.0  # a node that sends nothing for this long while fetched from: given up


class _PipeReader:
    """read(n) of exactly what a Pipe gives, buffered; watch() closes the pipe once nothing
    came for a while (a node that stops sending cannot hold fleet)."""

    def __init__(self, pipe: Pipe) -> None:
        self.pipe, self.buf = pipe, bytearray()
        self.last = time.monotonic()
        self.done = self.idle = False

    def watch(self, limit: float) -> None:
        while not self.done:
            time.sleep(min(1.0, limit / 4))
            if not self.done and time.monotonic() - self.last > limit:
                self.idle = True
                self.pipe.close()
                return

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.pipe.recv(max(65536, n - len(self.buf)))
            if not chunk:
                break
            self.last = time.monotonic()
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out
