"""A detached run that heals without the laptop, from the laptop's side: at `up --detach` with
`[restart] max` and a spare, the next attempt (`<run>-a2`, FLEET_ATTEMPT=2, the same master and
port) is prepared before it is needed, one set of files per node it may replace (the spare
takes the lost node's rank): code, setup and the run's files on the spare, the attempt's files
on every node, each node's heal.sh that starts its part, and the spare's standby watcher, which
links to the master's (fleet/nodeside/watcher.py decides). The records of each possible attempt
wait in the run's own record (`heal/<node lost>/run.json`) until `status` reads the master's
healed.json (fleet.backends.hosts.healed)."""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleet import trackers
from fleet.backends.hosts import setup, watchers
from fleet.backends.hosts.node import start_script
from fleet.backends.hosts.prepare import Session, prepare_plan
from fleet.backends.hosts.upload import Sources, upload
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.config.select import load_selected
from fleet.console import Console, Meaning
from fleet.errors import FleetError
from fleet.nodeside.shared import nodemap
from fleet.nodeside.shared.heal_rules import Heal
from fleet.plan import NodePlan, Plan
from fleet.render import render_node
from fleet.run import record as state
from fleet.shell import quote, sh
from fleet.transport import Transport, open_transport
from fleet.transport.group import each

STAGED = "heal"  # in the run's record: one record per node the next attempt may replace
SCRIPT = "heal.sh"  # in the next attempt's run directory on each node
VARIANTS = "variants"  # beside it: the attempt's files as they are with each node lost
STANDBY = "standby.json"  # the spare's standby watcher's config, removed as it starts


@dataclass
class Staged:
    """The next attempt, prepared: its run id and secret, its plan with each node lost, the
    spare and its connection."""

    run_id: str
    secret: str
    spare: Host
    spare_t: Transport
    plans: dict[str, Plan] = field(default_factory=dict)  # node lost -> the attempt's plan

    def run_dir(self, host: str) -> str:
        return next(n.run_dir for p in self.plans.values() for n in p.nodes
                    if n.host.name == host)

    def heal_for(self, host: str) -> Heal:
        """What node `host`'s watcher is told of the next attempt."""
        return Heal(2, self.run_id, f"{self.run_dir(host)}/{SCRIPT}", (self.spare.name,))


def stage(session: Session, plan: Plan, job: Job, console: Console, sources: Sources | None,
          record_dir: Path, detach: bool) -> Staged | None:
    """The next attempt prepared, where the run is detached, `[restart] max` is set and the
    inventory has a spare; None otherwise, or where it could not be (said: the run fails
    fast)."""
    inventory = load_selected(job.inventory, job.selection)
    if not (detach and job.restart.max and inventory.spares and len(plan.nodes) > 1):
        return None
    assert sources is not None
    try:
        return prepare(session, plan, inventory, job, console, sources, record_dir)
    except FleetError as e:  # the spare unfit: the run itself may still start
        console.info(f"healing not prepared: {e}; this detached run fails fast", Meaning.WARN)
        return None


def prepare(session: Session, plan: Plan, inventory: Inventory, job: Job, console: Console,
            sources: Sources, record_dir: Path) -> Staged:
    """Plan the next attempt with each non-master node lost, and put code, setup and its files
    on the spare (the others have them already: this attempt's)."""
    spare = inventory.spares[0]
    t = open_transport(spare, hello=False)
    staged = Staged(f"{plan.run_id}-a2", secrets.token_hex(16), spare, t)
    try:
        env = {**trackers.created_vars(record_dir), **job.env, "FLEET_ATTEMPT": "2"}
        job2 = dataclasses.replace(job, env=env)
        for n in plan.nodes[1:]:
            hosts = tuple(spare if h.name == n.host.name else h for h in inventory.hosts)
            inv = dataclasses.replace(inventory, hosts=hosts, spares=())
            s = Session({h.name: session.transports.get(h.name, t) for h in hosts})
            staged.plans[n.host.name] = prepare_plan(s, inv, job2, staged.run_id, console,
                                                     run=plan.run_id)
        first = next(iter(staged.plans.values()))
        s = Session({n.host.name: session.transports.get(n.host.name, t) for n in first.nodes})
        s.facts = {**session.facts}
        upload(s, first, console, sources)
        setup.run(s.transports, first, console)
    except BaseException:
        t.close()
        raise
    return staged


def heal_script(n: NodePlan, run_id: str, python: str, lost: list[str]) -> str:
    """The node's heal.sh: its files as they are with `$1` lost, then its part started."""
    return "\n".join([
        f"cd {quote(n.run_dir)} || exit 1",
        f"case \"$1\" in {'|'.join(quote(x) for x in lost)}) ;; *) exit 2 ;; esac",
        # Then gone: they hold the next attempt's keys, which only its watcher should keep.
        f"cp -R {quote(VARIANTS)}/\"$1\"/. . && rm -rf {quote(VARIANTS)} || exit 1",
        start_script(n.run_dir, run_id, python), ""])


