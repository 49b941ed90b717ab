"""What a node's run directory says of the run there: its state and who stopped it, the global
ranks its workers were given, and the runs still alive on the node. Each fact is a program under
fleet/nodeside plus a pure parser of what it prints."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from fleet.nodedata import number
from fleet.nodeside import shell_program
from fleet.shell import MACHINE_ID, Raw, home_word
from fleet.states import NodeOutcome, NodeStatus
from fleet.transport import Transport


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
    bad: str = ""  # FAILED: what its exit code file held that is no exit code

    @property
    def done(self) -> bool:
        return self.status.is_terminal

    def outcome(self, name: str, node_rank: int) -> NodeOutcome:
        """The node's outcome as the run's report and record say it."""
        return NodeOutcome(name, node_rank, self.status, self.code, self.bad or self.stopped_by,
                           self.own_failure, self.elapsed)


# ---- state --------------------------------------------------------------------------------
def state_script(run_dir: str) -> str:
    return shell_program("run_state.sh", run_dir, Raw(f'"{MACHINE_ID}"'))


def _int(text: str | None) -> int | None:
    return number(text, signed=True)


EXIT_CODES = 256  # what a wrapper's `$?` can be: 0-255


def exit_code(text: str) -> int | None:
    """An exit code as run.sh writes it (0-255); None for anything else (the job can write the
    file too)."""
    return number(text, EXIT_CODES)


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
    pid, said = number(fields.get("pid"), 1 << 22), fields.get("code", "").strip()
    code = exit_code(said)
    started, now = _int(fields.get("started")), _int(fields.get("now"))
    by, own = (stop.by, stop.own_failure) if stop else ("", "")
    # A pid means something only on the machine (and boot) that recorded it: after a reboot or
    # from another machine sharing the directory, it may be anyone's.
    machine = fields.get("machine", "").strip()
    alive = "alive" in lines and machine in ("", fields.get("me", "").strip())
    # Durations by the node's clock alone: its start, and its end, its last sign of life (a
    # wrapper killed outright records no end) or its present time.
    end = now if alive else _int(fields.get("ended")) if said else _int(fields.get("last"))
    elapsed = end - started if end is not None and started is not None else None
    # While the wrapper lives, its exit code file is only ever the job's (run.sh writes it as
    # it ends): running, whatever that file holds, and nothing to keep as an end.
    if alive:  # with a stop record: being stopped
        return NodeState(NodeStatus.RUNNING, None, pid, elapsed, by, own)
    if said and code is None:
        return NodeState(NodeStatus.FAILED, None, pid, elapsed,
                         bad=f"its exit_code file holds {said[:20]!r}, which is no exit code")
    if code is not None:
        if stop is not None and code != 0:
            # Its own part had failed before the stop reached it: failed, whatever the stop did.
            status = NodeStatus.FAILED if own else NodeStatus.STOPPED
            return NodeState(status, code, pid, elapsed, by, own)
        status = NodeStatus.SUCCEEDED if code == 0 else NodeStatus.FAILED
        return NodeState(status, code, pid, elapsed)
    # Stopped before it ran, or its wrapper killed outright by the stop; not a part that had
    # started and was found ended already (a reboot): nothing was stopped there.
    if stop is not None and (stop.found or pid is None):
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
    found: bool = True  # the stop found a process of the run (`found=none`: it had ended)


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
    return StopRecord(by or "stopped", genuine, signalled or failed or ended or closing,
                      "found=none" not in lines[1:])


def state(t: Transport, run_dir: str, key: str) -> NodeState:
    """The node's state; `key` is its stop key (RunRecord.stop_key), see parse_state."""
    return parse_state(t.run(state_script(run_dir), timeout=30, what="read the run's state").out,
                       key)


# ---- global ranks, where the rendezvous assigned them at launch ---------------------------
def ranks_script(run_dir: str) -> str:
    """What each worker's sitecustomize recorded: "<local rank> <global rank>" lines."""
    return shell_program("ranks.sh", run_dir)


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
    return shell_program("held_runs.sh", Raw(home_word(runs_dir)), Raw(f'"{MACHINE_ID}"'))


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
