"""Operations on one node's run directory (start, wait for the port, follow, state, stop, remove),
each a script plus a pure parser of what it prints."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypeVar

from fleet.errors import FleetError, JobFailed, RemoteCommandError, UsageError
from fleet.facts.diagnose import diagnose, format_diagnoses
from fleet.nodedata import number
from fleet.run.record import NodeRecord, RunRecord
from fleet.run.states import NodeStatus
from fleet.shell import MACHINE_ID, home_word, quote, sh
from fleet.transport import Received, Transport, open_transport
from fleet.transport.group import each

R = TypeVar("R")

# How long to wait for run.sh to record its pid after it was started.
PID_WAIT_TICKS = 500



@dataclass(frozen=True)
class NodeState:
    """What a node's run directory says about the run there."""

    status: NodeStatus
    code: int | None = None
    pid: int | None = None
    elapsed: int | None = None  # seconds it ran (or has run), all by the node's own clock
    stopped_by: str = ""  # who stopped it: "fleet stop", "fail-fast: node2 failed", ... (a stop
    #                       record fleet wrote; one without the run's key is no stop)
    own_failure: str = ""  # FAILED although stopped: how its own part had failed before then

    @property
    def done(self) -> bool:
        return self.status.is_terminal


# ---- start --------------------------------------------------------------------------------
def start_script(run_dir: str, run_id: str) -> str:
    """run.sh detached from this connection (own session, no tty); prints its pid."""
    return "\n".join([
        f"cd {quote(run_dir)} || exit 1",
        "[ -e stopped ] && { echo 'stopped before it started' >&2; exit 3; }",
        # Appending: stop.sh's line lands whole between the job's, never overwritten by them.
        sh("env", f"FLEET_RUN_ID={run_id}", "setsid", "sh", "./run.sh") +
        " >> node.log 2>&1 < /dev/null &",
        f"i=0; while [ ! -s pid ] && [ $i -lt {PID_WAIT_TICKS} ]; do sleep 0.01; "
        "i=$((i+1)); done",
        "cat pid",
    ])


def parse_pid(out: str) -> int | None:
    words = out.split()
    return number(words[-1], 1 << 22) if words else None


def start(t: Transport, run_dir: str, run_id: str) -> int:
    r = t.run(start_script(run_dir, run_id), timeout=30, what="start run.sh")
    pid = parse_pid(r.out)
    if not r.ok or pid is None:
        raise RemoteCommandError(t.host.name, "start run.sh", r.code, r.out + r.err)
    return pid


# ---- state --------------------------------------------------------------------------------
def state_script(run_dir: str) -> str:
    return "\n".join([
        f"cd {quote(run_dir)} 2>/dev/null || {{ echo missing; exit 0; }}",
        'echo "pid=$(cat pid 2>/dev/null)"',
        'echo "code=$(cat exit_code 2>/dev/null)"',
        'echo "started=$(cat started 2>/dev/null)"',
        'echo "ended=$(stat -c %Y exit_code 2>/dev/null)"',
        'echo "last=$(stat -c %Y node.log stopped 2>/dev/null | sort -n | tail -n 1)"',
        'echo "now=$(date +%s)"',
        # The stop record, whoever wrote it (the job can write there too): parse_stop_record
        # tells fleet's from a forgery.
        "[ -e stopped ] && head -n 40 stopped | cut -c 1-400 | sed 's/^/stop|/'",
        f'echo "me={MACHINE_ID}"',
        'echo "machine=$(cat machine 2>/dev/null)"',
        'p=$(cat pid 2>/dev/null); [ -n "$p" ] && kill -0 "$p" 2>/dev/null && echo alive',
        "true",
    ])


def _int(text: str | None) -> int | None:
    return number(text, signed=True)


