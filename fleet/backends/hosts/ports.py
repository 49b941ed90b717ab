"""The port checks, before a launch and in `fleet check`: the master's rendezvous port is free
and every worker reaches it, and the master reaches a port on every worker, tested with
listeners (fleet/nodeside/listen.py) and connections (connect.py) from the nodes themselves."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable

from fleet.backends.checks import Check, Status
from fleet.config.inventory import Host
from fleet.console import printable
from fleet.nodedata import number
from fleet.nodeside import loader, python_program, shell_program
from fleet.run import faults
from fleet.shell import quote, sh
from fleet.transport import Transport
from fleet.transport.group import each, reason

LISTEN_S = 20  # a check listener lives at most this long on a node
LISTENER_MARK = "fleet-preflight-listener"  # in its command line: how stop_listener knows it


def connect_script(python: str, addr: str, port: int | str) -> str:
    """Exits 0 if a TCP connection to addr:port opens from the node (IPv4 or IPv6)."""
    return python_program(quote(python), "connect.py", addr, str(port), flags=("-I", "-S"),
                          redirect="2>&1")


def connect_each_script(python: str, targets: list[tuple[str, str]]) -> str:
    """Tries a TCP connection to every (addr, port) at once from the node: one line per target
    (see parse_connects)."""
    return python_program(quote(python), "connect.py", "--each",
                          *(w for addr, port in targets for w in (addr, port)),
                          flags=("-I", "-S"), redirect="2>&1")


def parse_connects(out: str, n: int) -> list[tuple[bool, str]]:
    """connect.py --each's answer for n targets, in their order: (reached?, why not). The node's
    word is checked: a line for no target, a second line for one, or anything else is
    ignored, and a target with no line is not reached."""
    got: dict[int, tuple[bool, str]] = {}
    for line in out.splitlines():
        index, _, said = line.strip().partition(" ")
        i = number(index, n)
        if i is None or i in got:
            continue
        if said == "ok":
            got[i] = (True, "")
        elif said.startswith("fail"):
            got[i] = (False, printable(said[4:].strip()) or "failed")
    return [got.get(i, (False, "the connection test said nothing of it")) for i in range(n)]


def listener_script(python: str, port: int, expect: int, seconds: int = LISTEN_S) -> str:
    return shell_program("listen.sh", str(seconds + 5), python, "-I", "-S", "-c",
                         loader("listen.py"), str(port), str(seconds), str(expect),
                         LISTENER_MARK, python="listen.py")


def reach_and_listen_script(python: str, addr: str, port: int | str, mark: str) -> str:
    """A worker's two checks in one round trip: connect_script's test of addr:port, its exit
    status on a marker line, then listener_script's listener (any free port, one connection)."""
    return "\n".join([connect_script(python, addr, port), f"echo {mark} $?",
                      listener_script(python, 0, 1)])


def parse_reach_and_listen(out: str, mark: str) -> tuple[int | None, str, str]:
    """reach_and_listen_script's answer: the connect test's exit status (None where its marker
    line never came), what the test printed, and what the listener's start printed."""
    before: list[str] = []
    lines = out.splitlines()
    for i, line in enumerate(lines):
        word, _, code = line.strip().partition(" ")
        if word == mark:
            n = number(code, 256)
            return n, "\n".join(before), "\n".join(lines[i + 1:])
        before.append(line)
    return None, out, ""


def reached(code: int | None, out: str, python: str) -> tuple[bool, str]:
    """A connect test's verdict from its exit status and output: (reached?, why not); raises
    where the node's python could not even try (a broken interpreter is not a firewall)."""
    if code == 0:
        return True, ""
    why = out.strip().splitlines()[-1] if out.strip() else "timed out"
    if code != 1:
        raise RuntimeError(f"cannot test the connection with {python}: {why}")
    return False, why


