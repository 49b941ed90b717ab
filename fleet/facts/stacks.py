"""Every rank's Python stack, from every node, grouped so that the rank that is different stands
out: one command per node plus pure parsers, and the grouping.

How stacks are taken: fleet's sitecustomize (on the PYTHONPATH of every process of a run)
registers Python's own faulthandler for one real-time signal (SIGRTMIN+7, which nothing sends
unless asked), writing to <run dir>/stacks/<pid>. The dump command sends that signal to each
live process that registered and reads the files back. This needs no extra package and no
ptrace rights (so it works for a non-root user whatever kernel.yama.ptrace_scope says), takes
the stack even from a rank blocked inside a C++ collective, and changes nothing until a dump is
asked for. A process that did not register (started with `python -I`, or outside fleet's env) is
still listed, with its command line, and py-spy takes its stack where py-spy is installed on
the node (`py-spy dump` needs ptrace rights over it)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fleet.console import printable
from fleet.indices import ranges
from fleet.nodedata import number
from fleet.nodeside import shell_program
from fleet.sizes import short

if TYPE_CHECKING:  # a type only: fleet.plan imports this module's names and stays below transport
    from fleet.transport import Transport

# In the run directory, where the job asks for it (fleet.plan.flight_recorder_env): the NCCL
# flight recorder's dumps, and <prefix><rank>.pipe: writing to it asks that rank for a dump.
FR_TRACE = "nccl_trace_rank_"
FR_PIPE = "nccl_trace_pipe_"
WAIT_TICKS = 30  # tenths of a second a dump waits for the processes to write their stacks
STACK_BYTES = 1 << 20  # of one process's stack file, read back
PID_MAX = 1 << 22  # the kernel's largest pid (PID_MAX_LIMIT)
# A process's stack is asked for only with a real-time signal (what fleet's sitecustomize
# registers), whatever its .who file says: never one that stops or ends a process.
SIG_RT = (34, 64)


def dump_script(run_dir: str, run_id: str) -> str:
    """Signal every registered process of this run on this node, then print per process its
    identity and stack; then the run's other processes (pid and command line), with py-spy's
    dump of those that are Python where py-spy exists (fleet/nodeside/dump_stacks.sh, whose
    output is framed: what the job wrote never passes for one of its headers)."""
    return shell_program("dump_stacks.sh", run_dir, run_id, FR_PIPE, FR_TRACE, *SIG_RT,
                         WAIT_TICKS, STACK_BYTES, uses=("run_pids.sh",))


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def where(self) -> str:
        return f"{self.func}() ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True)
class RankStack:
    """The main thread's stack of one process, innermost frame first."""

    host: str
    pid: int
    rank: int | None  # global rank (None: not a launcher's worker)
    local_rank: int | None
    frames: tuple[Frame, ...]
    threads: int = 1  # threads with a Python stack in the process

    @property
    def who(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"


@dataclass(frozen=True)
class FlightRecord:
    """A flight recorder file the node listed in its run dir: its name as the node gave it
    (to be checked before it names anything), and its size (None: a symbolic link)."""

    name: str
    size: int | None


@dataclass(frozen=True)
class NodeDump:
    host: str
    stacks: tuple[RankStack, ...] = ()
    others: tuple[tuple[int, str], ...] = ()  # (pid, command line) of the run's other processes
    missing: bool = False  # no run directory on this node
    flight_records: tuple[FlightRecord, ...] = ()
    ended: int | None = None  # its part of the run ended, with this exit code


_FH_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_SPY_THREAD = re.compile(r'^Thread \d+ \(.*\)')
_SPY_FRAME = re.compile(r"^\s+(\S.*) \((.*):(\d+)\)$")


def parse_threads(text: str) -> list[tuple[Frame, ...]]:
    """Every thread's frames (innermost first) from faulthandler's or py-spy's dump."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _FH_THREAD.match(line.strip()) or _SPY_THREAD.match(line.strip()):
            threads.append([])
            continue
        m = _FH_FRAME.match(line)
        if m and threads:
            threads[-1].append(Frame(m.group(1), int(m.group(2)), m.group(3)))
            continue
        m = _SPY_FRAME.match(line)
        if m and threads:
            threads[-1].append(Frame(m.group(2), int(m.group(3)), m.group(1)))
    return [tuple(t) for t in threads if t]


def main_thread(threads: list[tuple[Frame, ...]]) -> tuple[Frame, ...]:
    """The thread running the script: its outermost frame is a module's body (or runpy's);
    other threads start in threading's bootstrap."""
    for t in threads:
        if t[-1].func == "<module>" or "runpy" in t[-1].file:
            return t
    return threads[0] if threads else ()