def parse_state(out: str, key: str = "") -> NodeState:
    """A node's state from state_script's output. `key`: the node's stop key for this run
    (RunRecord.stop_key); a stop record without it is the job's forgery and counts for nothing.
    An empty key (a run recorded before there were keys) takes any record as it reads."""
    lines = out.splitlines()
    if "missing" in lines:
        return NodeState(NodeStatus.MISSING)
    fields = dict(line.split("=", 1) for line in lines
                  if "=" in line and not line.startswith("stop|"))
    record = [line[5:] for line in lines if line.startswith("stop|")]
    stop = parse_stop_record(record, key) if record else None
    if stop is not None and not stop.genuine:
        stop = None
    pid, code = _int(fields.get("pid")), _int(fields.get("code"))
    started, now = _int(fields.get("started")), _int(fields.get("now"))
    by, own = (stop.by, stop.own_failure) if stop else ("", "")
    # A pid means something only on the machine (and boot) that recorded it: after a reboot or
    # from another machine sharing the directory, it may be anyone's.
    machine = fields.get("machine", "").strip()
    alive = "alive" in lines and machine in ("", fields.get("me", "").strip())
    # Durations by the node's clock alone: its start, and its end, its last sign of life (a
    # wrapper killed outright records no end) or its present time.
    end = _int(fields.get("ended")) if code is not None else now if alive else \
        _int(fields.get("last"))
    elapsed = end - started if end is not None and started is not None else None
    if code is not None:
        if stop is not None and code != 0:
            # Its own part had failed before the stop reached it: failed, whatever the stop did.
            status = NodeStatus.FAILED if own else NodeStatus.STOPPED
            return NodeState(status, code, pid, elapsed, by, own)
        status = NodeStatus.SUCCEEDED if code == 0 else NodeStatus.FAILED
        return NodeState(status, code, pid, elapsed)
    if alive:  # with a stop record: being stopped
        return NodeState(NodeStatus.RUNNING, None, pid, elapsed, by, own)
    if stop is not None:  # stopped before it ran, or its wrapper killed outright by the stop
        status = NodeStatus.FAILED if own else NodeStatus.STOPPED
        return NodeState(status, None, pid, elapsed, by, own)
    if pid is None:
        return NodeState(NodeStatus.STARTING)
    # The wrapper died without recording an exit code, and nobody stopped it: killed outright.
    return NodeState(NodeStatus.FAILED, None, pid, elapsed)


# ---- the stop record (stop.sh writes it, in the node's run directory) -----------------------
@dataclass(frozen=True)
class StopRecord:
    """Who stopped a node, whether fleet wrote the record, and how the node's own part had
    already failed when the stop reached it ("" if it had not)."""

    by: str
    genuine: bool
    own_failure: str = ""


# torchrun's own log lines (a worker's carry its `[defaultN]:` prefix), as torch 2.14 words
# them: a failed worker (logged once the others are closed), the closing of the others (only
# ever because one ended non-zero, or torchrun itself got a signal), a signal torchrun got.
_WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_CLOSING = re.compile(r"Sending process (\d+) closing signal (\w+)")
_DEATH_SIGNAL = re.compile(r"Received (\S+) death signal")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def parse_stop_record(lines: list[str], key: str) -> StopRecord:
    """stop.sh's record: its first line says who stopped the node, `key=` proves that fleet
    wrote it, the rest are what the node had done by itself when the stop reached it (before
    any signal of the stop): `log=` torchrun's lines about its workers, `ended=PID PPID STATUS`
    the launcher or a worker ended but not yet reaped (waitpid's status)."""
    by = lines[0].strip() if lines else ""
    genuine = f"key={key}" in lines if key else True
    signalled = failed = closing = ended = ""
    for line in lines[1:]:
        name, _, value = line.partition("=")
        if name == "log" and not value.startswith("[default"):
            if m := _DEATH_SIGNAL.search(value):
                sig = m.group(1)
                signalled = signalled or (f"torchrun had received signal {sig} from outside "
                                          "fleet")
            elif m := _WORKER_FAILED.search(value):
                failed = failed or (f"torchrun had reported local rank {m.group(2)} (pid "
                                    f"{m.group(3)}) failed with exitcode {m.group(1)}")
            elif m := _CLOSING.search(value):
                closing = closing or ("torchrun was already closing its workers after one had "
                                      "ended")
        elif name == "ended":
            words = value.split()
            got = [number(w) for w in words]
            if len(got) == 3 and None not in got and got[2]:
                status = int(words[2])
                how = (f"been killed by {_signal_name(status & 0x7F)}" if status & 0x7F else
                       f"exited {status >> 8}")
                ended = ended or f"its process {words[0]} had {how}"
    return StopRecord(by or "stopped", genuine, signalled or failed or ended or closing)


