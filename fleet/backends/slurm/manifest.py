"""A Slurm run's manifest (fleet.manifest): the cluster as loaded, the batch script's env and
command and the job id at submission; the nodes Slurm ran it on once it is known."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fleet.backends.slurm.cluster import Cluster
from fleet.config.job import Job
from fleet.manifest import dumps, file_hashes, git_info, job_view, plain
from fleet.plan import masked


def build_slurm(job: Job, cluster: Cluster, run_id: str, job_id: str, script: str,
                env: dict[str, str], command: list[str], code: dict[str, Any],
                code_files: dict[str, str], data_files: dict[str, str] | None,
                ) -> dict[str, Any]:
    """A run on Slurm, as known at submission: the job and cluster as loaded, the code, the
    batch script's env (secrets masked) and torchrun command (as the script spells it, the
    node's values as variables), the job id. Its nodes come once Slurm ran it
    (with_allocation)."""
    secret = job.secret_env
    login = None if cluster.login is None else {
        **dataclasses.asdict(cluster.login), "env": masked(cluster.login.env, secret)}
    view = {**dataclasses.asdict(cluster), "path": str(cluster.path), "login": login,
            "env": masked(cluster.env, secret)}
    return {
        "run_id": run_id,
        "job": job_view(job),
        "inventory": {"path": str(cluster.path), "slurm": plain(view)},
        "code": code,
        "files": code_files,
        "data": data_files,
        "slurm": {"job_id": job_id, "script": script, "env": masked(env, secret),
                  "command": command, "nodelist": "", "state": "", "complete": False},
        "nodes": {},
    }


def with_allocation(m: dict[str, Any], nodelist: str, state: str,
                    nodes: dict[str, dict[str, Any]], complete: bool) -> dict[str, Any]:
    """A Slurm run's manifest with what Slurm and the nodes said since: the node list, the
    job's state, each node's rank and versions (only those known); `complete` once the job
    ended (nothing more will come)."""
    known = m["slurm"]
    return {**m, "slurm": {**known, "nodelist": nodelist or known.get("nodelist", ""),
                           "state": state or known.get("state", ""), "complete": complete},
            "nodes": {**m.get("nodes", {}), **nodes}}



def record_slurm(job: Job, cluster: Cluster, run_id: str, job_id: str, script: str,
                 env: dict[str, str], command: list[str], record_dir: Path) -> dict[str, Any]:
    """Build a Slurm run's manifest at submission from this machine's files, and keep it in
    the run's local record (the caller writes it beside the script too)."""
    m = build_slurm(job, cluster, run_id, job_id, script, env, command, git_info(job.workdir),
                    file_hashes(job.workdir, job.exclude, ignore_files=True,
                                 never=job.unsent),
                    file_hashes(job.data, (), never=job.unsent) if job.data else None)
    (record_dir / "manifest.json").write_text(dumps(m))
    return m
