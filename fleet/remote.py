"""Operations on one node's run directory: start, wait for the port, follow, state, stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from fleet.diagnose import diagnose, format_diagnoses
from fleet.errors import RemoteCommandError
from fleet.group import each
from fleet.shell import Raw, sh
from fleet.state import NodeRecord, RunRecord
from fleet.transport import Transport, open_transport

R = TypeVar("R")

# How long to wait for run.sh to record its pid after it was started.
PID_WAIT_TICKS = 100


@dataclass(frozen=True)
class NodeState:
    """What a node's run directory says about the run there."""

    state: str  # starting, running, succeeded, failed, stopped, missing
    code: int | None = None
    pid: int | None = None
    started: int | None = None  # epoch seconds, the node's clock
    ended: int | None = None

    @property
    def done(self) -> bool:
        return self.state in ("succeeded", "failed", "stopped", "missing")


def start(t: Transport, run_dir: str, run_id: str) -> int:
    """Start run.sh detached from this connection (own session, no tty); returns its pid."""
    cmd = " ".join([
        sh("cd", run_dir), Raw("|| exit 1;"),
        sh("env", f"FLEET_RUN_ID={run_id}", "setsid", "bash", "./run.sh"),
        Raw("> node.log 2>&1 < /dev/null &"),
        Raw(f"i=0; while [ ! -s pid ] && [ $i -lt {PID_WAIT_TICKS} ]; do sleep 0.05; "
            "i=$((i+1)); done; cat pid"),
    ])
    r = t.run(cmd, timeout=30)
    if not r.ok or not r.out.strip().isdigit():
        raise RemoteCommandError(t.host.name, "start run.sh", r.code, r.out + r.err)
    return int(r.out.strip())


def state(t: Transport, run_dir: str) -> NodeState:
    script = " ".join([sh("cd", run_dir), Raw("2>/dev/null || { echo missing; exit 0; };"),
                       Raw('echo "pid=$(cat pid 2>/dev/null)";'),
                       Raw('echo "code=$(cat exit_code 2>/dev/null)";'),
                       Raw('echo "started=$(cat started 2>/dev/null)";'),
                       Raw('echo "ended=$(stat -c %Y exit_code 2>/dev/null)";'),
                       Raw('[ -e stopped ] && echo stopped;'),
                       Raw('p=$(cat pid 2>/dev/null); [ -n "$p" ] && kill -0 "$p" 2>/dev/null '
                           '&& echo alive; true')])
    out = t.run(script, timeout=30).out.split()
    if "missing" in out:
        return NodeState("missing")
    fields = dict(w.split("=", 1) for w in out if "=" in w)
    pid = int(fields["pid"]) if fields.get("pid", "").isdigit() else None
    code_text = fields.get("code", "")
    code = int(code_text) if code_text.lstrip("-").isdigit() else None
    stopped = "stopped" in out
    times = {k: int(fields[k]) if fields.get(k, "").isdigit() else None
             for k in ("started", "ended")}
    if code is not None:
        if stopped and code != 0:
            return NodeState("stopped", code, pid, **times)
        return NodeState("succeeded" if code == 0 else "failed", code, pid, **times)
    if "alive" in out:
        return NodeState("running", None, pid, times["started"])
    if pid is None:
        return NodeState("starting")
    # The wrapper died without recording an exit code: killed outright.
    return NodeState("stopped" if stopped else "failed", None, pid, times["started"])


def wait_port(t: Transport, run_dir: str, addr: str, port: int, timeout: float) -> None:
    """Wait until the master's rendezvous port accepts connections, checked on the master
    itself; fails early if the master's run already ended."""
    probe = sh("bash", "-c", 'exec 3<>"/dev/tcp/$1/$2"', "probe", addr, str(port)) + \
        " " + Raw("2>/dev/null")
    deadline = time.monotonic() + timeout
    while True:
        if t.run(probe, timeout=15).ok:
            return
        st = state(t, run_dir)
        if st.state == "succeeded":
            return  # done before anyone could look: nothing to wait for
        if st.done:
            log = t.run(sh("tail", "-n", "30", f"{run_dir}/node.log"), timeout=15).out
            hints = "\n".join(format_diagnoses(diagnose(log)))
            raise RemoteCommandError(t.host.name, "the master's launcher", st.code or 1,
                                     f"it ended ({st.state}) before its rendezvous port "
                                     f"{addr}:{port} opened; its log ends:\n{log}{hints}")
        if time.monotonic() > deadline:
            raise RemoteCommandError(t.host.name, f"wait for {addr}:{port}", 1,
                                     f"rendezvous port {addr}:{port} not open after {timeout:.0f}s")
        time.sleep(0.25)


def follow(t: Transport, run_dir: str, pid: int | None, on_line: Callable[[str], None],
           stop: threading.Event | None = None, from_line: int = 1) -> int:
    """Stream node.log from a line on, until the run's wrapper process exits (or `stop`)."""
    args = ["tail", "-n", f"+{from_line}"]
    if pid is not None:
        args += ["-F", "-s", "0.2", "--pid", str(pid)]
    return t.stream(sh(*args, f"{run_dir}/node.log") + " " + Raw("2>/dev/null"), on_line, stop)


def on_nodes(record: RunRecord, fn: Callable[[Transport, str], R]) -> dict[str, R | Exception]:
    """fn(transport, run dir) on every node of a recorded run, connected afresh, in parallel."""

    def one(node: NodeRecord) -> R:
        with open_transport(node.host) as t:
            return fn(t, t.path(node.run_dir))

    return each(((n.host.name, n) for n in record.nodes), one)


def remove(t: Transport, run_dir: str) -> str:
    """Delete a finished run's directory on the node."""
    st = state(t, run_dir)
    if not st.done:
        raise RuntimeError(f"the run is still {st.state} here: stop it first")
    t.run(sh("rm", "-rf", run_dir), timeout=60)
    return run_dir


def stop(t: Transport, run_dir: str) -> list[int]:
    """Run the node's stop.sh; returns the pids of the run still alive after it (none, normally)."""
    r = t.run(sh("bash", f"{run_dir}/stop.sh"), timeout=60)
    left = r.out.rsplit("left=", 1)[-1].split() if "left=" in r.out else []
    if not r.ok and "left=" not in r.out:
        raise RemoteCommandError(t.host.name, "stop.sh", r.code, r.out + r.err)
    return [int(p) for p in left if p.isdigit()]
