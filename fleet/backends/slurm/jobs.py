"""A run on Slurm as fleet records it, and what Slurm says of it through the login node: the
job's state, the nodes' logs, scancel, the clients and sbatch --test-only (each a command
from fleet.facts.slurm plus its parser)."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.config.inventory import BackendKind, Host
from fleet.config.procs import Nproc, parse_nproc
from fleet.console import Console
from fleet.errors import (
    DamagedRecord,
    RemoteCommandError,
    UsageError,
)
from fleet.facts import slurm as sj
from fleet.facts import stacks
from fleet.run import record as state
from fleet.transport import Transport

RECORD = "slurm.json"  # beside run.json in the run's local record
CANCEL_WAIT_S = 60.0


@dataclass(frozen=True)
class SlurmRecord:
    """What later commands need to find a run on Slurm again."""

    run_id: str
    job: str
    login: Host
    run_dir: str  # on the shared filesystem, as the login node sees it
    job_id: str | None = None
    nproc: Nproc = 1
    static: bool = True  # ranks known from the node rank (a static rendezvous)
    final: str = ""  # Slurm's last word, once fleet saw the job end
    submitting: bool = False  # sbatch was asked and gave no job id: a job may exist


def record_dir(run_id: str) -> Path:
    return state.state_dir() / run_id


def save(rec: SlurmRecord, started: float) -> None:
    d = record_dir(rec.run_id)
    try:
        d.mkdir(parents=True, exist_ok=True)
        # The run's record (no host nodes: Slurm chooses them); the rest is in slurm.json.
        state.write_atomic(d / "run.json", json.dumps(dataclasses.asdict(state.RunRecord(
            rec.run_id, rec.job, started, (), controller=state.controller_id(),
            backend=BackendKind.SLURM))) + "\n")
        if rec.job_id is not None:
            state.mark_launched(d)  # from now on Slurm says what runs
        state.write_atomic(d / RECORD, json.dumps(dataclasses.asdict(rec), indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"cannot record the run in {d}: {e}; set FLEET_STATE_DIR (or "
                         "XDG_STATE_HOME) to a writable directory") from e


def load(rec: state.RunRecord) -> SlurmRecord:
    """The Slurm side of a recorded run."""
    path = rec.dir / RECORD
    try:
        data = json.loads(path.read_text())
        return SlurmRecord(**{**data, "login": Host(**data["login"]),
                              "nproc": parse_nproc(data.get("nproc", 1), "nproc")})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedRecord(f"{path}: the record of run {rec.run_id} is damaged ({e})") from e


# ---- facts through the login node ---------------------------------------------------------
def job_info(t: Transport, job_id: str) -> sj.JobInfo | None:
    return sj.parse_job(t.run(sj.job_script(job_id), timeout=60, what="ask Slurm").out, job_id)


def node_address(t: Transport, name: str) -> str:
    """The address the login node reaches a compute node at (Slurm's NodeAddr, else its name)."""
    r = t.run(sj.node_address_script(name), timeout=30, what=f"find node {name}'s address")
    return sj.parse_node_address(r.out, name)


def node_infos(t: Transport, run_dir: str) -> dict[str, sj.NodeInfo]:
    return sj.parse_nodes(t.run(sj.nodes_script(run_dir), timeout=60,
                                what="list the nodes' logs").out)


def cancel(t: Transport, job_id: str, console: Console) -> sj.JobInfo | None:
    """scancel, then wait until Slurm says the job ended (its processes are gone then)."""
    r = t.run(sj.cancel_script(job_id), timeout=60, what="scancel")
    if not r.ok:
        raise RemoteCommandError(t.host.name, f"scancel {job_id}", r.code, r.out + r.err)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while True:
        info = job_info(t, job_id)
        if info is None or info.status.is_terminal:
            return info
        if time.monotonic() > deadline:
            console.info(f"Slurm job {job_id} is still {info.state} {CANCEL_WAIT_S:.0f}s "
                         "after scancel")
            return info
        time.sleep(0.5)



def missing_clients(t: Transport) -> str | None:
    """Why the login node cannot run Slurm's clients, or None."""
    r = t.run("for c in sbatch squeue scontrol scancel srun; do command -v $c >/dev/null || "
              "echo \"missing $c\"; done; true", timeout=30, what="find the Slurm clients")
    missing = [line.split()[1] for line in r.out.splitlines() if line.startswith("missing ")]
    return f"login node {t.host.address}: no {', '.join(missing)} on PATH: is it a Slurm " \
        "login node?" if missing else None


def test_only(t: Transport, run_dir: str) -> tuple[bool, str]:
    """Would Slurm run the script in run_dir (sbatch --test-only: partition, nodes, time,
    account)? And what it said (its last line)."""
    r = t.run(sj.test_script(run_dir, "job.sbatch"), timeout=60, what="sbatch --test-only")
    return r.ok, (r.out.strip().splitlines() or ["sbatch --test-only said nothing"])[-1]


def preflight(t: Transport, run_dir: str, console: Console) -> None:
    """What can be checked before submitting: the Slurm clients on the login node, and
    whether Slurm would accept the request. (On the nodes the script checks python and torch
    itself, before anything starts.)"""
    why = missing_clients(t)
    if why:
        raise UsageError(why)
    ok, said = test_only(t, run_dir)
    if not ok:
        raise UsageError(f"Slurm would not run the job: {said}")
    console.phase("slurm", "preflight: sbatch --test-only accepts the request")


def take_stacks(t: Transport, rec: SlurmRecord,
                hung: bool = False) -> tuple[list[str], list[str]]:
    """Every rank's stack on every node of the running job, through a job step on each node
    (facts.slurm.step_script: no SSH to the nodes needed), reported as on hosts (facts.stacks).
    (the report's lines, problems) The NCCL flight recorder is refused on Slurm (check_job)."""
    assert rec.job_id is not None
    r = t.run(sj.step_script(rec.job_id, rec.run_dir, stacks.dump_script(".", rec.run_id)),
              timeout=sj.STEP_TIMEOUT_S + 30, what="take the stacks (srun --overlap)")
    outs, other = sj.parse_step(r.out)
    if not outs:
        return [], [f"no node of Slurm job {rec.job_id} could be asked (srun exit {r.code}): "
                    + (" / ".join(other[-3:]) or "it printed nothing")]
    return stacks.report([stacks.parse_dump(name, out) for name, out in sorted(outs.items())],
                         hung), []
