"""Why a run failed: the first failing rank and its traceback, apart from the collateral."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass, replace

from fleet.facts.diagnose import diagnose, format_diagnoses
from fleet.nodeside import shell_program
from fleet.nodeside.shared.run_end import TRACEBACK
from fleet.transport import Transport

RANK_PREFIX = re.compile(r"\[default(\d+)\]:(.*)\Z", re.S)  # torchrun's tag on a line
TRACE_LINES = 15
LOG_LINES = 200  # of node.log's end, to find a traceback in
STDERR_LINES = 400  # of a rank's stderr.log's end, to find its last traceback's start in
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?time\s*:\s*(\S+).*?rank\s*:\s*(\d+) "
    r"\(local_rank: (\d+)\).*?exitcode\s*:\s*(-?\d+)(?: \(pid: (\d+)\))?", re.S)
_LOCAL_DIR = re.compile(r"attempt_\d+/(\d+)/(error\.json|stderr\.log) ([\d.]+)$")
HEADER = TRACEBACK  # a Python traceback's first line, as the node's notify watcher finds it
# torch.distributed's excepthook (after init_process_group) prefixes each line of an uncaught
# exception with the rank; the summary names the rank already.
_RANK_HOOK = re.compile(r"^\[rank\d+\]: ?")


@dataclass(frozen=True)
class RankFailure:
    """The first failure torchrun saw on one node."""

    node: str
    node_rank: int
    rank: int | None  # global rank as torchrun reported it
    local_rank: int | None
    exitcode: int | None  # negative: killed by that signal
    when: float | None  # when the rank's error (or stderr) file was last written, epoch seconds
    #                     by this machine's clock (the node's clock offset taken off)
    traceback: str  # the script's own traceback, from its `Traceback` line; else (found False)
    #                 the rank's last lines of output, or "" for a rank killed by a signal
    log: str = ""  # the end of the node's log, for recognising known failures
    found: bool = True  # `traceback` is a Python traceback
    pid: int | None = None  # the rank's process, as torchrun reported it
    kernel: tuple[str, ...] = ()  # what the node's kernel log says of a SIGKILL

    @property
    def signal(self) -> str | None:
        """The signal that killed the rank, by name, if one did."""
        if self.exitcode is None or self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


def _report_script(run_dir: str) -> str:
    """The node's log tail, error files, and each rank's stderr from its last `Traceback` line
    on (within its last STDERR_LINES lines), else its last lines (nodeside/failure_report.sh)."""
    return shell_program("failure_report.sh", run_dir, LOG_LINES, STDERR_LINES, TRACE_LINES,
                         HEADER)


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("=== "):
            name = line[4:]
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def explain(t: Transport, node: str, node_rank: int, run_dir: str,
            kernel_log: bool = False) -> RankFailure | None:
    """The root cause torchrun recorded on this node, if it recorded one; for a rank killed
    by SIGKILL, with what the node's kernel log says of it where `kernel_log` (t runs on that
    very node, not on a machine that only shares its files)."""
    out = t.run(_report_script(run_dir), timeout=30, what="read the failure report").out
    found = parse_report(out, node, node_rank, t.clock_offset)
    if kernel_log and found is not None and found.signal == "SIGKILL":
        kernel = t.run(KERNEL_LOG_SCRIPT, timeout=30, what="read the kernel log").out
        found = replace(found, kernel=tuple(parse_kernel_log(kernel, node, found.pid)))
    return found


def parse_report(out: str, node: str, node_rank: int,
                 clock_offset: float = 0.0) -> RankFailure | None:
    """The failure report of one node; file times are turned into this machine's clock by
    taking off the node's clock offset, so that nodes compare whatever their clocks say."""
    sections = _sections(out)
    log = sections.get("log", "")
    errors: dict[int, tuple[float, str]] = {}  # local rank -> (written at, traceback)
    stderr: dict[int, tuple[float, str]] = {}
    for name, body in sections.items():
        m = _LOCAL_DIR.search(name)
        if not m:
            continue
        local, written = int(m.group(1)), float(m.group(3)) - clock_offset
        if m.group(2) == "stderr.log":
            stderr[local] = (written, body)
            continue
        try:
            msg = json.loads(body)["message"]
            info = msg.get("extraInfo", {}) if isinstance(msg, dict) else {}
            text = info.get("py_callstack") or (msg.get("message") if isinstance(msg, dict)
                                                else str(msg))
            errors[local] = (written, str(text))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    cause = _ROOT_CAUSE.search(log)
    if cause:
        local, code = int(cause.group(3)), int(cause.group(4))
        pid = int(cause.group(5)) if cause.group(5) else None
        when = (errors.get(local) or stderr.get(local) or (None, ""))[0]
        if local in errors:
            trace, found = _trace(errors[local][1])
        elif code < 0:
            # Killed by a signal: Python printed nothing, and whatever it printed before (the
            # warnings of a healthy start) is no account of its end.
            trace, found = "", False
        else:
            # The rank's stderr from its last Traceback line; where that was cut, or where a
            # launcher fleet did not start keeps its files elsewhere, the node's log has it.
            trace, found = _trace(stderr.get(local, (None, ""))[1])
            if not found:
                trace, found = _log_trace(log, local, trace)
        return RankFailure(node, node_rank, int(cause.group(2)), local, code, when, trace, log,
                           found, pid)
    if errors:
        local, (when, text) = min(errors.items(), key=lambda kv: kv[1][0])
        trace, found = _trace(text)
        return RankFailure(node, node_rank, None, local, None, when, trace, log, found)
    if log.strip():
        trace, found = _log_trace(log, None, "")
        return RankFailure(node, node_rank, None, None, None, None, trace, log, found)
    return None


