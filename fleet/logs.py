"""Log lines: torchrun's `[defaultN]:` prefix turned into a host+rank tag; re-attaching to a run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from fleet import remote
from fleet.console import Console
from fleet.group import each, reason
from fleet.state import NodeRecord, RunRecord
from fleet.states import NodeStatus
from fleet.transport import open_transport

_RANK_PREFIX = re.compile(r"\[default(\d+)\]:(.*)\Z", re.S)


@dataclass(frozen=True)
class Tagged:
    tag: str  # "node1 r3" (global rank), "node1 l0" (local rank only), or "node1" (torchrun)
    rank: int | None  # global rank, when known
    text: str


def tag_line(host: str, rank_base: int | None, line: str) -> Tagged:
    m = _RANK_PREFIX.match(line)
    if not m:
        return Tagged(host, None, line)
    local = int(m.group(1))
    if rank_base is not None:
        rank = rank_base + local
        return Tagged(f"{host} r{rank}", rank, m.group(2))
    return Tagged(f"{host} l{local}", None, m.group(2))


def attach(record: RunRecord, console: Console, follow: bool, node: str | None = None,
           rank: int | None = None, keep: Path | None = None) -> dict[str, str]:
    """Print a run's logs from every node (from the first line: nothing lost or repeated), and
    with `follow` until each node's run ends. Returns per host a problem, if any."""
    nodes = [n for n in record.nodes if node is None or n.host.name == node]
    console.hosts([n.host.name for n in nodes])
    index = {n.host.name: i for i, n in enumerate(record.nodes)}

    def one(n: NodeRecord) -> int:
        copy = open(keep / f"{n.host.name}.log", "w") if keep else None  # noqa: SIM115
        try:
            with open_transport(n.host) as t:
                run_dir = t.path(n.run_dir)
                st = remote.state(t, run_dir)
                if st.status is NodeStatus.MISSING:
                    raise FileNotFoundError(f"no run directory {run_dir}")

                def on_line(line: str) -> None:
                    if copy:
                        copy.write(line + "\n")
                    tagged = tag_line(n.host.name, n.rank_base, line)
                    if rank is None or tagged.rank == rank:
                        console.line(tagged.tag, index[n.host.name], tagged.text)

                pid = st.pid if follow and not st.done else None
                return remote.follow(t, run_dir, pid, on_line)
        finally:
            if copy:
                copy.close()

    results = each(((n.host.name, n) for n in nodes), one)
    return {name: reason(r) for name, r in results.items() if isinstance(r, Exception)}
