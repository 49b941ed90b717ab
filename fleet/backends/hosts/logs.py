"""`fleet logs` of a run on hosts: every node's log read from its run directory, from the first
line (nothing lost or repeated), tagged by host and rank; with `follow`, until each node's run
ends."""

from __future__ import annotations

from pathlib import Path

from fleet.backends.hosts import node as remote
from fleet.console import Console
from fleet.facts import run_state
from fleet.run.logs import Tagger
from fleet.run.record import NodeRecord, RunRecord
from fleet.run.states import NodeStatus
from fleet.transport import open_transport
from fleet.transport.group import each, reason


def attach(record: RunRecord, console: Console, follow: bool, node: str | None = None,
           rank: int | None = None, keep: Path | None = None) -> tuple[dict[str, str], int]:
    """Print a run's logs from every node (from the first line: nothing lost or repeated), and
    with `follow` until each node's run ends. Returns per host a problem, if any, and how many
    lines were printed."""
    nodes = [n for n in record.nodes if node is None or n.host.name == node]
    console.hosts([n.host.name for n in nodes])
    index = {n.host.name: i for i, n in enumerate(record.nodes)}
    shown = [0]

    def one(n: NodeRecord) -> int:
        copy = open(keep / f"{n.host.name}.log", "w") if keep else None  # noqa: SIM115
        try:
            with open_transport(n.host) as t:
                run_dir = t.path(n.run_dir)
                st = run_state.state(t, run_dir, record.stop_key(n.host.name))
                if st.status is NodeStatus.MISSING:
                    raise FileNotFoundError(f"no run directory {run_dir}")
                tag = Tagger(n.host.name, n.rank_base, lambda: run_state.ranks(t, run_dir))

                def on_lines(lines: list[str]) -> None:
                    if copy:
                        copy.write("".join(line + "\n" for line in lines))
                    tagged = [tg for tg in map(tag, lines) if rank is None or tg.rank == rank]
                    shown[0] += len(tagged)
                    console.lines(index[n.host.name], [(tg.tag, tg.text) for tg in tagged])

                pid = st.pid if follow and not st.done else None
                return remote.follow(t, run_dir, pid, on_lines)
        finally:
            if copy:
                copy.close()

    results = each(((n.host.name, n) for n in nodes), one)
    return {name: reason(r) for name, r in results.items() if isinstance(r, Exception)}, shown[0]
