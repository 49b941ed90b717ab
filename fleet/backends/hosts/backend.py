"""The hosts backend: runs on the SSH hosts of an inventory (fleet.backends.hosts.run), and what
later commands ask of a recorded run there, each node asked over its own connection."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.backends.answers import Seen
from fleet.backends.base import GpuSurvey, LabTools, Launch, Options, Recorded
from fleet.backends.checks import Check
from fleet.backends.hosts import gpus, healed, recorded
from fleet.backends.hosts import logs as fleet_logs
from fleet.backends.hosts import node as remote
from fleet.backends.hosts.queue import HostsQueue
from fleet.backends.hosts.top import RecordTop
from fleet.config import select
from fleet.config.inventory import BackendKind, Inventory, load_inventory
from fleet.config.job import Job
from fleet.config.select import Selection, load_selected
from fleet.console import Console
from fleet.errors import DamagedRecord, FleetError, NotEveryNode, UsageError
from fleet.facts import run_state
from fleet.facts.command import Outcome
from fleet.facts.leases import LeaseOrder, Taken
from fleet.plan import Plan
from fleet.run import hang, outcomes, verdict
from fleet.run.logs import View
from fleet.run.record import NodeRecord, RunRecord
from fleet.run.stopping import StopProgress
from fleet.states import NodeOutcome, NodeStatus, RunStatus, overall
from fleet.transport import Transport, open_transport
from fleet.transport.forward import Tunnel
from fleet.transport.group import each, reason
from fleet.trust import KeyStatus, record_inventory
from fleet.waits import Words, named, over

if TYPE_CHECKING:  # what launches, plans, checks and copies: loaded by the commands that do
    from fleet.backends.hosts import planview
    from fleet.backends.hosts.replicate import Keeper
    from fleet.backends.hosts.run import HostsRun
    from fleet.backends.hosts.setup import Decision
    from fleet.doctor.figures import Examination
    from fleet.transport.transfer.pull import Pulled


@dataclass(frozen=True)
class PlanPreview:
    """`fleet plan` on a host list: the plan, each node's setup decision, and what moves."""

    plan: Plan
    setups: dict[str, Decision]
    moves: planview.Moves
    spares: tuple[planview.Spare, ...] = ()

    def lines(self) -> list[str]:
        from fleet.backends.hosts import planview
        return planview.lines(self.plan, self.setups, self.moves, self.spares)

    def as_json(self) -> dict[str, object]:
        from fleet.backends.hosts import planview
        return planview.as_json(self.plan, self.moves, self.spares)


