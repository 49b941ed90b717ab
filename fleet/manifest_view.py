"""A manifest as a person reads it (`fleet show`) and what changed between two (`fleet diff`):
pure functions of the manifests, whichever backend ran them."""

from __future__ import annotations

import difflib
import re
import time
from typing import Any

from fleet.console import printable
from fleet.manifest import is_slurm
from fleet.transport.transfer.report import human


def show(m: dict[str, Any]) -> list[str]:
    """A manifest as a person reads it."""
    lines = _show_code(m)
    lines += _show_slurm(m) if is_slurm(m) else _show_hosts(m)
    return lines + _show_outputs(m)


def _show_outputs(m: dict[str, Any]) -> list[str]:
    """The job's declared outputs, and per node what `fleet pull` last brought back, with
    sizes as of that pull (the nodes are not asked again). A name came from a node: each is
    shown with its control characters visible (a newline as ^J), so no name makes a line of
    its own."""
    declared = m["job"].get("outputs") or []
    pulled = m.get("pulled") or {}
    if not declared and not pulled:
        return []
    lines = [f"outputs: {', '.join(declared) or '(none declared)'}"
             + ("" if pulled else f"; not pulled yet (`fleet pull {m['run_id']}`)")]
    for host, p in sorted(pulled.items()):
        files = p.get("files") or {}
        at = time.strftime("%Y-%m-%d %H:%M", time.localtime(p.get("at", 0)))
        lines.append(f"  [{printable(host)}] pulled {at} into {printable(str(p.get('to')))}: "
                     f"{len(files)} file(s), {human(sum(files.values()))}")
        lines += [f"    {printable(rel)}  {human(size)}" for rel, size in files.items()]
    return lines


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
        if n.get("packages"):
            lines.append(f"  packages: {n['packages']['count']} installed (sha256 "
                         f"{n['packages']['sha256'][:12]}; `fleet show --json` lists them)")
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
        out.append(f"command: {words_changed(xa, xb)}")
    na, nb = a["nodes"], b["nodes"]
    out += [f"node {name}: only in {a['run_id']}" for name in na if name not in nb]
    out += [f"node {name}: only in {b['run_id']}" for name in nb if name not in na]
    per: dict[str, list[str]] = {}
    for name in [n for n in na if n in nb]:
        x, y = na[name], nb[name]
        per[name] = [f"{key} {x.get(key)} -> {y.get(key)}" for key in ("node_rank", "nproc")
                     if x.get(key) != y.get(key)]
        per[name] += _version_changes(x.get("versions") or {}, y.get("versions") or {})
    return out + grouped(per, every=set(na) == set(nb))


def _version_changes(x: dict[str, str], y: dict[str, str]) -> list[str]:
    return [f"{k} {x.get(k) or '(none)'} -> {y.get(k) or '(none)'}"
            for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]


def _package_changes(x: dict[str, Any] | None, y: dict[str, Any] | None,
                     shown: set[str]) -> list[str]:
    """What differs between two nodes' package lists, by name (versions already compared,
    `shown`, left out); nothing where either run did not record them."""
    if not x or not y or x.get("sha256") == y.get("sha256"):
        return []

    def by_name(entry: dict[str, Any]) -> dict[str, tuple[str, str]]:
        pairs = (p.partition("==") for p in entry.get("list") or [])
        return {re.sub(r"[-_.]+", "-", name).lower(): (name, version)
                for name, _, version in pairs}

    px, py = by_name(x), by_name(y)
    out = []
    for key in sorted(set(px) | set(py)):
        old, new = px.get(key), py.get(key)
        if key in shown or (old and new and old[1] == new[1]):
            continue
        name = (new or old or ("", ""))[0]
        out.append(f"package {name} {old[1] if old else '(none)'} -> "
                   f"{new[1] if new else '(none)'}")
    return out


def grouped(per: dict[str, list[str]], every: bool) -> list[str]:
    """Per node its changes, each said once: with the nodes it holds for (`on every node (N):`
    where it is all of them and `every`, both runs having the same nodes), in the order they
    first appear; one node's own keep its name alone (`gpu-a: ...`)."""
    where: dict[str, list[str]] = {}
    for name, changes in per.items():
        for change in changes:
            where.setdefault(change, []).append(name)
    out = []
    for change, names in where.items():
        if len(names) == 1:
            out.append(f"{names[0]}: {change}")
        elif every and len(names) == len(per):
            out.append(f"on every node ({len(names)}): {change}")
        else:
            out.append(f"on {', '.join(names)}: {change}")
    return out


def words_changed(a: list[str], b: list[str]) -> str:
    """Two commands' difference word by word, as `git diff --word-diff` writes it: `[-old-]`,
    `{+new+}`, each change after the word before it (a path by its last part: the same change
    on nodes whose homes or run directories differ reads the same), `…` for words left out."""
    parts: list[str] = []
    shown = 0  # the words of `a` said (or skipped) so far
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        before = max(i1 - 1, shown)
        if before > shown:
            parts.append("…")
        parts += [w.rstrip("/").rpartition("/")[2] or w for w in a[before:i1]]
        old = f"[-{' '.join(a[i1:i2])}-]" if i2 > i1 else ""
        parts.append(old + (f"{{+{' '.join(b[j1:j2])}+}}" if j2 > j1 else ""))
        shown = i2
    if parts and shown < len(a):
        parts.append("…")
    return " ".join(parts)


def _hosts_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out: list[str] = []
    na, nb = a["nodes"], b["nodes"]
    for name in [n for n in na if n not in nb]:
        out.append(f"host {name}: only in {a['run_id']}")
    for name in [n for n in nb if n not in na]:
        out.append(f"host {name}: only in {b['run_id']} ({nb[name]['address']})")
    per: dict[str, list[str]] = {}
    for name in [n for n in na if n in nb]:
        x, y = na[name], nb[name]
        changes = [f"{key} {x.get(key)} -> {y.get(key)}"
                   for key in ("address", "node_rank", "nproc", "setup")
                   if x.get(key) != y.get(key)]
        ex = {k: _unrun(v, a["run_id"]) for k, v in x["env"].items()}
        ey = {k: _unrun(v, b["run_id"]) for k, v in y["env"].items()}
        changes += [f"env {k} {ex.get(k, '(unset)')} -> {ey.get(k, '(unset)')}"
                    for k in sorted(set(ex) | set(ey)) if ex.get(k) != ey.get(k)]
        vx, vy = x.get("versions") or {}, y.get("versions") or {}
        changes += _version_changes(vx, vy)
        changes += _package_changes(x.get("packages"), y.get("packages"), set(vx) | set(vy))
        ax = [_unrun(w, a["run_id"]) for w in x["argv"]]
        ay = [_unrun(w, b["run_id"]) for w in y["argv"]]
        if ax != ay:
            changes.append(f"command: {words_changed(ax, ay)}")
        per[name] = changes
    return out + grouped(per, every=set(na) == set(nb))


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