def parse_dump(host: str, out: str) -> NodeDump:
    """What dump_script printed: a header per section (`=== `), each line of what the job
    could write under one (`|`); pids, codes and sizes are taken only as plain numbers."""
    if out.strip() == "missing":
        return NodeDump(host, missing=True)
    stacks: list[RankStack] = []
    others: list[tuple[int, str]] = []
    records: list[FlightRecord] = []
    ended = None
    for head, body in _sections(out):
        words = head.split()
        pid = _number(words[1], PID_MAX) if len(words) >= 2 else None
        if len(words) == 2 and words[0] == "ended":
            code = _number(words[1].removeprefix("-"), 1 << 31)
            ended = -1 if code is None or words[1].startswith("-") else code
        elif len(words) in (3, 4) and words[0] == "fr":
            record = _record(words[1], words[2])
            if record is not None:
                records.append(record)
        elif len(words) >= 2 and words[0] == "stack" and pid:
            fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
            threads = parse_threads(body)
            stacks.append(RankStack(host, pid, _int(fields.get("rank")),
                                    _int(fields.get("local")), main_thread(threads),
                                    len(threads)))
        elif len(words) >= 2 and words[0] == "proc" and pid:
            threads = parse_threads(body)
            cmd = head.split(" ", 2)[2].strip() if len(words) > 2 else ""
            if threads:
                stacks.append(RankStack(host, pid, None, None, main_thread(threads),
                                        len(threads)))
            else:
                others.append((pid, cmd))
    return NodeDump(host, tuple(stacks), tuple(others), flight_records=tuple(records),
                    ended=ended)


def _record(hex_name: str, size: str) -> FlightRecord | None:
    try:
        name = bytes.fromhex(hex_name).decode("utf-8", "backslashreplace")
    except ValueError:
        return None
    return FlightRecord(name, None if size == "-" else _number(size, 1 << 62))


def _sections(out: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, list[str]]] = []
    for line in out.splitlines():
        if line.startswith("=== "):
            sections.append((line[4:], []))
        elif line.startswith("|") and sections:
            sections[-1][1].append(line[1:])
    return [(h, "\n".join(b)) for h, b in sections]


def _number(text: str | None, limit: int) -> int | None:
    return number(text, limit)


def _int(text: str | None) -> int | None:
    return _number(text, 1 << 31)


def dump(t: Transport, run_dir: str, run_id: str) -> NodeDump:
    out = t.run(dump_script(run_dir, run_id), timeout=60, what="dump the stacks").out
    return parse_dump(t.host.name, out)


# ---- grouping ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Group:
    frames: tuple[Frame, ...]
    members: tuple[RankStack, ...] = field(default=())

    def where(self) -> str:
        return self.frames[0].where() if self.frames else "no Python frame"

    def who(self) -> str:
        return _who(list(self.members))


# Frames of decorators and wrappers: where a rank "is" is the innermost frame that is not one.
_WRAPPERS = {"wrapper", "inner", "_fn", "decorate_context", "_wrapped_call_impl", "_call_impl"}


def where(frames: tuple[Frame, ...]) -> str:
    for f in frames:
        if f.func not in _WRAPPERS:
            return f.where()
    return frames[0].where() if frames else "no Python frame"


def _same(frames: tuple[Frame, ...]) -> tuple[tuple[str, int, str], ...]:
    """What makes two stacks identical: file names, lines and functions. Not directories: every
    node has its own code directory, and venvs may lie elsewhere from node to node."""
    return tuple((f.file.rsplit("/", 1)[-1], f.line, f.func) for f in frames)


def group(stacks: list[RankStack]) -> list[Group]:
    """Identical main-thread stacks collapsed, with the ranks that share each; the largest
    group first (the odd ones out last), ranks in order within a group."""
    groups: dict[tuple[tuple[str, int, str], ...], list[RankStack]] = {}
    for s in stacks:
        groups.setdefault(_same(s.frames), []).append(s)
    ordered = sorted(groups.values(), key=lambda ms: (-len(ms), _order(ms[0])))
    return [Group(ms[0].frames, tuple(sorted(ms, key=_order))) for ms in ordered]


def _order(s: RankStack) -> tuple[int, str, int]:
    return (s.rank if s.rank is not None else 1 << 30, s.host, s.pid)