def state(t: Transport, run_dir: str, key: str) -> NodeState:
    """The node's state; `key` is its stop key (RunRecord.stop_key), see parse_state."""
    return parse_state(t.run(state_script(run_dir), timeout=30, what="read the run's state").out,
                       key)


# ---- global ranks, where the rendezvous assigned them at launch ---------------------------
def ranks_script(run_dir: str) -> str:
    """What each worker's sitecustomize recorded: "<local rank> <global rank>" lines."""
    return (f"cd {quote(run_dir + '/ranks')} 2>/dev/null || exit 0\n"
            'for f in [0-9]*; do [ -f "$f" ] && echo "$f $(cat "$f")"; done; true')


def parse_ranks(out: str) -> dict[int, int]:
    ranks = {}
    for line in out.splitlines():
        words = line.split()
        # A rank file is the job's to write: plain numbers only.
        got = [number(w, 1 << 31) for w in words]
        if len(got) == 2 and got[0] is not None and got[1] is not None:
            ranks[got[0]] = got[1]
    return ranks


def ranks(t: Transport, run_dir: str) -> dict[int, int]:
    return parse_ranks(t.run(ranks_script(run_dir), timeout=30, what="read the ranks").out)


# ---- runs that still hold a node ----------------------------------------------------------
def held_script(runs_dir: str) -> str:
    """Every run directory under runs_dir without an exit code: its machine and whether its pid
    is alive here (which means something only where the machine is this one: a directory shared
    with other machines holds their runs too, and their pids mean nothing here)."""
    return "\n".join([
        f"cd {home_word(runs_dir)} 2>/dev/null || exit 0",
        f'echo "me={MACHINE_ID}"',
        'for d in */*/; do d=${d%/}; [ -d "$d" ] || continue; [ -e "$d/exit_code" ] && continue',
        '  p=$(cat "$d/pid" 2>/dev/null) || continue',
        '  alive=no; kill -0 "$p" 2>/dev/null && alive=yes',
        '  echo "run=$d $alive $(cat "$d/machine" 2>/dev/null)"',
        "done",
    ])


def parse_held(out: str) -> list[str]:
    """The runs (run-id/node) alive on this very machine."""
    me = ""
    held = []
    for line in out.splitlines():
        if line.startswith("me="):
            me = line[3:].strip()
        elif line.startswith("run="):
            parts = line[4:].split(" ", 2) + ["", ""]
            path, alive, machine = parts[0], parts[1], parts[2].strip()
            if alive == "yes" and machine in (me, ""):
                held.append(path)
    return held


def held_by(t: Transport, runs_dir: str) -> list[str]:
    """Runs of fleet still alive on this node (another launch, maybe another user's)."""
    return parse_held(t.run(held_script(runs_dir), timeout=30, what="list live runs").out)


# ---- the master's port --------------------------------------------------------------------
_CONNECT = ("import socket, sys\n"
            "try:\n"
            "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()\n"
            "except OSError as e:\n"
            "    print(e); sys.exit(1)\n")


def connect_script(python: str, addr: str, port: int | str) -> str:
    """Exits 0 if a TCP connection to addr:port opens from the node (IPv4 or IPv6)."""
    return sh(python, "-I", "-S", "-c", _CONNECT, addr, str(port)) + " 2>&1"


def wait_port(t: Transport, run_dir: str, addr: str, port: int, timeout: float,
              key: str) -> None:
    """Wait until the master's rendezvous port accepts connections, checked on the master
    itself; fails early if the master's run already failed (one that already succeeded, a
    short job, needs no port any more)."""
    deadline = time.monotonic() + timeout
    while True:
        if t.run(connect_script(t.host.python, addr, port), timeout=15,
                 what="probe the rendezvous port").ok:
            return
        st = state(t, run_dir, key)
        if st.status is NodeStatus.SUCCEEDED:
            return
        if st.done:
            log = t.run(sh("tail", "-n", "30", f"{run_dir}/node.log"), timeout=15).out
            hints = "\n".join(format_diagnoses(diagnose(log)))
            raise JobFailed(f"{t.host.name}: the master's launcher ended ({st.status.value}, "
                            f"exit {st.code}) before its rendezvous port {addr}:{port} opened; "
                            f"its log ends:\n{log}{hints}")
        if time.monotonic() > deadline:
            raise RemoteCommandError(t.host.name, f"wait for {addr}:{port}", 1,
                                     f"rendezvous port {addr}:{port} not open after {timeout:.0f}s")
        time.sleep(0.25)


