"""A run's manifest: exactly what ran where. The inventory and job as loaded, each node's env
(secrets masked) and command, the code's git commit, dirty state and diff, the hashes of the
synced files and data, each node's software versions and installed packages (the job
interpreter's `pip freeze`, with its hash), and its setup hash; on Slurm the cluster
as loaded, the batch script's env and command, the job id, and the nodes Slurm ran it on. Kept
with the run's local record and in the master's run directory (on Slurm: the run directory on
the shared filesystem); `fleet show` prints one, `fleet diff` compares two. Building, showing
and comparing are pure; only git_info, file_hashes and received (files not sent again, through
the local hash cache) read the disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from fleet.config.job import Job
from fleet.plan import Plan, masked
from fleet.transport.sync import Scan, scan

DIFF_MAX = 256 << 10  # of a dirty tree's diff, kept in the manifest


def git_info(workdir: Path) -> dict[str, Any]:
    """The commit of the repository holding the job's workdir, whether the tree is dirty, and
    the diff against that commit (uncommitted and untracked files named)."""
    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(workdir), *args], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)

    try:
        head = git("rev-parse", "HEAD")
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "why": "git is not installed here"}
    if head.returncode != 0:
        return {"commit": None, "why": "the workdir is not in a git repository (or it has no "
                                       "commit yet)"}
    status = git("status", "--porcelain", "--", ".").stdout
    diff = git("diff", "HEAD", "--", ".").stdout
    untracked = [line[3:] for line in status.splitlines() if line.startswith("??")]
    return {"commit": head.stdout.strip(), "dirty": bool(status.strip()),
            "diff": diff[:DIFF_MAX], "diff_truncated": len(diff) > DIFF_MAX,
            "untracked": untracked}


def file_hashes(root: Path, exclude: tuple[str, ...], cache: Path | None = None,
                ignore_files: bool = False, never: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file fleet syncs from root as it is now (transport.sync.scan's rules), each
    hashed once per content where `cache` keeps them (see received)."""
    memo = _load_cache(cache)
    files = scan(root, exclude, ignore_files, never).files
    out = {rel: _hash(path, memo) for rel, path in sorted(files.items())}
    _save_cache(cache, memo)
    return out


def job_view(job: Job) -> dict[str, Any]:
    """The job as loaded, its secret env values masked."""
    view = {k: (str(v) if isinstance(v, Path) else v)
            for k, v in dataclasses.asdict(job).items() if k not in ("env", "watchdog", "notify")}
    view["env"] = masked(job.env, job.secret_env)
    view["watchdog"] = dataclasses.asdict(job.watchdog)
    view["notify"] = job.notify.view()  # a webhook URL may hold a token
    return plain(view)  # type: ignore[no-any-return]


def build(plan: Plan, setup_hashes: dict[str, str], code: dict[str, Any],
          code_files: dict[str, str], data_files: dict[str, str] | None) -> dict[str, Any]:
    job = plan.job
    secret = job.secret_env
    return {
        "run_id": plan.run_id,
        "job": job_view(job),
        "inventory": {"path": str(plan.inventory.path), "hosts": [
            plain({**dataclasses.asdict(h), "env": masked(h.env, secret)})
            for h in plan.inventory.hosts]},
        "code": code,
        "files": code_files,
        "data": data_files,
        "nodes": {n.host.name: {
            "node_rank": n.node_rank, "address": n.host.address, "nproc": n.nproc,
            "env": masked(n.env, secret), "argv": list(n.argv), "code_dir": n.code_dir,
            "versions": plan.versions.get(n.host.name, {}),
            "packages": packages_entry(plan.packages.get(n.host.name)),
            "setup": setup_hashes.get(n.host.name)} for n in plan.nodes},
    }


def packages_entry(packages: tuple[str, ...] | None) -> dict[str, Any] | None:
    """A node's installed packages as the manifest keeps them: the list (name==version) and a
    sha256 of it, so two runs' environments compare at a glance; None where not asked."""
    if packages is None:
        return None
    text = "".join(f"{p}\n" for p in packages)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "count": len(packages),
            "list": list(packages)}


