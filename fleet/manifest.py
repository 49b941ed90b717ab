"""A run's manifest: exactly what ran where. The inventory and job as loaded, each node's env
(secrets masked) and command, the code's git commit, dirty state and diff, the hashes of the
synced files and data, each node's software versions, and its setup hash. Kept with the run's
local record and in the master's run directory; `fleet show` prints one, `fleet diff` compares
two. Building, showing and comparing are pure; only git_info and file_hashes read the disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from fleet.plan import Plan, masked
from fleet.sync import Scan, local_manifest

DIFF_MAX = 256 << 10  # of a dirty tree's diff, kept in the manifest
HASH_MAX = 256 << 20  # data beyond this total size is listed by size and mtime, not hashed


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


def file_hashes(root: Path, exclude: tuple[str, ...]) -> dict[str, str]:
    """sha256 of every file fleet syncs from root; past HASH_MAX in total, size and mtime."""
    files = local_manifest(root, exclude)
    big = sum(size for size, _ in files.values()) > HASH_MAX
    out = {}
    for rel, (size, mtime) in sorted(files.items()):
        if big:
            out[rel] = f"size {size}, mtime {mtime}"
            continue
        h = hashlib.sha256()
        with open(root / rel, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        out[rel] = h.hexdigest()
    return out


def build(plan: Plan, setup_hashes: dict[str, str], code: dict[str, Any],
          code_files: dict[str, str], data_files: dict[str, str] | None) -> dict[str, Any]:
    job = plan.job
    secret = job.secret_env
    job_view = {k: (str(v) if isinstance(v, Path) else v)
                for k, v in dataclasses.asdict(job).items() if k not in ("env", "watchdog")}
    job_view["env"] = masked(job.env, secret)
    job_view["watchdog"] = dataclasses.asdict(job.watchdog)
    return {
        "run_id": plan.run_id,
        "job": _plain(job_view),
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


def _plain(value: Any) -> Any:
    """JSON's shapes: tuples as lists, paths as text."""
    return json.loads(json.dumps(value, default=str))


def dumps(manifest: dict[str, Any]) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


def show(m: dict[str, Any]) -> list[str]:
    """A manifest as a person reads it."""
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
    for name, n in m["nodes"].items():
        v = n.get("versions") or {}
        soft = ", ".join(f"{k} {val}" for k, val in v.items() if val)
        lines.append(f"[{name}] node rank {n['node_rank']}, {n['address']}, {n['nproc']} "
                     f"process(es); {soft or 'versions unknown'}")
        if n.get("setup"):
            lines.append(f"  setup: {n['setup']}")
        lines += [f"  env {k}={val}" for k, val in n["env"].items()]
        lines.append(f"  command: {' '.join(n['argv'])}")
    return lines


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What changed from run a to run b: code, files, hosts, env, command, versions, setup."""
    out: list[str] = []
    ca, cb = a.get("code") or {}, b.get("code") or {}
    if ca.get("commit") != cb.get("commit"):
        out.append(f"code: commit {ca.get('commit')} -> {cb.get('commit')}")
    if ca.get("dirty") != cb.get("dirty") or ca.get("diff") != cb.get("diff"):
        out.append(f"code: {_state(ca)} -> {_state(cb)}")
    out += _changes("file", a.get("files") or {}, b.get("files") or {})
    out += _changes("data file", a.get("data") or {}, b.get("data") or {})
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
        for k in sorted(set(x.get("versions") or {}) | set(y.get("versions") or {})):
            vx, vy = (x.get("versions") or {}).get(k), (y.get("versions") or {}).get(k)
            if vx != vy:
                out.append(f"{name}: {k} {vx or '(none)'} -> {vy or '(none)'}")
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
    fleet.launch.Sources: the files' hashes as the nodes received them; without it, this
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
