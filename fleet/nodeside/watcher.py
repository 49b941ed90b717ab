"""The nodes' own watcher of a detached run: fail-fast without the laptop. start.sh starts one
beside each node's wrapper, with FLEET_ATTEMPT_ID in its environment (so a stop of the run ends
it too). Each non-master node's watcher keeps a TCP link to the master's, with a signed beat every
beat_every(unreachable_after); every rule is fleet.nodeside.shared.watch_rules. When a node's
part ends non-zero, or a node is not heard of for unreachable_after, the master's watcher tells
every other to stop, and each runs its node's stop.sh with the reason (the stop record `fleet
status` reads); a node that loses the master stops its own part. It ends with its node's part
(the master's: once every node's has ended), or once it has stopped it. argv: the run
directory, the wrapper's pid and start time (clock ticks after boot); stdin: its config
(fleet.nodeside.shared.watch_rules.Config), which start.sh read from the run directory and
removed before the job began."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import time

from fleet.nodeside.shared.nodemap import (
    ATTEMPT_ID_VAR,
    EXIT_CODE,
    NODE_LOG,
    RUN_ID_VAR,
    WATCHER_CONFIG,
    WATCHER_PORT,
)
from fleet.nodeside.shared.watch_rules import (
    MAX_LINE,
    NONCE_BYTES,
    BadMessage,
    Config,
    Hub,
    Message,
    Peer,
    Verdict,
    beat_every,
    encode,
    hub_decide,
    hub_done,
    parse,
    parse_config,
    parse_nonce,
    spoke_decide,
)

STOP_WAIT_S = 30  # how long the watcher waits for stop.sh to end it, before it ends by itself
MAX_LINKS = 4  # links the master's watcher holds per node of the run, strangers' included


class Link:
    """One TCP link to another watcher: its nonce (what this side signs over), this side's
    own (what the other signs over), what has come in and not been read, the last number
    each way."""

    def __init__(self, sock: socket.socket, opened: float = 0.0) -> None:
        self.sock, self.opened = sock, opened
        self.mine = os.urandom(NONCE_BYTES).hex()
        self.theirs = ""
        self.buf = b""
        self.seq_in = 0
        self.seq_out = 0
        self.node = ""
        sock.setblocking(False)
        self.sock.sendall(f"nonce {self.mine}\n".encode())

    def send(self, token: bytes, kind: str, node: str, **kw: object) -> bool:
        if not self.theirs:
            return False
        self.seq_out += 1
        try:
            self.sock.sendall(encode(token, self.theirs, Message(kind, node, self.seq_out,
                                                                 **kw)))  # type: ignore[arg-type]
        except OSError:
            return False
        return True

    def receive(self, token: bytes, nodes: frozenset) -> list:  # type: ignore[type-arg]
        """The messages that have come; BadMessage or OSError end the link (EOF: OSError)."""
        chunk = self.sock.recv(4096)
        if not chunk:
            raise OSError("closed")
        self.buf += chunk
        out = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if not self.theirs:
                self.theirs = parse_nonce(line + b"\n")
                continue
            m = parse(line + b"\n", token, self.mine, nodes, self.seq_in)
            if self.node and m.node != self.node:
                raise BadMessage("a link changed its node")
            self.node, self.seq_in = m.node, m.seq
            out.append(m)
        if len(self.buf) > MAX_LINE:
            raise BadMessage("a line too long")
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def part_ended(run_dir: str, pid: int, start: int) -> tuple[bool, int | None]:
    """(ended, exit code: None where the wrapper died without one) of the node's part: the
    wrapper of that pid and start time is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rpartition(") ")[2].split()
        alive = len(fields) > 19 and fields[0] not in "ZX" and fields[19] == str(start)
    except OSError:
        alive = False
    if alive:
        return False, None
    try:
        with open(os.path.join(run_dir, EXIT_CODE), encoding="ascii") as f:
            said = f.read(8).strip()
    except (OSError, UnicodeDecodeError):
        return True, None
    return True, int(said) if said.isdigit() and int(said) < 256 else None


def say(run_dir: str, line: str) -> None:
    try:
        with open(os.path.join(run_dir, NODE_LOG), "a", encoding="utf-8") as f:
            f.write(f"[fleet] watcher: {line}\n")
    except OSError:
        pass


