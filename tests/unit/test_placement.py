"""Placement (`nodes`, `gpus_per_node`): the pure choice of hosts and GPUs over GpuFacts
(fleet.placing), the job file's words, the run lease as lease.py writes and refuses it and as
fleet reads it, and the node scripts that give it back."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import nodeside
from fleet.backends.hosts.placing import check, planned
from fleet.backends.hosts.prepare import Session, refuse_held
from fleet.backends.slurm.cluster import cluster_for, placed
from fleet.backends.slurm.script import export_script
from fleet.config.inventory import Host
from fleet.config.job import load_job
from fleet.config.placement import Placement
from fleet.config.restart import Restart
from fleet.errors import ConfigError, HostsBusy, Unsupported
from fleet.facts.gpus import Gpu, GpuApp, GpuFacts
from fleet.facts.leases import Lease, LeaseOrder, parse_answer, parse_lease
from fleet.facts.probe import Facts, PythonState
from fleet.gpuview import lease_blockers, lease_words
from fleet.placing import choose, needs
from fleet.plan import make_plan
from fleet.render import render_node
from tests.builders import write_cluster, write_job
from tests.unit.test_plan import NETS, inventory, job

NOW = 1_795_534_438.0


def gpus(n: int) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-{i}", 0, 81559, "H100") for i in range(n))


def facts(n: int = 4, apps: tuple[GpuApp, ...] = (), leases: tuple[Lease, ...] = (),
          **kw: object) -> GpuFacts:
    return GpuFacts(smi=True, gpus=gpus(n), apps=apps, me="me", leases=leases, now=NOW,
                    **kw)  # type: ignore[arg-type]


def app(gpu: int, user: str = "alice", pid: int = 100) -> GpuApp:
    return GpuApp(f"GPU-{gpu}", pid, 2048, user)


def lease(owner: str, *on: int, run: str = "") -> Lease:
    return Lease(owner, on or None, NOW + 3600, NOW, run=run)


HOSTS = [Host("a", "10.0.0.1"), Host("b", "10.0.0.2"), Host("c", "10.0.0.3")]


# ---- the choice ---------------------------------------------------------------------------------
def test_the_first_hosts_with_enough_free_gpus_and_their_first_free_gpus() -> None:
    seen: dict[str, GpuFacts | str] = {
        "a": facts(apps=(app(0),), leases=(lease("alice", 1), lease("bob", 3))),  # 1 free
        "b": facts(apps=(app(1, "me"),), leases=(lease("me", 0),)),  # own lease: free
        "c": facts()}
    two = choose(Placement(nodes=1, gpus_per_node=2), HOSTS, seen)
    assert two.enough and two.chosen == (("b", (0, 2)),)
    assert two.why_not == {"a": "1 free: GPU0: 2048 MiB in use by user alice (pid 100); "
                                "GPU1: leased by alice; GPU3: leased by bob"}
    both = choose(Placement(nodes=2, gpus_per_node=2), HOSTS, seen)
    assert both.chosen == (("b", (0, 2)), ("c", (0, 1))) and list(both.why_not) == ["a"]
    # No `nodes`: every host, each with its GPUs.
    every = choose(Placement(gpus_per_node=1), HOSTS, seen)
    assert every.chosen == (("a", (2,)), ("b", (0,)), ("c", (0,)))
    short = choose(Placement(nodes=3, gpus_per_node=2), HOSTS, seen)
    assert not short.enough and short.needs == "3 hosts with 2 free GPUs each"


def test_run_leases_of_anyone_and_memory_nvidia_smi_does_not_list_are_not_free() -> None:
    hidden = dataclasses.replace(facts(2), gpus=(Gpu(0, "GPU-0", 4096, 81559, "H100"),
                                                 Gpu(1, "GPU-1", 0, 81559, "H100")))
    seen: dict[str, GpuFacts | str] = {
        "a": facts(2, leases=(lease("me", 0, run="j-20260101-000000-abcd"),)),
        "b": hidden, "c": facts(2, leases=(lease("bob", 1, run="x-1"),))}
    c = choose(Placement(nodes=3, gpus_per_node=1), HOSTS, seen)
    assert c.chosen == (("a", (1,)), ("b", (1,)), ("c", (0,)))
    c2 = choose(Placement(nodes=1, gpus_per_node=2), HOSTS, seen)
    assert not c2.enough and c2.why_not == {
        "a": "1 free: GPU0: leased by run j-20260101-000000-abcd of me",
        "b": "1 free: GPU0: 4 GiB held by processes nvidia-smi does not list",
        "c": "1 free: GPU1: leased by run x-1 of bob"}


def test_hosts_that_cannot_say_are_never_chosen_and_say_why() -> None:
    seen: dict[str, GpuFacts | str] = {
        "a": "unreachable: Connection refused",
        "b": facts(unknown="/var/tmp/fleet-leases holds over 10000 names"),
        "c": GpuFacts(smi=True, me="me", error="Failed to initialize NVML")}
    c = choose(Placement(nodes=1, gpus_per_node=1), HOSTS, seen)
    assert not c.enough and c.why_not == {
        "a": "not asked: unreachable: Connection refused",
        "b": "its leases are unknown: /var/tmp/fleet-leases holds over 10000 names",
        "c": "nvidia-smi failed: Failed to initialize NVML"}


def test_the_inventorys_gpus_bound_the_choice_and_a_cpu_host_has_none() -> None:
    hosts = [Host("a", "x", gpus=(1, 3, 9)), Host("b", "y"), Host("c", "z")]
    seen: dict[str, GpuFacts | str] = {"a": facts(), "b": GpuFacts(smi=False, me="me"),
                                       "c": facts(apps=(app(0),))}
    assert choose(Placement(nodes=1, gpus_per_node=2), hosts, seen).chosen == (("a", (1, 3)),)
    assert choose(Placement(nodes=1, gpus_per_node=3), hosts, seen).why_not["b"] == \
        "no GPUs (no nvidia-smi)"
    # `nodes` alone: the first hosts whose GPUs (all the job would use) are free; a CPU host fits.
    alone = choose(Placement(nodes=2), hosts, seen)
    assert alone.chosen == (("a", (1, 3)), ("b", None))
    cpu = choose(Placement(nodes=2), [hosts[2], hosts[1], hosts[0]], seen)
    assert cpu.chosen == (("b", None), ("a", (1, 3))) and cpu.why_not == {
        "c": "GPU0: 2048 MiB in use by user alice (pid 100)"}
    assert needs(Placement(nodes=2), 3) == "2 hosts whose GPUs are free"
    assert needs(Placement(gpus_per_node=1), 3) == "every host (3) with 1 free GPU each"


# ---- the job file and the inventory ------------------------------------------------------------
def test_nodes_and_gpus_per_node_in_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    path = tmp_path / "j.toml"
    path.write_text('inventory = "i.toml"\nscript = "t.py"\nnodes = 2\ngpus_per_node = 4\n')
    j = load_job(path)
    assert j.placement == Placement(2, 4) and j.nproc_per_node == 4
    path.write_text('inventory = "i.toml"\nscript = "t.py"\ngpus_per_node = 4\n'
                    "nproc_per_node = 1\n")
    assert load_job(path).nproc_per_node == 1
    path.write_text('inventory = "i.toml"\nscript = "t.py"\nnodes = 0\n')
    with pytest.raises(ConfigError, match=r"j\.toml: nodes: must be a whole number from 1"):
        load_job(path)
    many = dataclasses.replace(job(), placement=Placement(nodes=3))
    with pytest.raises(ConfigError, match=r"/jobs/j\.toml: nodes: asks for 3 hosts, but the "
                                          r"inventory /inv\.toml has 2: ask for 2 or fewer"):
        check(many, inventory())
    with pytest.raises(Unsupported, match=r"\[restart\] with `nodes` or `gpus_per_node`"):
        check(dataclasses.replace(job(), placement=Placement(1), restart=Restart(max=2)),
              inventory())


def test_fleet_plan_says_the_hosts_are_chosen_at_launch() -> None:
    inv, notes = planned(dataclasses.replace(job(), placement=Placement(1, 2)), inventory())
    assert [h.name for h in inv.hosts] == ["n1"]
    assert notes == ("the hosts and GPUs are chosen at launch: fleet up takes 1 host with 2 "
                     "free GPUs (the first that have them, in the inventory's order); shown "
                     "here: the inventory's first 1",)
    assert planned(job(), inventory()) == (inventory(), ())


# ---- run leases as fleet reads them ------------------------------------------------------------
def test_a_run_lease_is_read_shown_and_in_everyones_way() -> None:
    text = json.dumps({"gpus": [0], "until": NOW + 60, "run": "j-20260101-000000-abcd"})
    assert parse_lease("me", text).run == "j-20260101-000000-abcd"  # type: ignore[union-attr]
    for bad in ("-x", "a b", "x" * 200, 7, None, "ok\n"):
        said = json.dumps({"gpus": [0], "until": NOW + 60, "run": bad})
        assert parse_lease("me", said).run == ""  # type: ignore[union-attr]
    mine = lease("me", 0, run="j-1")
    words = lease_words(mine, NOW, NOW)
    assert words.startswith("me for run j-1 until ") and "(1 h left)" in words
    assert [b.gpu for b in lease_blockers("a", (0, 1), facts(2, leases=(mine,)), NOW)] == [0]
    assert lease_blockers("a", (0, 1), facts(2, leases=(lease("me", 0),)), NOW) == []
    assert LeaseOrder.take((0, 1), 60, "n", "j-1").argv("me@here") == [
        "take", "0,1", "60", "n", "me@here", "j-1"]
    assert LeaseOrder.take(None, 60).argv("me@here") == ["take", "all", "60", "", "me@here"]


# ---- fleet/nodeside/lease.py, run here ---------------------------------------------------------
def run(d: Path, *argv: str) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-I", "-S", "-c", nodeside.text("lease.py"), str(d),
                        *argv], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    said: dict[str, object] = json.loads(r.stdout)
    return said


def test_the_lease_program_takes_a_run_lease_all_or_nothing(tmp_path: Path) -> None:
    d = tmp_path / "leases"
    plain = run(d, "take", "0", "3600", "mine", "me@here")
    assert plain["ok"] is True and "run" not in plain["lease"][0]  # type: ignore[index]
    # A run lease over the caller's own plain lease: taken, replacing nothing.
    took = run(d, "take", "0,1", "3600", "fleet up j", "me@here", "j-20260101-000000-abcd")
    assert took["ok"] is True and took["replaces"] == [], took
    assert took["lease"][0]["run"] == "j-20260101-000000-abcd"  # type: ignore[index]
    record = json.loads((d / str(took["name"])).read_text())
    assert record["run"] == "j-20260101-000000-abcd" and record["gpus"] == [0, 1]
    # Another run lease over it, the caller's too: refused, the one in the way named.
    again = run(d, "take", "1,2", "3600", "fleet up k", "me@here", "k-1")
    assert again["ok"] is False and [c["run"] for c in again["conflicts"]] == [  # type: ignore
        "j-20260101-000000-abcd"]
    assert parse_answer(json.dumps(again)).conflicts[0].run == "j-20260101-000000-abcd"
    assert run(d, "take", "2,3", "3600", "fleet up k", "me@here", "k-1")["ok"] is True
    # A plain take over a run lease is the caller's own business, but never replaces it.
    over = run(d, "take", "0,1", "3600", "mine", "me@here")
    assert over["ok"] is True and took["name"] not in over["replaces"], over  # type: ignore
    bad = run(d, "take", "5", "60", "x", "me@here", "-rf /")
    assert bad["ok"] is False and "is not a run id" in str(bad["error"])
    # Another user's plain lease refuses a run lease too.
    other = d / "4243-000000000000.lease"
    other.write_text(json.dumps({"gpus": [7], "until": time.time() + 60}))
    if os.geteuid() == 0:
        os.chown(other, 4243, 4243)
        theirs = run(d, "take", "6,7", "60", "x", "me@here", "m-1")
        assert theirs["ok"] is False and [c["gpus"] for c in theirs["conflicts"]] == [[7]]
    # Dropped by its name, as fleet gives it back.
    assert run(d, "drop", str(took["name"]))["ok"] is True
    assert not (d / str(took["name"])).exists()


# ---- the node scripts give it back ---------------------------------------------------------------
def test_run_sh_and_stop_sh_remove_the_nodes_run_lease(tmp_path: Path) -> None:
    p = make_plan(inventory(), job(), "j-20260101-000000-abcd", master_addr="10.0.0.11",
                  nets=NETS, homes={"n1": "/root", "n2": "/home/x"})
    p = dataclasses.replace(p, leases={"n2": "0-0123456789ab.lease"})
    files = render_node(p, p.nodes[1]).files
    assert "run_lease=/var/tmp/fleet-leases/0-0123456789ab.lease\n" \
        "trap 'rm -f \"$run_lease\"' EXIT\n" in files["run.sh"][0]
    assert '[ -n "$list" ] || rm -f /var/tmp/fleet-leases/0-0123456789ab.lease\n' \
        in files["stop.sh"][0]
    plain = render_node(p, p.nodes[0]).files
    assert "run_lease" not in plain["run.sh"][0] and "fleet-leases" not in plain["stop.sh"][0]
    for name in ("run.sh", "stop.sh"):
        assert subprocess.run(["sh", "-n"], input=files[name][0], text=True).returncode == 0


# ---- Slurm: sbatch's own words ------------------------------------------------------------------
def test_slurm_takes_nodes_and_gpus_per_node_as_sbatchs(tmp_path: Path) -> None:
    write_cluster(tmp_path / "cluster.toml", nodes=8, gpus_per_node="8", nproc_per_node=8)
    job_ = load_job(write_job(tmp_path, inventory="cluster.toml", nodes=2, gpus_per_node=4))
    text = export_script(job_, placed(cluster_for(job_.inventory), job_))
    for line in ("--nodes=2", "--gpus-per-node=4"):
        assert f"#SBATCH {line}\n" in text, text
    assert "--nproc-per-node 4" in text and "--nproc-per-node 8" not in text
    plain = load_job(write_job(tmp_path, inventory="cluster.toml", name="plain.toml"))
    text = export_script(plain, placed(cluster_for(plain.inventory), plain))
    assert "#SBATCH --nodes=8\n" in text and "#SBATCH --gpus-per-node=8\n" in text


def test_a_placed_run_shares_a_host_with_another_jobs_run_only() -> None:
    s = Session({})
    s.facts = {"a": Facts("a", None, (), PythonState.OK,
                          held=("other-20260101-000000-abcd/a",))}
    refuse_held(s, "j")  # another job's run: its run lease keeps the GPUs apart
    with pytest.raises(HostsBusy, match=r"a: held by run other-20260101-000000-abcd \(still "):
        refuse_held(s)  # a job that takes the whole host
    with pytest.raises(HostsBusy, match="held by run other-20260101"):
        refuse_held(s, "other")  # its own code directory
