"""What fleet asks Slurm about one job, through the login node: each fact a command plus a pure
parser of what it prints (sbatch --parsable, squeue, scontrol show job, sacct, srun's verdicts,
the nodes' directories under the run), so that banners or errors around them never mislead."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleet.nodedata import number
from fleet.nodeside import shell_program
from fleet.shell import quote, sh
from fleet.states import RunStatus

# Slurm's job states, by what they mean for a run (squeue/scontrol/sacct spell them alike).
_ACTIVE = {"PENDING": RunStatus.STARTING, "CONFIGURING": RunStatus.STARTING,
           "REQUEUED": RunStatus.STARTING, "REQUEUE_HOLD": RunStatus.STARTING,
           "RESIZING": RunStatus.RUNNING, "SUSPENDED": RunStatus.RUNNING,
           "RUNNING": RunStatus.RUNNING, "COMPLETING": RunStatus.RUNNING,
           "STOPPED": RunStatus.RUNNING, "SIGNALING": RunStatus.RUNNING}
_ENDED = {"COMPLETED": RunStatus.SUCCEEDED, "CANCELLED": RunStatus.STOPPED,
          "FAILED": RunStatus.FAILED, "NODE_FAIL": RunStatus.FAILED,
          "TIMEOUT": RunStatus.FAILED, "OUT_OF_MEMORY": RunStatus.FAILED,
          "BOOT_FAIL": RunStatus.FAILED, "DEADLINE": RunStatus.FAILED,
          "PREEMPTED": RunStatus.FAILED, "SPECIAL_EXIT": RunStatus.FAILED,
          "REVOKED": RunStatus.STOPPED}


def status_of(state: str) -> RunStatus:
    """A Slurm job state ("CANCELLED by 0", "RUNNING"...) as a run's state."""
    word = state.split()[0].rstrip("+") if state.strip() else ""
    return _ACTIVE.get(word) or _ENDED.get(word) or RunStatus.UNKNOWN


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job as Slurm tells it."""

    job_id: str
    state: str  # Slurm's word: RUNNING, FAILED, "CANCELLED by 0"...
    exit_code: int | None = None  # the batch script's, once it ended
    signal: int | None = None
    nodes: str = ""  # the node list (node[1-2])
    reason: str = ""  # why it is pending, or ended
    source: str = ""  # squeue, scontrol or sacct

    @property
    def status(self) -> RunStatus:
        return status_of(self.state)


def state_words(info: JobInfo) -> str:
    """Where a job stands, as fleet says it while the job is not over: Slurm's state, and for a
    job that waits, Slurm's reason (Resources, Priority, BeginTime, JobHeldUser...); for one
    that runs, its nodes. The same words for the same facts, so that a caller says them again
    only when they change."""
    words = info.state
    if info.status is RunStatus.STARTING:
        if info.reason and info.reason not in ("None", "(null)"):
            words += f" ({info.reason})"
    elif info.nodes:
        words += f" on {info.nodes}"
    return words


# ---- submit -------------------------------------------------------------------------------
def submit_script(run_dir: str, script: str, extra: tuple[str, ...] = ()) -> str:
    """sbatch from the run directory, its output file there too; prints the job id."""
    return "\n".join([f"cd {quote(run_dir)} || exit 1",
                      sh("sbatch", "--parsable", f"--output={run_dir}/batch.log",
                         *extra, script)])


def test_script(run_dir: str, script: str) -> str:
    """sbatch --test-only: would Slurm accept the request (partition, nodes, time, account)?"""
    return f"cd {quote(run_dir)} || exit 1\n" + sh("sbatch", "--test-only", script) + " 2>&1"


def parse_submit(out: str) -> str | None:
    """The job id from `sbatch --parsable` ("12" or "12;cluster"), its last line."""
    for line in reversed(out.strip().splitlines()):
        m = re.fullmatch(r"(\d+)(;\S+)?", line.strip())
        if m:
            return m.group(1)
    return None


# ---- the job's state ----------------------------------------------------------------------
def job_script(job_id: str) -> str:
    """squeue, scontrol and sacct on the job, each in its own section (nodeside/slurm_job.sh)."""
    return shell_program("slurm_job.sh", job_id)


def sections(out: str) -> dict[str, str]:
    found: dict[str, str] = {}
    name = None
    for line in out.splitlines():
        if line.startswith("=== "):
            name = line[4:].strip()
            found[name] = ""
        elif name is not None:
            found[name] += line + "\n"
    return found


def parse_squeue(out: str, job_id: str) -> JobInfo | None:
    """`squeue -h -o '%i|%T|%N|%r'` lines; None where the job is not in the queue."""
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] == job_id:
            return JobInfo(job_id, parts[1], nodes=parts[2], reason=parts[3], source="squeue")
    return None


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def scontrol_fields(line: str) -> dict[str, str]:
    """`scontrol show -o` as key -> value (values may hold spaces: up to the next key)."""
    keys = list(_FIELD.finditer(line))
    return {m.group(1): line[m.end():keys[i + 1].start() if i + 1 < len(keys) else None].strip()
            for i, m in enumerate(keys)}


def _exit(text: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"(\d+):(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def parse_scontrol(out: str, job_id: str) -> JobInfo | None:
    """`scontrol show job -o ID`; None where Slurm no longer knows it ("Invalid job id")."""
    for line in out.splitlines():
        f = scontrol_fields(line)
        if f.get("JobId") == job_id and "JobState" in f:
            code, sig = _exit(f.get("ExitCode", ""))
            nodes = f.get("NodeList", "")
            return JobInfo(job_id, f["JobState"], code, sig,
                           "" if nodes == "(null)" else nodes, f.get("Reason", ""), "scontrol")
    return None


def parse_sacct(out: str, job_id: str) -> JobInfo | None:
    """`sacct -n -P -X -o JobID,State,ExitCode,NodeList`; None without accounting."""
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] == job_id:
            code, sig = _exit(parts[2])
            return JobInfo(job_id, parts[1], code, sig, parts[3], source="sacct")
    return None


def parse_job(out: str, job_id: str) -> JobInfo | None:
    """The best the three say: scontrol (state and exit code) where it knows the job, else
    squeue, else sacct."""
    s = sections(out)
    return (parse_scontrol(s.get("scontrol", ""), job_id)
            or parse_squeue(s.get("squeue", ""), job_id)
            or parse_sacct(s.get("sacct", ""), job_id))


# ---- the nodes, as they wrote under the run directory ----------------------------------------
def nodes_script(run_dir: str) -> str:
    """Each node directory: its name, the rank line its task printed first, its exit code
    (nodeside/slurm_nodes.sh)."""
    return shell_program("slurm_nodes.sh", run_dir)


ANNOUNCE = re.compile(r"fleet: node (\S+) is node rank (\d+) of (\d+)")


@dataclass(frozen=True)
class NodeInfo:
    name: str
    node_rank: int | None
    code: int | None  # torchrun's exit code, once it ended
    signalled: bool = False  # Slurm signalled it (it ended because of another node, or scancel)


def parse_nodes(out: str) -> dict[str, NodeInfo]:
    found = {}
    for line in out.splitlines():
        if not line.startswith("node="):
            continue
        name, _, rest = line[5:].partition("|")
        code, _, rest = rest.partition("|")
        signalled, _, first = rest.partition("|")
        m = ANNOUNCE.search(first)
        found[name] = NodeInfo(name, int(m.group(2)) if m else None,
                               number(code, signed=True),
                               signalled.strip() == "signalled")
    return found


# ---- what srun said about each task (in the job's output) -----------------------------------
_SRUN = re.compile(r"srun: error: (\S+): tasks? ([\d,-]+): (.+?)\s*$")


@dataclass(frozen=True)
class TaskEnd:
    node: str
    how: str  # "Exited with exit code 1", "Terminated", "Killed"...

    @property
    def by_itself(self) -> bool:
        """It ended on its own (an exit code), not killed by Slurm's fail-fast or scancel."""
        return self.how.startswith("Exited with exit code")