def start_listener(t: Transport, port: int, expect: int,
                   seconds: int = LISTEN_S) -> tuple[bool, str, str]:
    """Start a listener on the node (port 0: any free one) that lives until `expect` connections
    came or `seconds` passed. Returns (listening?, the port or why not, its pid)."""
    return parse_listener(t.run(listener_script(t.host.python, port, expect, seconds),
                                timeout=30, what="start a test listener").out)


def parse_listener(out: str) -> tuple[bool, str, str]:
    out = out.strip()
    if out.startswith("listening "):
        _, port_text, pid = out.split()[:3]
        return True, port_text, pid
    return False, out.removeprefix("busy ") or "the listener did not start", ""


def stop_listener(t: Transport, pid: str) -> None:
    """Free the port at once (a worker that could not connect leaves the listener waiting).
    The pid is the node's word: only a plain one above 1 (`kill 0` or `kill 1` would reach every
    process of the shell's group, or init), and only while it is still a listener of fleet's
    (once the listener ended by itself the pid may name anything)."""
    if (n := number(pid, 1 << 22)) is not None and n > 1:
        proc = f"/proc/{pid}/cmdline"
        t.run(sh("grep", "-qzxF", LISTENER_MARK, proc) + " 2>/dev/null && "
              + sh("kill", pid) + " 2>/dev/null; true", timeout=15, what="stop the listener")


class Cancelled(Exception):
    """The port checks were given up (the upload beside them failed): no new listener."""


