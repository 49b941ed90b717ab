"""`[restart] tracker = "mlflow"` on a host list: the MLflow run every attempt writes to, created
on the master once the job's python is in place (after its setup) and before any node starts,
kept in the run's record for the attempts after, and in every node's env.sh."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fleet import trackers
from fleet.backends.hosts.prepare import Session
from fleet.config.restart import Tracker
from fleet.console import Console, Meaning
from fleet.errors import HostError
from fleet.facts import mlflow_run
from fleet.nodeside.shared import nodemap
from fleet.plan import NodePlan, Plan
from fleet.render import render_node
from fleet.transport.group import all_ok, each

CREATE_TIMEOUT_S = 120.0  # a tracking server may be slow; a store on disk takes a second


def ensure_run(session: Session, plan: Plan, console: Console, record_dir: Path) -> Plan:
    """The plan with MLFLOW_RUN_ID on every node: the run's, where the job or an earlier
    attempt has one (its env), else one created now on the master and recorded. Nothing for a
    job without the MLflow tracker."""
    m, tracker = plan.master, plan.job.restart.tracker
    lacking = trackers.lacking(tracker, plan.packages)
    if tracker is not None and lacking:
        # Often only rank 0 logs: the job may not need it everywhere; the master's is checked
        # below where fleet itself needs it (MLflow's run).
        console.info(f'[restart] tracker = "{tracker.value}", but the job\'s python has no '
                     f"{trackers.PACKAGES[tracker][-1]} on {', '.join(lacking)}: a rank there "
                     f"cannot import {tracker.value} (pip install "
                     f"{trackers.PACKAGES[tracker][-1]}, say in the job's setup)", Meaning.WARN)
    if tracker is not Tracker.MLFLOW or trackers.MLFLOW_RUN_VAR in m.env:
        return plan
    with console.waiting(f"creating the MLflow run on {m.host.name}"):
        r = session.transports[m.host.name].run(
            mlflow_run.command(m.code_dir, m.run_dir, m.python, plan.run_id),
            timeout=CREATE_TIMEOUT_S, what="create the MLflow run")
    try:
        run_id = mlflow_run.parse(r.out + ("\n" + r.err if r.err else ""), r.code, m.python)
    except mlflow_run.NoRun as e:
        raise HostError("creating the MLflow run", {m.host.name: str(e)}) from None
    trackers.keep(record_dir, run_id)
    plan = dataclasses.replace(plan, nodes=tuple(
        dataclasses.replace(n, env={**n.env, trackers.MLFLOW_RUN_VAR: run_id})
        for n in plan.nodes))

    def write(n: NodePlan) -> None:
        text, mode = render_node(plan, n).files[nodemap.ENV_FILE]
        session.transports[n.host.name].write(f"{n.run_dir}/{nodemap.ENV_FILE}", text.encode(),
                                              mode, what="write env.sh")

    all_ok("giving the nodes the MLflow run", each(((n.host.name, n) for n in plan.nodes),
                                                    write))
    console.phase(m.host.name, f"MLflow run {run_id}: every attempt of run {plan.run_id} "
                               "writes to it (MLFLOW_RUN_ID)")
    return plan