def parse_srun(log: str) -> list[TaskEnd]:
    """srun's verdicts, in the order it printed them: the first that ended by itself is what
    made Slurm end the others (--kill-on-bad-exit)."""
    return [TaskEnd(m.group(1), m.group(3)) for line in log.splitlines()
            if (m := _SRUN.search(line))]


_PREFLIGHT = re.compile(r"fleet: preflight failed on (\S+): (.+?)\s*$")


def parse_preflight(log: str) -> dict[str, str]:
    """Each node whose check failed before the job started (the script's fleet_check), why."""
    return {m.group(1): m.group(2) for line in log.splitlines()
            if (m := _PREFLIGHT.search(line))}


# The script's preflight, where python and torch were found: "python=3.11.2 torch=2.3.0".
_VERSIONS = re.compile(r"fleet: preflight on (\S+): python=(\S*) torch=(\S*)\s*$")


def preflight_script(run_dir: str) -> str:
    """The preflight's lines in the job's output (each node's versions, or why it failed)."""
    return sh("grep", "-a", "^fleet: preflight ", f"{run_dir}/batch.log") + " 2>/dev/null; true"


def parse_versions(log: str) -> dict[str, dict[str, str]]:
    """Each node's python and torch versions as the script's preflight reported them on that
    node (only what it printed: a version it could not read is absent)."""
    found: dict[str, dict[str, str]] = {}
    for line in log.splitlines():
        m = _VERSIONS.search(line)
        if m:
            found[m.group(1)] = {k: v for k, v in (("python", m.group(2)),
                                                   ("torch", m.group(3))) if v}
    return found