class Listeners:
    """The test listeners one round of port checks starts on the nodes, so that whoever gives
    up on the checks can end them at once: none may outlive a launch that failed."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._started: list[tuple[Transport, str]] = []

    def start(self, t: Transport, port: int, expect: int) -> tuple[bool, str, str]:
        return self._start(t, lambda: start_listener(t, port, expect))

    def reach_and_start(self, t: Transport, addr: str, port: int | str
                        ) -> tuple[tuple[int | None, str], tuple[bool, str, str]]:
        """A worker's test of addr:port and its listener's start, in one round trip: (the
        test's exit status and output, see reached(); the listener as start() says it)."""
        test: list[tuple[int | None, str]] = []

        def both() -> tuple[bool, str, str]:
            mark = f"fleet-reach-{secrets.token_hex(6)}"
            r = t.run(reach_and_listen_script(t.host.python, addr, port, mark), timeout=30,
                      what="connect test and a test listener")
            code, said, listened = parse_reach_and_listen(r.out, mark)
            test.append((code, said))
            return parse_listener(listened)

        listened = self._start(t, both)
        return test[0], listened

    def _start(self, t: Transport, run: Callable[[], tuple[bool, str, str]]
               ) -> tuple[bool, str, str]:
        if self.cancelled.is_set():
            raise Cancelled("the port checks were given up")
        ok, info, pid = run()
        with self._lock:
            late = self.cancelled.is_set()  # given up while it started: stop_all missed it
            if ok and not late:
                self._started.append((t, pid))
        if ok and late:
            stop_listener(t, pid)
            raise Cancelled("the port checks were given up")
        faults.point("preflight-listening")
        return ok, info, pid

    def stop_all(self) -> None:
        """Cancel what has not started; end every listener started (those that ended by
        themselves are left alone: stop_listener checks)."""
        self.cancelled.set()
        with self._lock:
            started, self._started = self._started, []
        each(((t.host.name + "/" + pid, (t, pid)) for t, pid in started),
             lambda tp: stop_listener(*tp))


def can_connect_each(t: Transport, targets: list[tuple[str, str]]) -> list[tuple[bool, str]]:
    """A connection test to many targets in one command (one session, not one per target)."""
    if not targets:
        return []
    r = t.run(connect_each_script(t.host.python, targets), timeout=30, what="connect test")
    if not r.ok:
        why = r.out.strip().splitlines()[-1] if r.out.strip() else f"exit {r.code}"
        raise RuntimeError(f"cannot test the connections with {t.host.python}: {why}")
    return parse_connects(r.out, len(targets))


def port_checks(session: dict[str, Transport], master: Host, master_ip: str, port: int,
                addrs: dict[str, str], listeners: Listeners | None = None) -> list[Check]:
    """The master's rendezvous port is free there and every worker reaches it over TCP; and the
    master reaches a port on every worker (torchrun's collectives connect both ways). The test
    listeners are started through `listeners`, where the caller may have to end them early."""
    listeners = listeners or Listeners()
    tm = session[master.name]
    workers = [(n, t) for n, t in session.items() if n != master.name]
    ok, info, pid = listeners.start(tm, port, len(workers))
    if not ok:
        return [Check(master.name, "rendezvous port", Status.FAIL,
                      f"port {port} is taken on the master: {info}",
                      "stop what holds it (`fleet ps`, `fleet stop RUN`) or choose another "
                      "`port` under [rendezvous] in the job")]
    checks = [Check(master.name, "rendezvous port", Status.PASS, f"{master_ip}:{port} free")]

    def reach(t: Transport, good: bool, why: str) -> Check:
        if good:
            return Check(t.host.name, "reach master", Status.PASS, f"TCP to {master_ip}:{port}")
        return Check(t.host.name, "reach master", Status.FAIL,
                     f"cannot open TCP to the master {master_ip}:{port}: {why}",
                     f"a firewall on the master or between the hosts blocks port {port}: allow "
                     f"TCP {port} (and the ephemeral ports Gloo/NCCL use) from the other nodes")

    def worker(t: Transport) -> tuple[Check, tuple[bool, str, str]]:
        (code, said), listened = listeners.reach_and_start(t, master_ip, port)
        try:
            return reach(t, *reached(code, said, t.host.python)), listened
        except Exception:
            if listened[0]:
                stop_listener(t, listened[2])
            raise

    # Each worker on its own connection: it reaches the master, then listens, in one round
    # trip. The master then
    # tries every worker's listener in one command: one session on its connection, where one
    # per worker queued 63 deep at 64 hosts. The master's listener ends by itself once every
    # worker reached it; it is killed otherwise.
    firsts = each(workers, worker)
    if any(not isinstance(r := firsts[n], tuple) or r[0].status is not Status.PASS
           for n, _ in workers):
        stop_listener(tm, pid)
    listening = [(n, t, r[1]) for n, t in workers
                 if isinstance(r := firsts[n], tuple) and r[1][0]]
    targets = [(addrs.get(n) or t.host.address, info) for n, t, (_, info, _) in listening]
    try:
        answers: list[tuple[bool, str]] | Exception = can_connect_each(tm, targets)
    except Exception as e:  # the master lost, or its python unable to test: each check fails
        answers = e
    backs: dict[str, Check] = {}
    unreached: list[tuple[str, tuple[Transport, str]]] = []
    for k, (n, t, (_, info, lpid)) in enumerate(listening):
        own = targets[k][0]
        if isinstance(answers, Exception):
            backs[n] = Check(n, "network", Status.FAIL, reason(answers))
            unreached.append((n, (t, lpid)))
            continue
        good, why = answers[k]
        if good:  # its listener ended by itself, after that one connection
            backs[n] = Check(n, "reached by master", Status.PASS, f"TCP {own}:{info} from master")
            continue
        unreached.append((n, (t, lpid)))
        backs[n] = Check(n, "reached by master", Status.FAIL,
                         f"the master cannot open TCP to {own}:{info}: {why}",
                         "a firewall on this node blocks incoming TCP from the other nodes; Gloo "
                         "and NCCL connect on ephemeral ports, so allow TCP from the cluster "
                         "subnet")
    each(unreached, lambda tp: stop_listener(*tp))
    for n, _ in workers:
        r = firsts[n]
        checks.append(r[0] if isinstance(r, tuple) else Check(n, "network", Status.FAIL, reason(r)))
    for n, _ in workers:
        r = firsts[n]
        if not isinstance(r, tuple):
            continue
        if n in backs:
            checks.append(backs[n])
        else:
            checks.append(Check(n, "reached by master", Status.WARN,
                                f"no test listener: {r[1][1]}"))
    return checks
