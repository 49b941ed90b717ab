"""A run's manifest: exactly what ran where. The inventory and job as loaded, each node's env
(secrets masked) and command, the code's git commit, dirty state and diff, the hashes of the
synced files and data, each node's software versions, and its setup hash; on Slurm the cluster
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
import re
import subprocess
from pathlib import Path
from typing import Any

from fleet.backends.slurm.cluster import Cluster
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


def file_hashes(root: Path, exclude: tuple[str, ...],
                cache: Path | None = None) -> dict[str, str]:
    """sha256 of every file fleet syncs from root as it is now (transport.sync.scan's rules), each
    hashed once per content where `cache` keeps them (see received)."""
    memo = _load_cache(cache)
    out = {rel: _hash(path, memo) for rel, path in sorted(scan(root, exclude).files.items())}
    _save_cache(cache, memo)
    return out


def _job_view(job: Job) -> dict[str, Any]:
    """The job as loaded, its secret env values masked."""
    view = {k: (str(v) if isinstance(v, Path) else v)
            for k, v in dataclasses.asdict(job).items() if k not in ("env", "watchdog")}
    view["env"] = masked(job.env, job.secret_env)
    view["watchdog"] = dataclasses.asdict(job.watchdog)
    return _plain(view)  # type: ignore[no-any-return]


def build(plan: Plan, setup_hashes: dict[str, str], code: dict[str, Any],
          code_files: dict[str, str], data_files: dict[str, str] | None) -> dict[str, Any]:
    job = plan.job
    secret = job.secret_env
    return {
        "run_id": plan.run_id,
        "job": _job_view(job),
        "inventory": {"path": str(plan.inventory.path), "hosts": [
            _plain({**dataclasses.asdict(h), "env": masked(h.env, secret)})
            for h in plan.inventory.hosts]},
        "code": code,
        "files": code_files,
        "data": data_files,
        "nodes": {n.host.name: {
            "node_rank": n.node_rank, "address": n.host.address, "nproc": n.nproc,
            "env": masked(n.env, secret), "argv": list(n.argv), "code_dir": n.code_dir,
            "versions": plan.versions.get(n.host.name, {}),
            "setup": setup_hashes.get(n.host.name)} for n in plan.nodes},
    }


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
        "job": _job_view(job),
        "inventory": {"path": str(cluster.path), "slurm": _plain(view)},
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


def is_slurm(m: dict[str, Any]) -> bool:
    return "slurm" in m


def _plain(value: Any) -> Any:
    """JSON's shapes: tuples as lists, paths as text."""
    return json.loads(json.dumps(value, default=str))


def dumps(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def show(m: dict[str, Any]) -> list[str]:
    """A manifest as a person reads it."""
    lines = _show_code(m)
    return lines + (_show_slurm(m) if is_slurm(m) else _show_hosts(m))


def _show_code(m: dict[str, Any]) -> list[str]:
    code = m.get("code") or {}
    lines = [f"run {m['run_id']}: job {m['job']['name']} ({m['job']['path']})"]
    if code.get("commit"):
        dirty = ", dirty" if code.get("dirty") else ", clean"
        lines.append(f"code: commit {code['commit']}{dirty}; {len(m.get('files') or {})} "
                     "file(s) synced")
        if code.get("untracked"):
            lines.append(f"  untracked: {', '.join(code['untracked'])}")
        if code.get("diff"):
            lines += ["  diff:"] + [f"    {line}" for line in code["diff"].splitlines()]
    else:
        lines.append(f"code: no commit ({code.get('why', 'unknown')}); "
                     f"{len(m.get('files') or {})} file(s) synced")
    if m.get("data") is not None:
        lines.append(f"data: {len(m['data'])} file(s)")
    return lines


def _soft(versions: dict[str, str] | None) -> str:
    return ", ".join(f"{k} {val}" for k, val in (versions or {}).items() if val)


def _show_hosts(m: dict[str, Any]) -> list[str]:
    lines = []
    for name, n in m["nodes"].items():
        soft = _soft(n.get("versions"))
        lines.append(f"[{name}] node rank {n['node_rank']}, {n['address']}, {n['nproc']} "
                     f"process(es); {soft or 'versions unknown'}")
        if n.get("setup"):
            lines.append(f"  setup: {n['setup']}")
        lines += [f"  env {k}={val}" for k, val in n["env"].items()]
        lines.append(f"  command: {' '.join(n['argv'])}")
    return lines


def _show_slurm(m: dict[str, Any]) -> list[str]:
    s, c = m["slurm"], m["inventory"]["slurm"]
    login = (c.get("login") or {}).get("address", "?")
    ask = ", ".join(f"{k} {_value(c[k])}" for k in _CLUSTER_KEYS
                    if c.get(k) not in (None, [], {}))
    lines = [f"slurm: job {s['job_id']} through {login} ({m['inventory']['path']}: {ask})"
             + (f": {s['state']}" if s.get("state") else "")
             + (f" on {s['nodelist']}" if s.get("nodelist") else "")]
    lines.append(f"  script: {s['script']}")
    lines += [f"  env {k}={val}" for k, val in s["env"].items()]
    lines.append(f"  command: {' '.join(s['command'])}")
    if not m["nodes"]:
        lines.append("nodes: none reported (the job ended before its preflight ran on any "
                     "node)" if s.get("complete") else "nodes: none had reported yet when "
                     "fleet last asked Slurm")
    for name, n in sorted(m["nodes"].items(), key=lambda kv: (kv[1].get("node_rank") is None,
                                                              kv[1].get("node_rank"), kv[0])):
        rank = n.get("node_rank")
        lines.append(f"[{name}] node rank {'?' if rank is None else rank}, {n['nproc']} "
                     f"process(es); {_soft(n.get('versions')) or 'versions unknown'}")
        if n.get("preflight"):
            lines.append(f"  preflight failed: {n['preflight']}")
    return lines


# A Slurm run's request, as `fleet show` prints and `fleet diff` compares it.
_CLUSTER_KEYS = ("nodes", "partition", "account", "time", "gpus_per_node", "cpus_per_task",
                 "nproc_per_node", "python", "workdir", "interface", "sbatch_args")


def _value(v: Any) -> str:
    return " ".join(map(str, v)) or "(none)" if isinstance(v, list) else str(v)


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What changed from run a to run b: code, files, hosts, env, command, versions, setup (on
    Slurm: the request, the nodes, env, command, versions)."""
    out: list[str] = []
    ca, cb = a.get("code") or {}, b.get("code") or {}
    if ca.get("commit") != cb.get("commit"):
        out.append(f"code: commit {ca.get('commit')} -> {cb.get('commit')}")
    if ca.get("dirty") != cb.get("dirty") or ca.get("diff") != cb.get("diff"):
        out.append(f"code: {_state(ca)} -> {_state(cb)}")
    out += _changes("file", a.get("files") or {}, b.get("files") or {})
    out += _changes("data file", a.get("data") or {}, b.get("data") or {})
    if is_slurm(a) != is_slurm(b):
        return out + _backends(a, b)
    return out + (_slurm_diff(a, b) if is_slurm(a) else _hosts_diff(a, b))


def _where(m: dict[str, Any]) -> str:
    if is_slurm(m):
        s = m["slurm"]
        return (f"Slurm ({m['inventory']['path']}: job {s['job_id']}"
                + (f" on {s['nodelist']}" if s.get("nodelist") else "") + ")")
    return f"hosts ({m['inventory']['path']}: {', '.join(m['nodes'])})"


def _backends(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Runs on a host list and on Slurm: where each ran, and the job's own env; the nodes'
    env and commands differ in form (fleet's per-host values, Slurm's variables)."""
    out = [f"ran on: {_where(a)} -> {_where(b)}"]
    ea, eb = a["job"].get("env") or {}, b["job"].get("env") or {}
    out += [f"job env {k} {ea.get(k, '(unset)')} -> {eb.get(k, '(unset)')}"
            for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)]
    out.append("nodes, env and commands are not compared between a host list and Slurm: "
               "`fleet show` each run")
    return out


def _slurm_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out: list[str] = []
    ra, rb = a["inventory"]["slurm"], b["inventory"]["slurm"]
    la, lb = (ra.get("login") or {}).get("address"), (rb.get("login") or {}).get("address")
    if la != lb:
        out.append(f"slurm: login {la} -> {lb}")
    for key in _CLUSTER_KEYS:
        if ra.get(key) != rb.get(key):
            out.append(f"slurm: {key} {_value(ra.get(key))} -> {_value(rb.get(key))}")
    sa, sb = a["slurm"], b["slurm"]
    if sa.get("nodelist") != sb.get("nodelist"):
        out.append(f"slurm: nodes {sa.get('nodelist') or '(none yet)'} -> "
                   f"{sb.get('nodelist') or '(none yet)'}")
    ea = {k: _unrun(v, a["run_id"]) for k, v in sa["env"].items()}
    eb = {k: _unrun(v, b["run_id"]) for k, v in sb["env"].items()}
    out += [f"env {k} {ea.get(k, '(unset)')} -> {eb.get(k, '(unset)')}"
            for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)]
    xa = [_unrun(w, a["run_id"]) for w in sa["command"]]
    xb = [_unrun(w, b["run_id"]) for w in sb["command"]]
    if xa != xb:
        out.append(f"command: {' '.join(xa)} -> {' '.join(xb)}")
    na, nb = a["nodes"], b["nodes"]
    out += [f"node {name}: only in {a['run_id']}" for name in na if name not in nb]
    out += [f"node {name}: only in {b['run_id']}" for name in nb if name not in na]
    for name in [n for n in na if n in nb]:
        x, y = na[name], nb[name]
        for key in ("node_rank", "nproc"):
            if x.get(key) != y.get(key):
                out.append(f"{name}: {key} {x.get(key)} -> {y.get(key)}")
        out += _version_changes(name, x.get("versions") or {}, y.get("versions") or {})
    return out


