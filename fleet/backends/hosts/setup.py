"""A job's setup: its `setup` script, run on the nodes before anything starts, once per
filesystem, and again only when the script or one of its `setup_inputs` changed since it last
succeeded there (a marker in the job's directory on the node holds that hash)."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from enum import Enum

from fleet import nodeside
from fleet.config.job import Job
from fleet.console import Console
from fleet.errors import SetupError, SetupFailed
from fleet.nodeside.shared import nodemap
from fleet.plan import NodePlan, Plan
from fleet.run import faults
from fleet.shell import quote, sh
from fleet.transport import Transport
from fleet.transport.group import each, failures
from fleet.waits import named

MARKER = ".fleet-setup"  # in the job's directory on the node: the hash of the last good setup
TAIL_LINES = 20  # of a failed setup's output, in the error


def setup_hash(job: Job) -> str | None:
    """What decides whether setup must run again: its text and its inputs' content (read
    here, from the same files that are synced)."""
    if job.setup is None:
        return None
    h = hashlib.sha256(job.setup.encode())
    for rel in job.setup_inputs:
        h.update(b"\0" + rel.encode() + b"\0")
        h.update((job.workdir / rel).read_bytes())
    return h.hexdigest()[:16]


def setup_script(node: NodePlan, job: Job, host_python: str, run_id: str) -> str:
    """The user's script under `sh -e`, in the job's directory with the job's env (env.sh),
    beside FLEET_PYTHON and FLEET_UV (fleet/nodeside/setup.sh). Its shell starts with the run id
    in its environment, so that a stop finds it (and what it runs) as it finds the job's
    processes."""
    return sh("exec", "env", f"{nodemap.ATTEMPT_ID_VAR}={run_id}", "sh", "-c",
              nodeside.text("setup.sh"), "fleet-setup", node.code_dir, MARKER,
              f"{node.run_dir}/{nodemap.ENV_FILE}", host_python,
              job.setup or "true")


def marker_script(node: NodePlan) -> str:
    return sh("cat", f"{node.code_dir}/{MARKER}") + " 2>/dev/null; true"


def needed(recorded: str, wanted: str) -> bool:
    return recorded.strip() != wanted


@dataclass(frozen=True)
class SetupResult:
    ran: bool
    seconds: float = 0.0


def recorded(session_t: dict[str, Transport], plan: Plan) -> dict[str, str]:
    """The hash of the last good setup on each filesystem's first node (one round trip each;
    an unreadable marker counts as none)."""
    leader = {name: group[0] for group in plan.storage for name in group}
    firsts = [n for n in plan.nodes if leader[n.host.name] == n.host.name]
    results = each(((n.host.name, n) for n in firsts), lambda node: session_t[
        node.host.name].run(marker_script(node), timeout=30, what="read the setup marker"))
    return {name: r.out.strip() for name, r in results.items() if not isinstance(r, Exception)}


class Action(Enum):
    """What a node does about the job's setup in this run."""

    NONE = "none"  # the job has no setup
    RUN = "run"  # it runs here
    SHARED = "shared"  # another node on this filesystem runs it for both
    SKIP = "skip"  # unchanged since it last succeeded on this filesystem
    UNASKED = "unasked"  # a dry run: the nodes' markers were not read


@dataclass(frozen=True)
class Decision:
    """A node's setup action, and the words fleet prints for it (`fleet plan`, `fleet up`)."""

    action: Action
    text: str

    def __str__(self) -> str:
        return self.text


def decide(plan: Plan, marks: dict[str, str] | None,
           force: bool = False) -> dict[str, Decision]:
    """Per node what setup will do: run it, or why not ("skipped (...)", "shared with node1");
    `marks` None where the nodes were not asked (a dry run)."""
    wanted = setup_hash(plan.job)
    leader = {name: group[0] for group in plan.storage for name in group}
    out = {}
    for n in plan.nodes:
        name = n.host.name
        first = leader[name]
        shared = Decision(Action.SHARED, f"shared with {first}")
        if wanted is None:
            out[name] = Decision(Action.NONE, "none")
        elif force:
            out[name] = Decision(Action.RUN, "run (--setup)") if first == name else shared
        elif marks is None:
            out[name] = Decision(Action.UNASKED, "runs unless it already succeeded here with "
                                                 f"this text and inputs (setup {wanted})")
        elif marks.get(first, "") == wanted:
            out[name] = Decision(Action.SKIP, "skipped (unchanged since it last succeeded here)"
                                 if first == name else "skipped (unchanged since it last "
                                 f"succeeded on {first}, shared)")
        else:
            out[name] = Decision(Action.RUN, "run") if first == name else shared
    return out


def run(session_t: dict[str, Transport], plan: Plan, console: Console,
        force: bool = False) -> dict[str, str]:
    """Run the job's setup where it is needed, on one node per shared filesystem (the others
    share its result), all in parallel, streaming each line as `node2 setup | ...`. Returns per
    node the setup hash now in place. A failure on any node raises SetupError naming it, with
    its output's tail (the caller's guard removes what was written; nothing has started)."""
    wanted = setup_hash(plan.job)
    if wanted is None:
        return {}
    nodes = {n.host.name: n for n in plan.nodes}
    index = {name: i for i, name in enumerate(nodes)}
    what = decide(plan, None if force else recorded(session_t, plan), force)
    todo = [name for name, d in what.items() if d.action is Action.RUN]
    for name, d in what.items():
        if name not in todo:
            console.phase(name, f"setup: {d.text}")

    def one(name: str) -> SetupResult:
        node, t = nodes[name], session_t[name]
        tail: list[str] = []

        def on_lines(lines: list[str]) -> None:
            tail.extend(lines)
            del tail[:-TAIL_LINES]
            console.lines(index[name], [(f"{name} setup", line) for line in lines], name)
            faults.point("setup")  # a fault test strikes while a setup runs

        t0 = time.monotonic()
        console.phase(name, "setup: running" + (" (--setup)" if force else ""))
        code = t.stream(setup_script(node, plan.job, node.host.python, plan.run_id), on_lines,
                        interrupted)
        if interrupted.is_set():  # fleet is being interrupted: the guard stops what runs
            return SetupResult(False)
        if code != 0:
            shown = "\n    ".join(tail) or "(no output)"
            raise SetupFailed(f"setup exited {code}; its output ends:\n    {shown}")
        t.run(sh("printf", "%s\n", wanted) + " > " + quote(f"{node.code_dir}/{MARKER}"),
              what="record the setup").check(name)
        return SetupResult(True, time.monotonic() - t0)

    interrupted = threading.Event()
    with console.hosts_waiting("setup", todo) as wait:
        results = each(named((n, n) for n in todo), wait.tracked(one), cancel=interrupted.set)
    bad = failures(results)
    if bad:
        raise SetupError("setup", bad)
    for name, r in results.items():
        if isinstance(r, SetupResult):
            console.phase(name, f"setup: done ({r.seconds:.1f}s)")
    return {name: wanted for name in nodes}