def arm(session: Session, plan: Plan, staged: Staged, secret: str, port: int,
        console: Console) -> None:
    """Once this attempt's watchers listen (`port`): every node's files of the next attempt,
    its heal.sh, the records waiting on this machine, then the spare's standby watcher (the
    last: without it, nothing heals). Where that fails, the run goes on and fails fast."""
    try:
        _arm(session, plan, staged, secret, port, console)
    except FleetError as e:
        console.info(f"healing not prepared: {e}; this detached run fails fast", Meaning.WARN)
    finally:
        staged.spare_t.close()


def _arm(session: Session, plan: Plan, staged: Staged, secret: str, port: int,
         console: Console) -> None:
    transports = {**session.transports, staged.spare.name: staged.spare_t}
    by_node: dict[str, list[tuple[str, NodePlan, Plan]]] = {}
    for lost, p in staged.plans.items():
        for n in p.nodes:
            by_node.setdefault(n.host.name, []).append((lost, n, p))

    def write(host: str) -> None:
        t = transports[host]
        variants = by_node[host]
        run_dir = variants[0][1].run_dir
        t.run(sh("mkdir", "-p", *(f"{run_dir}/{VARIANTS}/{lost}" for lost, _, _ in variants)),
              timeout=30, what="make the next attempt's directories")
        for lost, n, p in variants:
            base = f"{run_dir}/{VARIANTS}/{lost}"
            for name, (text, mode) in render_node(p, n).files.items():
                if "/" in name:
                    t.run(sh("mkdir", "-p", f"{base}/{name.rpartition('/')[0]}"), timeout=30)
                t.write(f"{base}/{name}", text.encode(), mode)
            cfg = watchers.config(p, n, staged.secret,
                                  state.stop_key(staged.secret, staged.run_id, host), port)
            t.write(f"{base}/{nodemap.WATCHER_CONFIG}", cfg.dumps().encode(), 0o600)
        t.write(f"{run_dir}/{SCRIPT}", heal_script(
            variants[0][1], staged.run_id, t.path(t.host.python),
            [lost for lost, _, _ in variants]).encode(), 0o700)

    got = each(((h, h) for h in by_node), write)
    if bad := {h: r for h, r in got.items() if isinstance(r, Exception)}:
        raise next(iter(bad.values()))
    keep(plan.run_id, staged, plan.job.restart.max)
    start_standby(plan, staged, secret, port)
    console.info(f"healing prepared: attempt 2 ({staged.run_id}) starts by itself with "
                 f"{staged.spare.name} in the place of a node lost (but the master)")


def keep(run_id: str, staged: Staged, max_: int) -> None:
    """Each possible attempt's record, in the run's own, until `status` learns which one ran."""
    d = state.state_dir() / run_id / STAGED
    d.mkdir(parents=True, exist_ok=True)
    (d / "max").write_text(f"{max_}\n")
    for lost, p in staged.plans.items():
        rec = state.RunRecord(
            run_id=staged.run_id, job=str(p.job.path), started=time.time(),
            nodes=tuple(state.NodeRecord(n.host, n.node_rank, n.run_dir, n.rank_base,
                                         n.nproc if isinstance(n.nproc, int) else None)
                        for n in p.nodes), controller=state.controller_id(),
            secret=staged.secret, parent=run_id)
        d = state.state_dir() / run_id / STAGED / lost
        d.mkdir(parents=True, exist_ok=True)
        state.write_atomic(d / "run.json", json.dumps(dataclasses.asdict(rec), indent=2) + "\n")


def start_standby(plan: Plan, staged: Staged, secret: str, port: int) -> None:
    """The spare's standby watcher, linked to this attempt's master's: outside any run's
    environment, it ends with the master's watcher."""
    t = staged.spare_t
    run_dir = staged.run_dir(staged.spare.name)
    cfg = dataclasses.replace(watchers.config(plan, plan.master, secret, "", port),
                              node=staged.spare.name, heal=staged.heal_for(staged.spare.name))
    f = f"{run_dir}/{STANDBY}"
    t.write(f, cfg.dumps().encode(), 0o600)
    py = t.path(t.host.python)
    t.run(f"cd {quote(run_dir)} && exec 4< {quote(f)} && rm -f {quote(f)} && "
          f"(setsid {sh(py, '-I', '-S', nodemap.WATCHER, run_dir, '0', '0')} <&4 "
          "> /dev/null 2>&1 4<&- &)", timeout=30, what="start the spare's standby watcher")