def follow_script(run_dir: str, pid: int | None, offset: int = 0) -> str:
    """node.log from a byte on (0: its start); with the wrapper's pid, until the wrapper ends.
    Its end is an event where run.sh holds its lock: a shared flock returns at once then, the
    waiter exits and is reaped by this shell, and tail (checking every 0.05 s) reads the rest
    and stops. Elsewhere tail watches the wrapper's pid. tail is never the script's last
    command: a shell would exec it, and the waiter would become tail's own unreaped child."""
    log = f"{run_dir}/node.log"
    if pid is None:
        return sh("tail", "-c", f"+{offset + 1}", log) + " 2>/dev/null"
    return "\n".join([
        _end_waiter(run_dir, pid),
        sh("tail", "-c", f"+{offset + 1}", "-F", "-s", "0.05", "--pid") + f' "$w" {quote(log)}'
        " 2>/dev/null",
        "code=$?",
        'exit "$code"',
    ])


def _end_waiter(run_dir: str, pid: int) -> str:
    """Sets $w to a process that lives exactly as long as the run's wrapper: a shared flock on
    run.sh's lock where it took one, else the wrapper itself."""
    d = quote(run_dir)
    return "\n".join([
        f"w={pid}",
        f"if [ -e {d}/locked ] && command -v flock >/dev/null 2>&1; then",
        f"  flock -s {d}/lock true 2>/dev/null & w=$!",
        "fi",
    ])


def follow(t: Transport, run_dir: str, pid: int | None, on_lines: Callable[[list[str]], None],
           stop: threading.Event | None = None, received: Received | None = None) -> int:
    """Stream node.log until the run's wrapper process exits (or `stop`), from the byte where
    `received` says a stream before this one ended (its start, without)."""
    return t.stream(follow_script(run_dir, pid, received.offset if received else 0), on_lines,
                    stop, received)


def end_script(run_dir: str, pid: int) -> str:
    """Waits until the run's wrapper has ended, then says the run's state (state_script). It
    prints nothing before: the end reaches fleet as soon as it happens, on a channel of its
    own, however much of node.log is still on its way. A wrapper that is a zombie nobody reaps
    still answers kill -0: there, its exit code file says it ended."""
    d = quote(run_dir)
    return "\n".join([
        f"if [ -e {d}/locked ] && command -v flock >/dev/null 2>&1; then",
        f"  flock -s {d}/lock true 2>/dev/null",
        "else",
        f"  while kill -0 {pid} 2>/dev/null && [ ! -e {d}/exit_code ]; do sleep 0.2; done",
        "fi",
        state_script(run_dir),
    ])


def wait_end(t: Transport, run_dir: str, pid: int, key: str,
             stop: threading.Event | None = None) -> NodeState | None:
    """The run's state once its wrapper has ended on the node (`key`: its stop key, see
    parse_state); None if `stop` came first."""
    out: list[str] = []
    if t.stream(end_script(run_dir, pid), out.extend, stop) == -1:
        return None
    return parse_state("\n".join(out), key)


def on_nodes(record: RunRecord, fn: Callable[[Transport, str], R]) -> dict[str, R | Exception]:
    """fn(transport, run dir) on every node of a recorded run, connected afresh, in parallel."""

    def one(node: NodeRecord) -> R:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        with open_transport(node.host, hello=not absolute) as t:
            return fn(t, t.path(node.run_dir))

    return each(((n.host.name, n) for n in record.nodes), one)


def remove_script(run_dir: str) -> str:
    """Delete the node's run directory, and the run's directory if no other node's is left."""
    return f"rm -rf {quote(run_dir)} && {{ rmdir {quote(run_dir.rsplit('/', 1)[0])} " \
           "2>/dev/null; true; }"


