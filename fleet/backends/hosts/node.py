"""What fleet does to one node's run: start its wrapper, wait for the master's port, follow its
log, wait for its end, stop it, remove its directory. Each a program (fleet/nodeside) or a short
command; what a run directory says (its state, ranks, runs still held) is fleet.facts.run_state."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from fleet.backends.hosts.ports import connect_script
from fleet.errors import (
    CommandTimedOut,
    FleetError,
    JobFailed,
    RemoteCommandError,
    UsageError,
)
from fleet.events import Ending
from fleet.facts.diagnose import diagnose, format_diagnoses
from fleet.facts.run_state import NodeState, parse_state, state, state_script
from fleet.facts.stopping import StillEnding, StopStep, parse_ending
from fleet.nodedata import number
from fleet.nodeside import loader, shell_program
from fleet.nodeside.shared import nodemap
from fleet.render import TREE_FILE
from fleet.run.record import Wrapper, parse_wrapper
from fleet.shell import quote, sh
from fleet.states import NodeStatus
from fleet.transport import Received, Transport
from fleet.transport.group import each

# How long to wait for run.sh to record its pid after it was started (0.01 s each).
PID_WAIT_TICKS = 500


# ---- start --------------------------------------------------------------------------------
def start_script(run_dir: str, run_id: str, python: str = "") -> str:
    """run.sh detached from this connection (own session, no tty); prints its pid and start
    time (fleet/nodeside/start.sh). With the node's `python`, node.log's time index is kept
    beside it (fleet/nodeside/log_times.py), the run's processes are recorded by descent
    (fleet/nodeside/run_tree.py), and where fleet wrote the watcher's config (a detached run),
    the nodes' own watcher starts (fleet/nodeside/watcher.py)."""
    if not python:
        return shell_program("start.sh", run_dir, run_id, PID_WAIT_TICKS)
    return shell_program("start.sh", run_dir, run_id, PID_WAIT_TICKS, python,
                         loader("log_times.py"), TREE_FILE, nodemap.WATCHER,
                         nodemap.WATCHER_CONFIG, python="log_times.py")


def parse_start(out: str) -> tuple[int | None, Wrapper | None]:
    """start.sh's last line, `<pid> <start>`: the wrapper's pid, and the wrapper itself where
    its start time came too (a node whose /proc could not be read says only the pid)."""
    lines = out.strip().splitlines()
    words = lines[-1].split() if lines else []
    pid = number(words[0], 1 << 22) if words else None
    if pid is None or len(words) > 2:
        return None, None
    return pid, parse_wrapper(lines[-1]) if len(words) == 2 else None


def start(t: Transport, run_dir: str, run_id: str) -> tuple[int, Wrapper | None]:
    r = t.run(start_script(run_dir, run_id, t.path(t.host.python)), timeout=30,
              what="start run.sh")
    pid, wrapper = parse_start(r.out)
    if not r.ok or pid is None:
        raise RemoteCommandError(t.host.name, "start run.sh", r.code, r.out + r.err)
    return pid, wrapper


# ---- the master's port --------------------------------------------------------------------
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
    """node.log from a byte on (0: its start); with the wrapper's pid, until the wrapper ends
    (fleet/nodeside/follow.sh says how)."""
    return shell_program("follow.sh", run_dir, "" if pid is None else pid, offset + 1)


def follow(t: Transport, run_dir: str, pid: int | None, on_lines: Callable[[list[str]], None],
           stop: threading.Event | None = None, received: Received | None = None) -> int:
    """Stream node.log until the run's wrapper process exits (or `stop`), from the byte where
    `received` says a stream before this one ended (its start, without)."""
    return t.stream(follow_script(run_dir, pid, received.offset if received else 0), on_lines,
                    stop, received)


def end_script(run_dir: str, pid: int) -> str:
    """Waits until the run's wrapper has ended (fleet/nodeside/wait_end.sh), then says the
    run's state (state_script). It prints nothing before: the end reaches fleet as soon as it
    happens, on a channel of its own, however much of node.log is still on its way."""
    return shell_program("wait_end.sh", run_dir, pid) + "\n" + state_script(run_dir)


def wait_end(t: Transport, run_dir: str, pid: int, key: str,
             stop: threading.Event | None = None) -> NodeState | None:
    """The run's state once its wrapper has ended on the node (`key`: its stop key, see
    parse_state); None if `stop` came first."""
    out: list[str] = []
    if t.stream(end_script(run_dir, pid), out.extend, stop) == -1:
        return None
    return parse_state("\n".join(out), key)


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


@dataclass(frozen=True)
class Stopped:
    """What stop.sh did on a node: the run's pids still alive after it (none, normally), and
    whether it found any process of the run to stop at all."""

    left: list[int]
    found: bool = True
    state: NodeState | None = None  # the run's state there once stopped, where it was asked


def parse_found(out: str) -> bool:
    """Whether stop.sh found a process of the run to stop; one that does not say (of a run
    started before stop.sh said it) is taken to have found one, as fleet said before."""
    return "found=no" not in [line.strip() for line in out.splitlines()]


def parse_stop(out: str) -> list[int] | None:
    """The pids still alive after stop.sh, or None if it did not get as far as saying."""
    if "left=" not in out:
        return None
    return [n for p in out.rsplit("left=", 1)[-1].split() if (n := number(p)) is not None]