class HostsBackend(Launch, Recorded, LabTools):
    kind = BackendKind.HOSTS

    def prepare(self, job: Job, console: Console, options: Options) -> HostsRun:
        from fleet.backends.hosts.run import prepare
        return prepare(job, console, options)

    def checks(self, job: Job, collective: bool, progress: Callable[[Words], None],
               trust: str) -> list[Check]:
        from fleet.backends.hosts import check as fleet_check
        return fleet_check.run_checks(load_selected(job.inventory, job.selection), job, progress,
                                      trust)

    def preview(self, job: Job, probe: bool) -> PlanPreview:
        from fleet.backends.hosts import planview
        return PlanPreview(*planview.survey(job, probe))

    def collective(self, job: Job) -> Job:
        from fleet.backends.hosts import check as fleet_check
        return fleet_check.collective_job(job)

    def queue(self, inventory: Path) -> HostsQueue:
        return HostsQueue(inventory)

    def spares(self, inventory: Path) -> list[str]:
        return [h.name for h in load_inventory(inventory).spares]

    def replicas(self, job: Job, console: Console, run_id: str) -> Keeper:
        from fleet.backends.hosts.replicate import Keeper
        return Keeper(job, console, run_id)

    def trust_inventory(self, path: Path) -> Inventory:
        return load_inventory(path)

    def pin_keys(self, statuses: list[KeyStatus], path: Path) -> int:
        return record_inventory(statuses, path)

    def describe(self, rec: RunRecord) -> tuple[RunStatus, list[str]]:
        head = f"run {rec.run_id} ({rec.job}), started {time.ctime(rec.started)}: "
        if rec.never_started():
            return RunStatus.NEVER_STARTED, [
                f"{head}{RunStatus.NEVER_STARTED.value}\n  the `fleet up` that prepared it ended "
                "(it was killed, or its machine stopped) before it started any node: nothing of "
                f"it runs; `fleet rm {rec.run_id}` removes what it left on the nodes"]
        results = node_outcomes(rec)
        final = overall(status(r) for r in results.values())
        return final, [f"{head}{final.value}"] + [node_row(n, results[n.host.name])
                                                  for n in rec.nodes]

    def parts_left(self, rec: RunRecord, nodes: set[str]) -> list[str]:
        # Only these nodes are asked: the others' ends are kept, or fleet stopped them.
        results = node_outcomes(rec, nodes)
        if overall(status(r) for r in results.values()).is_terminal:
            return []
        return [node_row(n, results[n.host.name]) for n in rec.nodes if n.host.name in results]

    def take_healed(self, rec: RunRecord) -> None:
        # A run whose end fleet has kept is not asked again, healed or not.
        if not healed.waiting(rec) or verdict.read(rec.dir) is not None:
            return
        try:
            text = healed.read(rec)
        except FleetError:  # the master not there to ask: asked again next time
            return
        try:
            healed.take(rec, text)
        except FileNotFoundError:  # another fleet command took it in at the same time
            return

    def state(self, rec: RunRecord) -> Seen:
        if rec.never_started():
            return Seen(RunStatus.NEVER_STARTED)
        found = node_outcomes(rec)
        silent = [name for name, r in found.items() if isinstance(r, Exception)]
        return Seen(overall(status(s) for s in found.values()),
                    why=", ".join(silent) + " unreachable" if silent else "")

    def cancel(self, rec: RunRecord, console: Console) -> None:
        names = [n.host.name for n in rec.nodes]
        console.hosts(names)
        progress = StopProgress(names, console.event)
        with console.waiting(f"stopping: 0/{len(names)} nodes done"), progress:
            results = recorded.stop_recorded(rec, "fleet stop", heard=progress.heard)
        failed: dict[str, str] = {}
        for name, r in results.items():
            if isinstance(r, Exception):
                failed[name] = (f"could not stop: {reason(r)}; the run may still be running "
                                f"there: run `fleet stop {rec.run_id}` again once it answers")
            elif r.left:
                failed[name] = f"still alive after SIGKILL: {r.left}"
        console.phases(failed)
        console.phases({name: "stopped (nothing of the run left that fleet can find: by run id, "
                              "session or descent)" for name in results if name not in failed})
        bad = len(failed)
        if bad:
            raise NotEveryNode(f"run {rec.run_id} could not be stopped on {bad} node(s)")
        console.info(f"run {rec.run_id} stopped on every node")

    def stop_part(self, rec: RunRecord, node: str, by: str) -> bool:
        r = recorded.stop_recorded(rec, by, only={node})[node]
        if isinstance(r, Exception):
            raise r
        if r.left:
            raise NotEveryNode(f"{node}: still alive after SIGKILL: {r.left}")
        return r.found

    def logs(self, rec: RunRecord, console: Console, follow: bool, node: str | None,
             rank: int | None, view: View) -> int:
        if node is not None and node not in {n.host.name for n in rec.nodes}:
            raise UsageError(f"run {rec.run_id} has no node {node!r}")
        keep = rec.dir if node is None and rank is None and view.plain else None
        problems, shown = fleet_logs.attach(rec, console, follow, view, node, rank, keep)
        for name, why in problems.items():
            console.phase(name, f"unreachable: {why}")
        if problems:
            raise NotEveryNode(f"run {rec.run_id}: the logs of {', '.join(problems)} could "
                               "not be read")
        if rank is not None and not shown and view.plain:
            raise UsageError(f"run {rec.run_id}: no log line of global rank {rank}"
                             + (f" on {node}" if node else "") + " (lines that workers did "
                             "not print through the launcher carry no rank)")
        return shown

    def dump(self, rec: RunRecord) -> tuple[list[str], list[str]]:
        def connect(n: NodeRecord) -> Transport:
            return open_transport(n.host)

        with over("connect", (n.host.name for n in rec.nodes)) as wait:
            opened = each(named((n.host.name, n) for n in rec.nodes), wait.tracked(connect))
        try:
            nodes = {n.host.name: (t, t.path(n.run_dir)) for n in rec.nodes
                     if isinstance(t := opened[n.host.name], Transport)}
            lines, problems = hang.take(nodes, rec.run_id, rec.dir)
        finally:
            for t in opened.values():
                if isinstance(t, Transport):
                    t.close()
        return lines, [f"{name}: unreachable: {reason(r)}" for name, r in opened.items()
                       if isinstance(r, Exception)] + problems

    def top(self, rec: RunRecord) -> RecordTop:
        return RecordTop(rec)

    def delete(self, rec: RunRecord, console: Console) -> None:
        console.hosts([n.host.name for n in rec.nodes])
        with console.hosts_waiting("rm", (n.host.name for n in rec.nodes)) as wait:
            results = recorded.on_nodes(rec, remote.remove, wait=wait)
        bad = {name: reason(r) for name, r in results.items() if isinstance(r, Exception)}
        for name, r in results.items():
            console.phase(name, f"kept: {bad[name]}" if name in bad else f"removed {r}")
        if bad:
            console.info(f"the local record of {rec.run_id} is kept until every node is clean")
            raise NotEveryNode(f"run {rec.run_id}: {', '.join(bad)} could not be cleaned")
        if (prepared := healed.waiting_record(rec)) is not None:  # an attempt never started
            self.delete(prepared, console)

    def tunnel(self, rec: RunRecord, node: str | None) -> Tunnel:
        names = [n.host.name for n in rec.nodes]
        name = min(rec.nodes, key=lambda n: n.node_rank).host.name if node is None else node
        if name not in names:
            raise UsageError(f"run {rec.run_id} has no node {node!r}; its nodes: "
                             f"{', '.join(names)}")
        host = next(n.host for n in rec.nodes if n.host.name == name)
        return Tunnel(open_transport(host, hello=False), name)

    def manifest(self, rec: RunRecord, console: Console) -> dict[str, Any]:
        path = rec.dir / "manifest.json"
        try:
            return json.loads(path.read_text())  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise UsageError(f"run {rec.run_id} has no manifest ({path}): it never got past its "
                             "setup, or an older fleet started it") from None
        except ValueError as e:
            raise DamagedRecord(f"{path}: cannot be read ({e})") from e

    def pull(self, rec: RunRecord, console: Console, paths: list[str], to: Path,
             every: bool) -> dict[str, Pulled | Exception]:
        from fleet.backends.hosts import pull as fleet_pull
        return fleet_pull.pull(rec, self.manifest(rec, console), console, paths, to, every)

    def survey(self, inventory: Path, nodes: Selection) -> GpuSurvey:
        return gpus.Survey(select.hosts(load_inventory(inventory), nodes))

    def doctor(self, inventory: Path, nodes: Selection, quick: bool,
               progress: Callable[[Words], None]) -> Examination:
        from fleet.backends.hosts import doctor

        inv = select.narrowed(load_inventory(inventory), nodes)
        return doctor.examine(inv, quick, inv.doctor, progress)

    def lease(self, inventory: Path, host: str, order: LeaseOrder) -> Taken:
        from fleet.backends.hosts import execute as fleet_exec
        return gpus.lease(fleet_exec.chosen(load_inventory(inventory), [host])[0], order)

    def execute(self, inventory: Path, job: Job | None, argv: list[str], nodes: Selection,
                timeout: float | None) -> dict[str, Outcome]:
        from fleet.backends.hosts import execute as fleet_exec
        return fleet_exec.execute(load_inventory(inventory), job, argv, nodes, timeout)