def is_slurm(m: dict[str, Any]) -> bool:
    return "slurm" in m


def plain(value: Any) -> Any:
    """JSON's shapes: tuples as lists, paths as text."""
    return json.loads(json.dumps(value, default=str))


def dumps(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def received(scan: Scan, dests: dict[str, str], sent: dict[str, dict[str, str]],
             cache: Path | None = None) -> dict[str, str]:
    """sha256 per file of what the nodes hold after a sync: for a file sent in this launch, of
    the very bytes sent (`sent`: node -> destination -> hash; `dests`: node -> the directory
    it synced into); for one not sent (the node had it: same size and mtime), of the local file,
    from `cache` where it was hashed before unchanged. Nodes that were sent different bytes
    (the file changed between two nodes' reads) are named."""
    memo = _load_cache(cache)
    out = {}
    for rel, path in sorted(scan.files.items()):
        seen = {n: h for n, d in dests.items() if (h := sent.get(n, {}).get(f"{d}/{rel}"))}
        if len(set(seen.values())) > 1:
            out[rel] = "differs: " + ", ".join(f"{n} {h}" for n, h in sorted(seen.items()))
        elif seen:
            out[rel] = next(iter(seen.values()))
        else:
            out[rel] = _hash(path, memo)
    _save_cache(cache, memo)
    return out


CACHE_MAX = 200_000  # entries kept in the local hash cache


def _key(path: Path) -> str:
    st = path.stat()  # ctime changes with any write: an equal key means the same bytes
    return f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"


def _hash(path: Path, memo: dict[str, str]) -> str:
    key = _key(path)
    if key not in memo:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        memo[key] = h.hexdigest()
    return memo[key]


def _load_cache(path: Path | None) -> dict[str, str]:
    try:
        data = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(data, dict) else {}


def _save_cache(path: Path | None, memo: dict[str, str]) -> None:
    if path is None:
        return
    keep = dict(list(memo.items())[-CACHE_MAX:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(keep))
        os.replace(tmp, path)
    except OSError:
        return  # a cache: the next launch hashes again


def record(plan: Plan, setup_hashes: dict[str, str], record_dir: Path,
           sources: Any = None) -> dict[str, Any]:
    """Build the run's manifest from the plan and what was sent (`sources`, a
    hosts.prepare.Sources: the files' hashes as the nodes received them; without it, this
    machine's files as they are now), and keep it in the run's local record (the caller
    writes it to the master too)."""
    job = plan.job
    if sources is not None:
        cache = record_dir.parent.parent / "hashes.json"
        code_dests = {n.host.name: n.code_dir for n in plan.nodes}
        data_dests = {n.host.name: n.data_dir for n in plan.nodes if n.data_dir}
        code_files = received(sources.code, code_dests, sources.sent, cache)
        data_files = (received(sources.data, data_dests, sources.sent, cache)
                      if sources.data is not None else None)
    else:
        code_files = file_hashes(job.workdir, job.exclude, ignore_files=True,
                                 never=job.unsent)
        data_files = file_hashes(job.data, (), never=job.unsent) if job.data else None
    m = build(plan, setup_hashes, git_info(job.workdir), code_files, data_files)
    (record_dir / "manifest.json").write_text(dumps(m))
    return m


PULLED = "pulled.json"  # in a run's local record: what `fleet pull` last brought from each node


def record_pulled(record_dir: Path, pulled: dict[str, tuple[Path, dict[str, int]]]) -> None:
    """Per node, where its outputs went and each file's size, as of this pull (`fleet show`
    lists them); nodes not pulled from now keep what an earlier pull recorded."""
    if not pulled:
        return
    seen = pulled_of(record_dir)
    for host, (dest, files) in pulled.items():
        seen[host] = {"at": time.time(), "to": str(dest), "files": dict(sorted(files.items()))}
    path = record_dir / PULLED
    tmp = path.with_name(f".{PULLED}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(seen, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def pulled_of(record_dir: Path) -> dict[str, Any]:
    """What record_pulled kept ({} where nothing was pulled, or the file is unreadable)."""
    try:
        data = json.loads((record_dir / PULLED).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