def stop_part(run_dir: str, cfg: Config, wrapper: str, verdict: Verdict) -> None:
    """Run the node's stop.sh with the reason, outside the run's environment and session (it
    ends this watcher too, which is the run's), then wait for it to do so."""
    say(run_dir, f"stopping this node's part ({verdict.why})")
    env = {k: v for k, v in os.environ.items() if k not in (RUN_ID_VAR, ATTEMPT_ID_VAR)}
    p = subprocess.Popen(["sh", os.path.join(run_dir, "stop.sh"), verdict.why],
                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    assert p.stdin is not None
    p.stdin.write(f"{cfg.key}\n{wrapper}\n".encode())
    p.stdin.close()
    time.sleep(STOP_WAIT_S)


def hub(run_dir: str, cfg: Config, pid: int, start: int) -> None:
    token, nodes = cfg.token.encode(), frozenset(cfg.nodes)
    server = socket.socket(socket.AF_INET6 if ":" in cfg.addr else socket.AF_INET)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((cfg.addr, 0))
    except OSError:  # an address the others reach the master by, not the master's own (NAT)
        server.bind(("", 0))
    server.listen(len(cfg.nodes) + 4)
    server.setblocking(False)
    port = os.path.join(run_dir, WATCHER_PORT)
    with open(port + ".tmp", "w", encoding="ascii") as f:
        f.write(f"{server.getsockname()[1]}\n")
    os.replace(port + ".tmp", port)
    state = Hub(cfg.node, time.monotonic(), cfg.after, cfg.hello_within,
                {n: Peer() for n in cfg.nodes[1:]})
    links: list[Link] = []
    beat, last_beat = beat_every(cfg.after), 0.0
    wrapper = f"{pid} {start}"
    while True:
        ready, _, _ = select.select([server, *(x.sock for x in links)], [], [], beat / 2)
        now = time.monotonic()
        for sock in ready:
            if sock is server:
                try:
                    conn, _ = server.accept()
                    if len(links) < MAX_LINKS * len(cfg.nodes):
                        links.append(Link(conn, now))
                    else:
                        conn.close()
                except OSError:
                    pass
                continue
            link = next(x for x in links if x.sock is sock)
            try:
                for m in link.receive(token, nodes):
                    if m.node in state.peers:
                        state.peers[m.node].seen = now
                        if m.kind == "end":
                            state.peers[m.node].ended, state.peers[m.node].code = True, m.code
            except (OSError, BadMessage):
                link.close()
                links.remove(link)
        for link in [x for x in links if state.peers.get(x.node, Peer()).ended or (
                not x.node and now - x.opened > cfg.after)]:
            link.close()  # told its end (its watcher may go), or a stranger's
            links.remove(link)
        own = part_ended(run_dir, pid, start)
        verdict = hub_decide(state, now, own)
        if verdict is not None:
            say(run_dir, f"stopping the run: {verdict.why}")
            for link in links:
                link.send(token, "stop", cfg.node, why=verdict.why, culprit=verdict.culprit)
                link.close()
            if not own[0]:
                stop_part(run_dir, cfg, wrapper, verdict)
            return
        if hub_done(state, own[0]):
            return
        if now - last_beat >= beat:
            last_beat = now
            for link in links:
                link.send(token, "beat", cfg.node)


def spoke(run_dir: str, cfg: Config, pid: int, start: int) -> None:
    token, nodes, master = cfg.token.encode(), frozenset(cfg.nodes), cfg.nodes[0]
    since, seen = time.monotonic(), None
    beat, last_beat, last_try = beat_every(cfg.after), 0.0, -1e9
    link: Link | None = None
    wrapper = f"{pid} {start}"
    while True:
        now = time.monotonic()
        if link is None and now - last_try >= beat:
            last_try = now
            try:
                link = Link(socket.create_connection((cfg.addr, cfg.port), timeout=beat))
            except OSError:
                link = None
        if link is None:
            time.sleep(beat / 2)
        ready = select.select([link.sock], [], [], beat / 2)[0] if link else []
        now = time.monotonic()
        own = part_ended(run_dir, pid, start)
        if link is not None and ready:
            try:
                for m in link.receive(token, nodes):
                    if m.node != master:
                        raise BadMessage("not the master's")
                    seen = now
                    if m.kind == "stop":
                        link.close()
                        if not own[0]:
                            stop_part(run_dir, cfg, wrapper, Verdict(m.why, m.culprit))
                        return
            except (OSError, BadMessage):
                link.close()
                link = None
                if own[0] and seen is not None:
                    return  # the master closes the link once it has the end
        verdict = spoke_decide(master, since, seen, now, cfg.after, cfg.hello_within)
        if verdict is not None:
            if not own[0]:
                stop_part(run_dir, cfg, wrapper, verdict)
            return
        if link is not None and (own[0] or now - last_beat >= beat):
            last_beat = now
            if not (link.send(token, "end", cfg.node, code=own[1]) if own[0]
                    else link.send(token, "beat", cfg.node)) and link.theirs:
                link.close()
                link = None


def main() -> None:
    run_dir, pid, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:  # start.sh removed the file before the job began: its keys are in this process alone
        cfg = parse_config(sys.stdin.read(65536))
    except (OSError, ValueError) as e:
        say(run_dir, f"not started: {WATCHER_CONFIG}: {e}")
        return
    try:
        (hub if cfg.master else spoke)(run_dir, cfg, pid, start)
    except Exception as e:  # said where `fleet logs` shows it; the run goes on unwatched
        say(run_dir, f"ended unexpectedly: {e!r}")
        raise


if __name__ == "__main__":
    main()