def _version_changes(name: str, x: dict[str, str], y: dict[str, str]) -> list[str]:
    return [f"{name}: {k} {x.get(k) or '(none)'} -> {y.get(k) or '(none)'}"
            for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]


def _hosts_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out: list[str] = []
    na, nb = a["nodes"], b["nodes"]
    for name in [n for n in na if n not in nb]:
        out.append(f"host {name}: only in {a['run_id']}")
    for name in [n for n in nb if n not in na]:
        out.append(f"host {name}: only in {b['run_id']} ({nb[name]['address']})")
    for name in [n for n in na if n in nb]:
        x, y = na[name], nb[name]
        for key in ("address", "node_rank", "nproc", "setup"):
            if x.get(key) != y.get(key):
                out.append(f"{name}: {key} {x.get(key)} -> {y.get(key)}")
        ex = {k: _unrun(v, a["run_id"]) for k, v in x["env"].items()}
        ey = {k: _unrun(v, b["run_id"]) for k, v in y["env"].items()}
        for k in sorted(set(ex) | set(ey)):
            if ex.get(k) != ey.get(k):
                out.append(f"{name}: env {k} {ex.get(k, '(unset)')} -> {ey.get(k, '(unset)')}")
        out += _version_changes(name, x.get("versions") or {}, y.get("versions") or {})
        ax = [_unrun(w, a["run_id"]) for w in x["argv"]]
        ay = [_unrun(w, b["run_id"]) for w in y["argv"]]
        if ax != ay:
            out.append(f"{name}: command {' '.join(ax)} -> {' '.join(ay)}")
    return out