def _trace(text: str) -> tuple[str, bool]:
    """The last traceback in a text, else its last lines (and False)."""
    block = excerpt(text)
    return (block, True) if block is not None else (_tail(text), False)


def _log_trace(log: str, local: int | None, fallback: str) -> tuple[str, bool]:
    """The last traceback in the node's log (of one local rank, where known), else the
    fallback, else the log's last lines."""
    trace = log_traceback(log, local)
    if excerpt(trace) is not None:
        return trace, True
    return (fallback, False) if fallback.strip() else (trace, False)


def excerpt(text: str) -> str | None:
    """The last Python traceback in a text, from its `Traceback` line through its exception's
    line (of chained exceptions, the last says what failed); a long one keeps its first line
    and its end. None where the text has no `Traceback` line."""
    lines = [_RANK_HOOK.sub("", line) for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(HEADER)]
    if not starts:
        return None
    start = starts[-1]
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t"):
        end += 1  # the frames, indented; the exception's own line is the first one that is not
    block = lines[start:end + 1]
    if len(block) > TRACE_LINES:
        block = [block[0], "  ..."] + block[-(TRACE_LINES - 2):]
    return "\n".join(block)


def log_traceback(log: str, local: int | None) -> str:
    """The last Python traceback in a log, through its exception line: the lines of one local
    rank where they carry torchrun's `[defaultN]:` prefix, else all of them. Without one, the
    log's last lines."""
    lines = log.splitlines()
    if local is None:  # the rank of the last traceback, if a rank printed it
        last = next((m for line in reversed(lines) if HEADER in line
                     and (m := RANK_PREFIX.match(line))), None)
        local = int(last.group(1)) if last else None
    if local is not None:
        mine = [m.group(2) for line in lines
                if (m := RANK_PREFIX.match(line)) and int(m.group(1)) == local]
        lines = mine or lines
    block = excerpt("\n".join(lines))
    return block if block is not None else _tail("\n".join(lines))


def _tail(text: str) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-TRACE_LINES:])


# ---- the kernel log, for a rank killed by SIGKILL -------------------------------------------
KERNEL_LOG_SCRIPT = shell_program("kernel_log.sh")
# The kernel's own words for an OOM kill, globally or in a memory cgroup:
# "Out of memory: Killed process 1234 (python) total-vm:...", and its time since boot.
_OOM_KILL = re.compile(r"^(?:\[\s*(\d+\.\d+)\]\s*)?(.*Killed process (\d+) \(([^)]*)\).*)$")