def _who(members: list[RankStack]) -> str:
    """"rank 3 on node2", "ranks 0-1 on node1, rank 2 on node2"."""
    by_host: dict[str, list[RankStack]] = {}
    for m in members:
        by_host.setdefault(m.host, []).append(m)
    parts = []
    for host, ms in by_host.items():
        ranks = sorted(m.rank for m in ms if m.rank is not None)
        pids = [m.pid for m in ms if m.rank is None]
        words = []
        if ranks:
            words.append(("rank " if len(ranks) == 1 else "ranks ") + ranges(ranks))
        if pids:
            words.append(("pid " if len(pids) == 1 else "pids ") + ", ".join(map(str, pids)))
        parts.append(f"{' and '.join(words)} on {host}")
    return ", ".join(parts)


def verdict(groups: list[Group], hung: bool = False) -> str:
    """One sentence naming the rank that is different, where one is. Only `hung` (silence
    measured by the watchdog) says the others wait: a dump of a healthy run is a snapshot,
    where ranks are simply somewhere."""
    if not groups:
        return "no rank's stack could be taken"
    if len(groups) == 1:
        g = groups[0]
        n = len(g.members)
        return f"all {n} rank(s) are in {where(g.frames)}" if n > 1 else \
            f"{g.who()} is in {where(g.frames)}"
    main, odd = groups[0], groups[1:]
    if len(main.members) > max(len(g.members) for g in odd):
        others = "; ".join(f"{g.who()} is in {where(g.frames)}" for g in odd)
        n = len(main.members)
        rest = f"the other {n} rank(s)" if n > 1 else f"{main.who()}"
        verb = ("wait" if n > 1 else "waits") if hung else ("are" if n > 1 else "is")
        return f"{others}; {rest} {verb} in {where(main.frames)}"
    return "; ".join(f"{g.who()}: {where(g.frames)}" for g in groups)


_LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
              "/torchrun", "/accelerate")


def is_launcher(cmd: str) -> bool:
    """A launcher's agent: a python running torchrun or accelerate (not a shell script that
    merely names them in its arguments)."""
    words = cmd.split()
    if not words or not words[0].rsplit("/", 1)[-1].startswith("python"):
        return False
    return any(w in _LAUNCHERS or w.endswith(("/torchrun", "/accelerate")) for w in words[1:3])


def startup(dumps: list[NodeDump]) -> list[str]:
    """No rank has started anywhere: the rendezvous is incomplete. Which nodes have not joined
    (no launcher running there), and what every node is running."""
    if all(d.missing or d.ended is not None for d in dumps):
        return ["the run is not running on any node (it has ended): no stack to take"]
    lines = ["no rank has started on any node: the rendezvous is incomplete"]
    for d in dumps:
        if d.missing:
            lines.append(f"{d.host}: no run directory (it never started)")
            continue
        if d.ended is not None:
            lines.append(f"{d.host}: its part has ended (exit {d.ended})")
            continue
        cmds = [cmd for _, cmd in d.others if not cmd.startswith(("sh ./run.sh", "sh run.sh"))]
        running = "; ".join(c[:120] for c in cmds) or "nothing but its run.sh"
        if any(is_launcher(c) for c in cmds):
            lines.append(f"{d.host} waits at the rendezvous (its launcher runs: {running})")
        else:
            lines.append(f"{d.host} has not joined the rendezvous: it is running {running}")
    return lines


def report(dumps: list[NodeDump], hung: bool = False) -> list[str]:
    """The lines fleet prints: the verdict (see verdict() for `hung`), each group's stack once
    with its ranks, and each node's processes that gave no stack; where no rank has started,
    what each node is doing."""
    stacks = [s for d in dumps for s in d.stacks]
    if not any(s.rank is not None for s in stacks):
        return startup(dumps)
    groups = group(stacks)
    lines = [verdict(groups, hung)]
    for g in groups:
        lines.append(f"{g.who()} ({len(g.members)} process(es)), most recent call first:")
        lines += [f"    {f.file}:{f.line} in {f.func}" for f in g.frames] or ["    (no frame)"]
    for d in dumps:
        if d.missing:
            lines.append(f"{d.host}: no run directory")
        for r in d.flight_records:
            size = short(r.size) if r.size is not None else "a symbolic link"
            lines.append(f"{d.host}: NCCL flight recorder dump {printable(r.name)} ({size})")
    return lines