def node_entries(nodes: dict[str, NodeInfo], preflight_log: str,
                 nproc: int | str) -> dict[str, dict[str, object]]:
    """Each node that ran any of the job, for its manifest: its node rank (its log's first
    line; None before it said it), processes, the versions its preflight reported, and why its
    preflight failed where it did."""
    versions, refused = parse_versions(preflight_log), parse_preflight(preflight_log)
    out: dict[str, dict[str, object]] = {}
    for name in sorted(set(nodes) | set(versions) | set(refused)):
        n = nodes.get(name)
        out[name] = {"node_rank": n.node_rank if n else None, "nproc": nproc,
                     "versions": versions.get(name, {})}
        if name in refused:
            out[name]["preflight"] = refused[name]
    return out


def cancel_script(job_id: str) -> str:
    return sh("scancel", job_id) + " 2>&1"


# ---- a command on every node of a running job (hang dumps) ----------------------------------
STEP_TIMEOUT_S = 60
NODE_MARK = "fleet-node"


def step_script(job_id: str, run_dir: str, node_script: str) -> str:
    """`node_script` in each node's directory of the run, on every node of the running job at
    once: a job step that shares the job's resources (`srun --overlap`), so it reaches nodes
    that fleet cannot SSH to. Each task's lines are labelled; its first line names its node."""
    inner = (f'echo "{NODE_MARK} $SLURMD_NODENAME"; '
             'cd "$1/$SLURMD_NODENAME" 2>/dev/null || { echo missing; exit 0; }; '
             'exec sh -c "$2"')
    # From outside the allocation srun would start one task: the job's node count, asked.
    return "\n".join([
        f"n=$(squeue -h -j {quote(job_id)} -o %D 2>/dev/null | head -n 1)",
        sh("timeout", str(STEP_TIMEOUT_S), "srun", f"--jobid={job_id}", "--overlap")
        + ' --nodes="${n:-1}" '
        + sh("--ntasks-per-node=1", "--label", "--kill-on-bad-exit=0", f"--chdir={run_dir}",
             "bash", "-c", inner, "fleet-step", run_dir, node_script) + " 2>&1"])


_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def parse_step(out: str) -> tuple[dict[str, str], list[str]]:
    """Each node's output from step_script (by the node its task named), and the lines that
    were no task's (srun's own errors)."""
    by_task: dict[int, list[str]] = {}
    other: list[str] = []
    for line in out.splitlines():
        m = _LABEL.match(line)
        if m:
            by_task.setdefault(int(m.group(1)), []).append(m.group(2))
        elif line.strip():
            other.append(line.strip())
    nodes: dict[str, str] = {}
    for task in sorted(by_task):
        lines = by_task[task]
        # What slurmstepd said before the task ran (a cwd it could not enter) is not the node's.
        at = next((i for i, line in enumerate(lines)
                   if len(w := line.split()) == 2 and w[0] == NODE_MARK), None)
        if at is None:
            other += lines
            continue
        other += lines[:at]
        nodes[lines[at].split()[1]] = "\n".join(lines[at + 1:]) + "\n"
    return nodes, other


# A host name or address as Slurm's NodeAddr may hold it (a name, IPv4, IPv6): nothing else
# from the node is used as the destination of a forward.
_NODE_ADDR = re.compile(r"(?:^|\s)NodeAddr=([A-Za-z0-9._:-]{1,253})(?=\s|$)")


def node_address_script(name: str) -> str:
    """What Slurm knows of a compute node, on one line (`scontrol show node -o`)."""
    return f"scontrol show node -o {quote(name)} 2>/dev/null; true"


def parse_node_address(out: str, name: str) -> str:
    """The address the login node reaches a compute node at: its NodeAddr (a NodeName need not
    resolve anywhere), else the name itself (no answer, or an address that is not one)."""
    m = _NODE_ADDR.search(out)
    return m.group(1) if m else name
