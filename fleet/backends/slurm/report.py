"""How a Slurm job ended, per node, with the first failing rank; and the manifest's allocation
(the nodes Slurm ran the job on), recorded once it is known."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from fleet import manifest
from fleet.backends.slurm import manifest as slurm_manifest
from fleet.backends.slurm.jobs import SlurmRecord, job_info, node_infos, record_dir
from fleet.console import Console
from fleet.errors import (
    DamagedRecord,
    FleetError,
)
from fleet.facts import failure
from fleet.facts import slurm as sj
from fleet.facts.diagnose import diagnose, format_diagnoses
from fleet.run import record as state
from fleet.shell import sh
from fleet.states import RunStatus
from fleet.transport import Transport, open_transport
from fleet.transport.group import reason


# ---- the manifest: the nodes, once Slurm ran the job ---------------------------------------
def allocation(t: Transport, rec: SlurmRecord, m: dict[str, Any],
               info: sj.JobInfo | None) -> dict[str, Any]:
    """The run's manifest with the nodes Slurm ran it on, each node's rank (its log's first
    line) and versions (the script's preflight), as far as they are known now."""
    log = t.run(sj.preflight_script(rec.run_dir), timeout=60,
                what="read the preflight's lines").out
    entries = sj.node_entries(node_infos(t, rec.run_dir), log, rec.nproc)
    # Slurm forgetting the job (None) means it ended long ago: nothing more will come.
    complete = info is None or info.status.is_terminal
    return slurm_manifest.with_allocation(m, info.nodes if info else "",
                                    info.state if info else rec.final, entries, complete)


def keep_allocation(t: Transport, rec: SlurmRecord, info: sj.JobInfo,
                    console: Console) -> None:
    """Record in the manifest (here and beside the script) what allocation() knows now; a
    failure is said, never the run's end."""
    path = record_dir(rec.run_id) / "manifest.json"
    try:
        m = allocation(t, rec, json.loads(path.read_text()), info)
        state.write_atomic(path, manifest.dumps(m))
        t.write(f"{rec.run_dir}/manifest.json", manifest.dumps(m).encode(), 0o600)
    except (FleetError, OSError, ValueError) as e:
        console.info(f"the manifest of run {rec.run_id} ({path}) lacks the job's nodes: "
                     f"{reason(e) if isinstance(e, FleetError) else e}")


def manifest_of(rec: state.RunRecord, on_slurm: SlurmRecord,
                console: Console) -> dict[str, Any] | None:
    """A Slurm run's manifest for `fleet show`/`fleet diff`; where it was recorded before the
    job ended (a detached run), the nodes are asked for through the login node first. None
    for a run never submitted."""
    path = rec.dir / "manifest.json"
    try:
        m: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise DamagedRecord(f"{path}: cannot be read ({e})") from e
    if m.get("slurm", {}).get("complete") or on_slurm.job_id is None:
        return m
    try:
        with open_transport(on_slurm.login) as t:
            m = allocation(t, on_slurm, m, job_info(t, on_slurm.job_id))
            state.write_atomic(path, manifest.dumps(m))
            t.write(f"{on_slurm.run_dir}/manifest.json", manifest.dumps(m).encode(), 0o600)
    except (FleetError, OSError) as e:
        console.info(f"run {rec.run_id}: the login node could not be asked for the job's "
                     f"nodes ({reason(e) if isinstance(e, FleetError) else e}); shown as "
                     "recorded")
    return m




def report(t: Transport, rec: SlurmRecord, info: sj.JobInfo,
           console: Console) -> tuple[RunStatus, list[str]]:
    """Per node how it ended; for a failure the first failing rank, its traceback and the
    hints for known failures; which nodes Slurm ended as a consequence. Returns the run's
    state and the first failure's lines (for `[notify]`)."""
    nodes = node_infos(t, rec.run_dir)
    log = t.run(sh("tail", "-n", "200", f"{rec.run_dir}/batch.log") + " 2>/dev/null",
                timeout=60).out
    cancelled = info.status is RunStatus.STOPPED
    # A node failed by itself where it ended non-zero without Slurm signalling it; srun's own
    # verdicts ("Exited with exit code") stand in for a node that recorded no exit code.
    said = {e.node for e in sj.parse_srun(log) if e.by_itself}
    failed = [n for n in nodes.values() if not n.signalled and not cancelled and
              (n.code not in (0, None) or (n.code is None and n.name in said))]
    for n in sorted(nodes.values(), key=lambda n: (n.node_rank is None, n.node_rank, n.name)):
        if n.code == 0:
            words = "succeeded (exit 0)"
        elif n in failed:
            words = f"failed (exit {n.code})"
        elif cancelled:
            words = f"stopped by scancel (exit {n.code})" if n.code is not None else \
                "stopped by scancel"
        else:
            words = "stopped by Slurm (fail-fast: srun --kill-on-bad-exit)" + (
                f" (exit {n.code})" if n.code is not None else "")
        console.phase(n.name, f"node rank {n.node_rank if n.node_rank is not None else '?'}: "
                              f"{words}")
    console.phase("slurm", f"job {info.job_id} {info.state}"
                  + (f", exit code {info.exit_code}" if info.exit_code is not None else ""))
    if info.status is not RunStatus.FAILED:
        return info.status, []
    causes = []
    for n in failed:
        with contextlib.suppress(FleetError):
            found = failure.explain(t, n.name, n.node_rank or 0, f"{rec.run_dir}/{n.name}")
            if found is not None:
                causes.append(found)
    root = failure.first(causes)
    refused = sj.parse_preflight(log)
    first: list[str] = []
    if refused and not nodes:
        console.info("preflight failed: nothing of the job started on any node")
        for name, why in sorted(refused.items()):
            console.phase(name, why)
    elif root is not None:
        first = failure.summary(root)
        for line in first:
            console.info(line)
    else:
        tail = "\n".join(log.strip().splitlines()[-10:])
        first = ["first failure: no node's error report found; Slurm's output ends:",
                 *tail.splitlines()]
        console.info("\n".join(first))
        for line in format_diagnoses(diagnose(log)):
            console.info(line)
    collateral = [n.name for n in nodes.values() if n not in failed and n.code != 0]
    if collateral:
        console.info("stopped as a consequence (srun --kill-on-bad-exit): "
                     + ", ".join(collateral))
    return info.status, first