def _unrun(text: str, run_id: str) -> str:
    """text with its run's id as RUN, where the id stands alone (a path part, a value), so
    runs compare by what differs; `j-1` inside the code dir `j-1c1eb3c5` is not the id."""
    return re.sub(rf"(?<![\w.-]){re.escape(run_id)}(?![\w.-])", "RUN", text)


def _state(code: dict[str, Any]) -> str:
    if not code.get("commit"):
        return "not in git"
    return "dirty" + (f" ({len(code.get('diff', '').splitlines())} diff lines)"
                      if code.get("diff") else "") if code.get("dirty") else "clean"


def _changes(what: str, a: dict[str, str], b: dict[str, str]) -> list[str]:
    out = [f"{what} {p}: added" for p in sorted(set(b) - set(a))]
    out += [f"{what} {p}: removed" for p in sorted(set(a) - set(b))]
    out += [f"{what} {p}: changed" for p in sorted(set(a) & set(b)) if a[p] != b[p]]
    return out


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
        code_files = file_hashes(job.workdir, job.exclude)
        data_files = file_hashes(job.data, ()) if job.data else None
    m = build(plan, setup_hashes, git_info(job.workdir), code_files, data_files)
    (record_dir / "manifest.json").write_text(dumps(m))
    return m


def record_slurm(job: Job, cluster: Cluster, run_id: str, job_id: str, script: str,
                 env: dict[str, str], command: list[str], record_dir: Path) -> dict[str, Any]:
    """Build a Slurm run's manifest at submission from this machine's files, and keep it in
    the run's local record (the caller writes it beside the script too)."""
    m = build_slurm(job, cluster, run_id, job_id, script, env, command, git_info(job.workdir),
                    file_hashes(job.workdir, job.exclude),
                    file_hashes(job.data, ()) if job.data else None)
    (record_dir / "manifest.json").write_text(dumps(m))
    return m