def stop_script(run_dir: str, by: str, key: str, mark: bool = False,
                wrapper: Wrapper | None = None) -> str:
    """The node's stop.sh, saying who stops it, with the node's key on its stdin (never in an
    argv or environment a job could read), then its `wrapper` as fleet recorded it at the
    start (the run's start and session, which the job cannot rewrite); with `mark`, it only
    records the stop. Without stop.sh (fleet died while it uploaded the scripts, before
    anything started there) nothing of the run can be running: the directory is only marked
    stopped."""
    d = quote(run_dir)
    args = [by, "mark"] if mark else [by]
    given = quote(wrapper.words() if wrapper else "")
    return "\n".join([
        f"if [ -f {d}/stop.sh ]; then printf '%s\\n' {quote(key)} {given} | "
        f"{sh('sh', f'{run_dir}/stop.sh', *args)}; exit $?; fi",
        f"[ ! -d {d} ] || grep -qxF {quote('key=' + key)} {d}/stopped 2>/dev/null || "
        f"printf '%s\\n' {quote(by)} {quote('key=' + key)} > {d}/stopped",
        "echo marked" if mark else "echo found=no; echo left=",
    ])


def mark(t: Transport, run_dir: str, by: str, key: str, wrapper: Wrapper | None = None) -> None:
    """Record the stop on the node, and what its own part had done by then, signalling
    nothing."""
    r = t.run(stop_script(run_dir, by, key, mark=True, wrapper=wrapper), timeout=30,
              what="stop.sh mark")
    if "marked" not in r.out.split():
        raise RemoteCommandError(t.host.name, "stop.sh mark", r.code, r.out + r.err)


STOP_TIMEOUT_S = 60.0  # what a node's stop.sh may take (its grace, then SIGKILL, is shorter)


STATE_MARK = "--- state"  # between stop.sh's words and the run's state after it


def stop(t: Transport, run_dir: str, by: str, key: str, wrapper: Wrapper | None = None,
         on_ending: Callable[[StillEnding], None] | None = None,
         with_state: bool = False) -> Stopped:
    """Stop the run on the node: the pids of the run still alive after it (none, normally),
    and whether there was anything to stop. `wrapper`: the node's as fleet recorded it at the
    start (None: not known). `on_ending` hears, as it waits, what is still ending there.
    `with_state`: the run's state there once stopped, in the same round trip."""
    script = stop_script(run_dir, by, key, wrapper=wrapper)
    if with_state:
        script = f"(\n{script}\n)\necho {quote(STATE_MARK)}\n{state_script(run_dir)}"
    if on_ending is None:
        r = t.run(script, timeout=STOP_TIMEOUT_S, what="stop.sh")
        out, code, err = r.out, r.code, r.err
    else:
        said: list[str] = []

        def heard(lines: list[str]) -> None:
            said.extend(lines)
            for line in lines:
                if (still := parse_ending(line)) is not None:
                    on_ending(still)

        late = threading.Event()
        timer = threading.Timer(STOP_TIMEOUT_S, late.set)
        timer.daemon = True
        timer.start()
        try:
            code = t.stream(script, heard, late)
        finally:
            timer.cancel()
        if code == -1:
            raise CommandTimedOut(t.host.name, "stop.sh", STOP_TIMEOUT_S)
        out, err = "\n".join(said) + "\n", ""
    after: NodeState | None = None
    if with_state and f"\n{STATE_MARK}\n" in f"\n{out}":
        out, said_state = f"\n{out}".rsplit(f"\n{STATE_MARK}\n", 1)
        after = parse_state(said_state, key)
    left = parse_stop(out)
    if left is None:
        raise RemoteCommandError(t.host.name, "stop.sh", code, out + err)
    return Stopped(left, parse_found(out), after)


# A node's connection, run directory, stop key and wrapper (None: not recorded).
Target = Callable[[], AbstractContextManager[tuple[Transport, str, str, Wrapper | None]]]


def stop_together(targets: list[tuple[str, Target]], by: str,
                  heard: Callable[[str, StopStep | None], None] | None = None,
                  with_state: bool = False,
                  stopped: Callable[[str, Stopped], None] | None = None
                  ) -> dict[str, Stopped | Exception]:
    """Stop the run on several nodes, each target giving (transport, run dir, stop key,
    wrapper). Every node's stop is recorded before any node is signalled: a node records
    whether its own part had already failed, and the stop of another node (its peers gone)
    must not decide that.
    A node that cannot be marked holds the others back MARK_WAIT_S at most. `heard(node,
    what)`: what a node says is still ending as its stop waits, and None once it is done.
    `with_state`: each node's state after its stop comes in the same round trip; `stopped(node,
    what)` as each node's stop is done (kept at once: a stop interrupted later loses none)."""
    gate = threading.Barrier(max(1, len(targets)))

    def one(name: str, target: Target) -> Stopped:
        arrived = [False]

        def arrive() -> None:
            if not arrived[0]:
                arrived[0] = True
                with contextlib.suppress(threading.BrokenBarrierError):
                    gate.wait(timeout=MARK_WAIT_S)

        def step(what: Ending) -> None:
            if heard is not None:
                heard(name, what)

        try:
            step(Ending.CONNECTING)
            with target() as (t, run_dir, key, wrapper):
                step(Ending.RECORDING)
                try:
                    mark(t, run_dir, by, key, wrapper)
                except FleetError:
                    pass  # stop.sh records the stop itself below, if the node answers at all
                finally:
                    arrive()
                step(Ending.SIGNALLING)
                done = stop(t, run_dir, by, key, wrapper,
                            None if heard is None else lambda e: heard(name, e), with_state)
                if stopped is not None:
                    stopped(name, done)
                return done
        finally:
            arrive()
            if heard is not None:
                heard(name, None)

    return each(((name, (name, target)) for name, target in targets), lambda p: one(*p))