def parse_kernel_log(out: str, host: str, pid: int | None) -> list[str]:
    """What the node's kernel log says of OOM kills, for a rank (pid, where known) that was
    killed by SIGKILL; a log this user may not read is said to be so, not an error."""
    fields = dict(line.split("=", 1) for line in out.splitlines()
                  if "=" in line and not line.startswith("kill|"))
    if "unreadable" in fields:
        why = fields["unreadable"].strip() or "dmesg failed"
        return [f"{host}'s kernel log could not be read ({why}): ask its admin to look for "
                "an OOM kill there (`sudo dmesg | grep -i 'killed process'`)"]
    if "readable" not in out.splitlines():
        return []
    uptime = _float(fields.get("uptime"))
    kills = [m for line in out.splitlines() if line.startswith("kill|")
             and (m := _OOM_KILL.match(line[5:].strip()))]
    if not kills:
        return [f"{host}'s kernel log (dmesg) holds no OOM kill: the SIGKILL came from "
                "elsewhere, or the log no longer goes back that far"]

    def said(m: re.Match[str]) -> str:
        at = _float(m.group(1))
        ago = f", {uptime - at:.0f}s ago" if at is not None and uptime is not None else ""
        return f"the kernel's OOM killer killed PID {m.group(3)} ({m.group(4)}){ago}"

    mine = [m for m in kills if pid is not None and int(m.group(3)) == pid]
    if mine:
        return [f"{host}'s kernel log: {said(mine[-1])}: the rank ran out of host memory"]
    of = f", none of PID {pid}" if pid is not None else ""
    return [f"{host}'s kernel log holds {len(kills)} OOM kill(s){of}; the latest: "
            f"{said(kills[-1])} (a container sees other PIDs than the kernel's)"]


def _float(text: str | None) -> float | None:
    try:
        return float(text or "")
    except ValueError:
        return None


def first(failures: list[RankFailure]) -> RankFailure | None:
    """The root cause among nodes' failures, given in the order fleet saw them end.

    Whichever rank wrote its error first failed first: the others only fail once its process is
    gone (a peer closing a Gloo/NCCL connection, or fleet's stop). File times have nanosecond
    precision, and are comparable across nodes as far as their clocks agree. A rank killed by
    a signal ranks after one that failed by itself; the order fleet saw breaks ties."""
    if not failures:
        return None
    return min(enumerate(failures), key=lambda iv: (
        iv[1].when if iv[1].when is not None else float("inf"),
        (iv[1].exitcode or 0) < 0, iv[0]))[1]


# What a signal that ended a rank says of why (torch reports it as a negative exit code).
_SIGNAL_CAUSES = {
    "SIGKILL": "SIGKILL ends a process at once, so it printed no Python traceback. Likely: "
               "the kernel's OOM killer (the host ran out of memory: check `dmesg` on {host}), "
               "or a person or program (an admin, a scheduler) that sent SIGKILL.",
    "SIGSEGV": "a crash in native code (a C/C++ extension, CUDA, a driver): no Python "
               "exception was raised.",
    "SIGBUS": "a crash in native code, often shared memory (/dev/shm) too small: no Python "
              "exception was raised.",
    "SIGABRT": "an abort in native code (a failed C++ check in torch, NCCL or CUDA): no "
               "Python exception was raised.",
}


def cause(root: RankFailure) -> str:
    """The first failure in the words of its report, on one line: `rank 1 on node2 killed by
    SIGKILL`, `rank 1 on node2: RuntimeError: boom`, `rank 1 on node2 exited with code 1`; ""
    where the report knows no more than that a rank failed."""
    where = f"{f'rank {root.rank}' if root.rank is not None else 'a rank'} on {root.node}"
    if root.signal:
        return f"{where} killed by {root.signal}"
    last = next((line.strip() for line in reversed(root.traceback.splitlines())
                 if line.strip()), "") if root.found else ""
    if last:
        return f"{where}: {last}"
    # Nothing said but that a rank failed: the node's own exit code says more (`node1 failed
    # (exit 3)`), so none is given here.
    return f"{where} exited with code {root.exitcode}" if root.exitcode is not None else ""


def summary(root: RankFailure) -> list[str]:
    """What a run's end says of its first failure: where, which rank, the traceback (or, for
    a signal, which one and its likely causes), and the hints for known signatures."""
    rank = f"rank {root.rank}" if root.rank is not None else "a rank"
    local = f" (local rank {root.local_rank})" if root.local_rank is not None else ""
    code = f", exit code {root.exitcode}" if root.exitcode is not None else ""
    sig = root.signal
    head = [f"first failure: {root.node} (node rank {root.node_rank}), {rank}{local}{code}"
            + (f": killed by {sig}" if sig else ":")]
    if sig and not root.found:
        cause = _SIGNAL_CAUSES.get(sig, "a signal from outside the job: no Python exception "
                                        "was raised.")
        return (head + [f"    {cause.format(host=root.node)}"]
                + [f"    {line}" for line in root.kernel])
    if not root.found and root.traceback.strip():
        head.append("    (no Python traceback found; its last lines of output:)")
    return (head + [f"    {line}" for line in root.traceback.splitlines()]
            + format_diagnoses(diagnose(root.traceback + "\n" + root.log)))