def remove(t: Transport, run_dir: str) -> str:
    """Delete a finished run's directory on the node."""
    st = state(t, run_dir, "")  # ended or not is all that counts here, not who ended it
    if not st.done:
        raise UsageError(f"the run is still {st.status.value} here: stop it first")
    t.run(remove_script(run_dir), timeout=60, what=f"remove {run_dir}").check(t.host.name)
    return run_dir


# ---- stop ---------------------------------------------------------------------------------
MARK_WAIT_S = 10.0  # how long a node's stop waits for the others' records before it signals


def parse_stop(out: str) -> list[int] | None:
    """The pids still alive after stop.sh, or None if it did not get as far as saying."""
    if "left=" not in out:
        return None
    return [n for p in out.rsplit("left=", 1)[-1].split() if (n := number(p)) is not None]


def stop_script(run_dir: str, by: str, key: str, mark: bool = False) -> str:
    """The node's stop.sh, saying who stops it, with the node's key on its stdin (never in an
    argv or environment a job could read); with `mark`, it only records the stop. Without
    stop.sh (fleet died while it uploaded the scripts, before anything started there) nothing
    of the run can be running: the directory is only marked stopped."""
    d = quote(run_dir)
    args = [by, "mark"] if mark else [by]
    return "\n".join([
        f"if [ -f {d}/stop.sh ]; then printf '%s\\n' {quote(key)} | "
        f"{sh('sh', f'{run_dir}/stop.sh', *args)}; exit $?; fi",
        f"[ ! -d {d} ] || grep -qxF {quote('key=' + key)} {d}/stopped 2>/dev/null || "
        f"printf '%s\\n' {quote(by)} {quote('key=' + key)} > {d}/stopped",
        "echo marked" if mark else "echo left=",
    ])


def mark(t: Transport, run_dir: str, by: str, key: str) -> None:
    """Record the stop on the node, and what its own part had done by then, signalling
    nothing."""
    r = t.run(stop_script(run_dir, by, key, mark=True), timeout=30, what="stop.sh mark")
    if "marked" not in r.out.split():
        raise RemoteCommandError(t.host.name, "stop.sh mark", r.code, r.out + r.err)


def stop(t: Transport, run_dir: str, by: str, key: str) -> list[int]:
    """Stop the run on the node; returns the pids of the run still alive after it (none,
    normally)."""
    r = t.run(stop_script(run_dir, by, key), timeout=60, what="stop.sh")
    left = parse_stop(r.out)
    if left is None:
        raise RemoteCommandError(t.host.name, "stop.sh", r.code, r.out + r.err)
    return left


Target = Callable[[], AbstractContextManager[tuple[Transport, str, str]]]


def stop_together(targets: list[tuple[str, Target]], by: str) -> dict[str, list[int] | Exception]:
    """Stop the run on several nodes, each target giving (transport, run dir, stop key). Every
    node's stop is recorded before any node is signalled: a node records whether its own part
    had already failed, and the stop of another node (its peers gone) must not decide that.
    A node that cannot be marked holds the others back MARK_WAIT_S at most."""
    gate = threading.Barrier(max(1, len(targets)))

    def one(target: Target) -> list[int]:
        arrived = [False]

        def arrive() -> None:
            if not arrived[0]:
                arrived[0] = True
                with contextlib.suppress(threading.BrokenBarrierError):
                    gate.wait(timeout=MARK_WAIT_S)

        try:
            with target() as (t, run_dir, key):
                try:
                    mark(t, run_dir, by, key)
                except FleetError:
                    pass  # stop.sh records the stop itself below, if the node answers at all
                finally:
                    arrive()
                return stop(t, run_dir, by, key)
        finally:
            arrive()

    return each(targets, one)


def stop_recorded(record: RunRecord, by: str) -> dict[str, list[int] | Exception]:
    """Stop a recorded run on every node, connected afresh (see stop_together)."""

    @contextlib.contextmanager
    def connect(node: NodeRecord) -> Iterator[tuple[Transport, str, str]]:
        absolute = node.run_dir.startswith("/")  # recorded expanded: no home needed
        with open_transport(node.host, hello=not absolute) as t:
            yield t, t.path(node.run_dir), record.stop_key(node.host.name)

    return stop_together([(n.host.name, lambda n=n: connect(n))  # type: ignore[misc]
                          for n in record.nodes], by)
