"""`fleet pull` on a host list: each node asked for the run's outputs in the job's directory
there (the manifest's code_dir), one node after another (their bytes share this machine's one
link anyway), each over its own connection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.console import Console
from fleet.errors import DamagedRecord, FleetError, UsageError
from fleet.run.record import NodeRecord, RunRecord
from fleet.shell import quote
from fleet.transport import open_transport
from fleet.transport.transfer.pull import Pulled
from fleet.transport.transfer.pull import pull as fetch_outputs


def pull(rec: RunRecord, m: dict[str, Any], console: Console, paths: list[str], to: Path,
         every: bool) -> dict[str, Pulled | Exception]:
    """The paths (else the job's declared outputs) from the master, or from every node into
    to/<node>; per node what came, or the error that kept it from being asked."""
    rels = paths or list(m.get("job", {}).get("outputs") or [])
    if not rels:
        raise UsageError(f"run {rec.run_id}: its job declares no outputs: name the paths "
                         f"(`fleet pull {rec.run_id} checkpoints/`), or declare them in the "
                         'job (outputs = ["checkpoints/"])')
    nodes = list(rec.nodes) if every else [min(rec.nodes, key=lambda n: n.node_rank)]
    out: dict[str, Pulled | Exception] = {}
    for n in nodes:
        code_dir = (m.get("nodes", {}).get(n.host.name) or {}).get("code_dir")
        if not isinstance(code_dir, str) or not code_dir:
            raise DamagedRecord(f"run {rec.run_id}: its manifest names no job directory for "
                                f"{n.host.name}")
        try:
            out[n.host.name] = one(n, code_dir, rels, to / n.host.name if every else to,
                                   console)
        except FleetError as e:
            out[n.host.name] = e
    return out


def one(n: NodeRecord, code_dir: str, rels: list[str], dest: Path,
        console: Console) -> Pulled:
    with console.waiting(f"connecting to {n.host.name}"):
        t = open_transport(n.host)
    with t:
        run_dir = t.path(n.run_dir)
        there = t.run(f"test -d {quote(run_dir)}", what=f"look for {run_dir}")
        if there.code != 0:
            return Pulled(dest, problems=[f"no longer has the run: {run_dir} is not there"])
        return fetch_outputs(t, n.host.python, t.path(code_dir), rels, dest, console)