def node_outcomes(rec: RunRecord, only: set[str] | None = None
                  ) -> dict[str, NodeOutcome | Exception]:
    """How each node's part ended as fleet saw it (the run's record), of every node or those in
    `only`; only the nodes whose end fleet did not see are asked (in parallel, bounded), and an
    end they say is kept from then on."""
    known = outcomes.ended(rec.dir)
    names = {n.host.name for n in rec.nodes} if only is None else only
    # All at once, each within recorded.ASK_S: a silent host is said unreachable in seconds,
    # and what is kept of it stays as it is.
    asked = recorded.ask(
        rec, lambda t, d: run_state.state(t, d, rec.stop_key(t.host.name)),
        only=names - set(known))
    found: dict[str, NodeOutcome | Exception] = {}
    for n in rec.nodes:
        name = n.host.name
        if name not in names:
            continue
        r = known.get(name) or asked[name]
        if isinstance(r, run_state.NodeState):
            r = r.outcome(name, n.node_rank)
            if r.status.is_terminal:
                r = outcomes.note(rec.dir, r, "fleet status")
        found[name] = r
    return found


def node_row(n: NodeRecord, r: NodeOutcome | Exception) -> str:
    """A node's row in `fleet status`: its name, ranks and state."""
    where = f"  {n.host.name:<16} {n.ranks()}"
    if isinstance(r, Exception):
        return f"{where}  unreachable (may still be running): {reason(r)}"
    if r.status is NodeStatus.MISSING:
        return f"{where}  missing (no run directory there)"
    return f"{where}  {node_words(r)}"


node_words = outcomes.words  # `failed (exit 1)  12s`: a node's row, as the record says it too


def status(r: NodeOutcome | Exception) -> NodeStatus:
    return r.status if isinstance(r, NodeOutcome) else NodeStatus.UNREACHABLE
