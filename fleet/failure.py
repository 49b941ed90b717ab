"""Why a run failed: the first failing rank and its traceback, apart from the collateral."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from fleet.diagnose import diagnose, format_diagnoses
from fleet.logs import RANK_PREFIX
from fleet.shell import Raw, sh
from fleet.transport import Transport

TRACE_LINES = 15
LOG_LINES = 200  # of node.log's end, to find a traceback in
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?time\s*:\s*(\S+).*?rank\s*:\s*(\d+) "
    r"\(local_rank: (\d+)\).*?exitcode\s*:\s*(-?\d+)", re.S)
_LOCAL_DIR = re.compile(r"attempt_\d+/(\d+)/(error\.json|stderr\.log) ([\d.]+)$")


@dataclass(frozen=True)
class RankFailure:
    """The first failure torchrun saw on one node."""

    node: str
    node_rank: int
    rank: int | None  # global rank as torchrun reported it
    local_rank: int | None
    exitcode: int | None
    when: float | None  # when the rank's error (or stderr) file was last written, epoch seconds
    #                     by this machine's clock (the node's clock offset taken off)
    traceback: str  # the script's own traceback (error file), else the rank's stderr tail
    log: str = ""  # the end of the node's log, for recognising known failures


def _report_script(run_dir: str) -> str:
    """One command printing the node's log tail, error files and the ranks' stderr tails."""
    return " ".join([
        sh("cd", run_dir), Raw("2>/dev/null || exit 0;"),
        Raw(f"echo '=== log'; tail -n {LOG_LINES} node.log 2>/dev/null;"),
        Raw("for f in torchrun/*/attempt_*/*/error.json; do [ -f \"$f\" ] && "
            "{ echo \"=== $f $(stat -c %.9Y \"$f\")\"; cat \"$f\"; echo; }; done;"),
        Raw(f"for f in torchrun/*/attempt_*/*/stderr.log; do [ -f \"$f\" ] && "
            f"{{ echo \"=== $f $(stat -c %.9Y \"$f\")\"; tail -n {TRACE_LINES} \"$f\"; }}; "
            "done; true"),
    ])


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


def explain(t: Transport, node: str, node_rank: int, run_dir: str) -> RankFailure | None:
    """The root cause torchrun recorded on this node, if it recorded one."""
    out = t.run(_report_script(run_dir), timeout=30, what="read the failure report").out
    return parse_report(out, node, node_rank, t.clock_offset)


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
        local = int(cause.group(3))
        when, trace = errors.get(local) or stderr.get(local) or (None, "")
        # A launcher fleet did not start keeps its error files elsewhere: the log has it all.
        return RankFailure(node, node_rank, int(cause.group(2)), local, int(cause.group(4)),
                           when, _tail(trace) if trace.strip() else log_traceback(log, local),
                           log)
    if errors:
        local, (when, trace) = min(errors.items(), key=lambda kv: kv[1][0])
        return RankFailure(node, node_rank, None, local, None, when, _tail(trace), log)
    if log.strip():
        return RankFailure(node, node_rank, None, None, None, None, log_traceback(log, None),
                           log)
    return None


_HEADERS = ("Traceback (most recent call last):",)


def log_traceback(log: str, local: int | None) -> str:
    """The last Python traceback in a log, through its exception line: the lines of one local
    rank where they carry torchrun's `[defaultN]:` prefix, else all of them. Without one, the
    log's last lines."""
    lines = log.splitlines()
    if local is None:  # the rank of the last traceback, if a rank printed it
        last = next((m for line in reversed(lines) if _HEADERS[0] in line
                     and (m := RANK_PREFIX.match(line))), None)
        local = int(last.group(1)) if last else None
    if local is not None:
        mine = [m.group(2) for line in lines
                if (m := RANK_PREFIX.match(line)) and int(m.group(1)) == local]
        lines = mine or lines
    starts = [i for i, line in enumerate(lines) if line.strip().startswith(_HEADERS[0])]
    if not starts:
        return _tail("\n".join(lines))
    start = starts[-1]  # of chained exceptions, the last says what failed
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t"):
        end += 1  # the frames, indented; the exception's own line is the first one that is not
    block = lines[start:end + 1]
    if len(block) > TRACE_LINES:
        block = [block[0], "  ..."] + block[-(TRACE_LINES - 2):]
    return "\n".join(block)


def _tail(text: str) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-TRACE_LINES:])


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


def summary(root: RankFailure) -> list[str]:
    """What a run's end says of its first failure: where, which rank, the traceback, and the
    hints for known signatures."""
    rank = f"rank {root.rank}" if root.rank is not None else "a rank"
    local = f" (local rank {root.local_rank})" if root.local_rank is not None else ""
    code = f", exit code {root.exitcode}" if root.exitcode is not None else ""
    return ([f"first failure: {root.node} (node rank {root.node_rank}), {rank}{local}{code}:"]
            + [f"    {line}" for line in root.traceback.splitlines()]
            + format_diagnoses(diagnose(root.traceback + "\n" + root.log)))
