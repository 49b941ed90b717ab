"""Pure planning and rendering: ranks, env precedence, torchrun lines, golden node scripts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet.inventory import Host, Inventory
from fleet.job import Job, Rendezvous
from fleet.plan import NodeNet, make_plan, rank_span
from fleet.render import render_node
from fleet.state import NodeRecord

GOLDEN = Path(__file__).parent / "golden"


def inventory() -> Inventory:
    return Inventory(Path("/inv.toml"), (
        Host("n1", "10.0.0.11", python="/opt/venv/bin/python",
             env={"NCCL_SOCKET_IFNAME": "=eno2"}),
        Host("n2", "10.0.0.12", python="/opt/venv/bin/python", workdir="/scratch/fleet"),
    ))


def job(**kw: object) -> Job:
    base = dict(path=Path("/jobs/j.toml"), name="j", inventory=Path("/inv.toml"),
                workdir=Path("/jobs"), script="train.py", args=("--msg", "it's $(rm -rf /)"),
                nproc_per_node=2, env={"NCCL_DEBUG": "WARN", "FLEET_RUN_ID": "hijack"})
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


NETS = {"n1": NodeNet("eth0", "10.0.0.11", "holds"), "n2": NodeNet("ens5", "10.0.0.12", "route")}


def test_ranks_follow_inventory_order_master_first() -> None:
    p = make_plan(inventory(), job(), "j-1", master_addr="10.0.0.11", nets=NETS,
                  homes={"n1": "/root", "n2": "/home/x"})
    assert [(n.host.name, n.node_rank, n.nnodes) for n in p.nodes] == [("n1", 0, 2), ("n2", 1, 2)]
    assert p.master.host.name == "n1"
    assert p.nodes[0].run_dir == "/root/fleet/runs/j-1/n1"
    assert p.nodes[1].run_dir == "/scratch/fleet/runs/j-1/n2"
    assert p.nodes[1].global_rank(1) == 3


def test_env_precedence_detected_then_job_then_host_and_run_id_is_fleets() -> None:
    p = make_plan(inventory(), job(), "j-1", master_addr="10.0.0.11", nets=NETS)
    n1, n2 = p.nodes
    assert n1.env["NCCL_SOCKET_IFNAME"] == "=eno2"  # pinned by the host wins
    assert n2.env["NCCL_SOCKET_IFNAME"] == "=ens5" and n2.env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert n1.env["NCCL_DEBUG"] == "WARN"
    assert n1.env["FLEET_RUN_ID"] == "j-1"  # a job cannot break `fleet stop`


def test_static_and_c10d_torchrun_lines() -> None:
    p = make_plan(inventory(), job(), "j-1", master_addr="10.0.0.11", nets=NETS)
    argv = p.nodes[1].argv
    assert argv[:3] == ("/opt/venv/bin/python", "-m", "torch.distributed.run")
    i = argv.index("--node-rank")
    assert argv[i + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.11"
    assert argv[argv.index("--local-addr") + 1] == "10.0.0.12"
    assert argv[-2:] == ("--msg", "it's $(rm -rf /)")
    c = make_plan(inventory(), job(rendezvous=Rendezvous("c10d", 29400, 60)), "j-2",
                  master_addr="10.0.0.11").nodes[0].argv
    assert c[c.index("--rdzv-endpoint") + 1] == "10.0.0.11:29400"
    assert c[c.index("--rdzv-id") + 1] == "j-2"
    assert "--master-addr" not in c


def test_single_local_host_uses_loopback() -> None:
    inv = Inventory(Path("/i"), (Host("local", "localhost", transport="local"),))
    p = make_plan(inv, job(), "j-1")
    assert p.master.master_addr == "127.0.0.1"


@pytest.mark.parametrize("name", ["env.sh", "run.sh", "stop.sh"])
def test_rendered_scripts_match_golden(name: str) -> None:
    p = make_plan(inventory(), job(), "j-20260101-000000-abcd", master_addr="10.0.0.11",
                  nets=NETS, homes={"n1": "/root", "n2": "/home/x"})
    text, mode = render_node(p, p.nodes[1]).files[name]
    golden = GOLDEN / f"{name}.golden"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    assert mode == (0o600 if name == "env.sh" else 0o700)
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_env_file_reads_back_literally(tmp_path: Path) -> None:
    hostile = "a'b\"c $(touch pwned) `touch pwned2` ; \\ \n new line"
    p = make_plan(inventory(), job(env={"X": hostile}), "j-1", master_addr="10.0.0.11")
    env_sh = tmp_path / "env.sh"
    env_sh.write_text(render_node(p, p.nodes[0]).files["env.sh"][0])
    out = subprocess.run(["bash", "-c", '. ./env.sh && printf %s "$X"'], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.stdout == hostile
    assert not list(tmp_path.glob("pwned*"))


def test_job_templates_override_by_file_name(tmp_path: Path) -> None:
    (tmp_path / "env.sh.j2").write_text("export ONLY={{ node.host.name | q }}\n")
    p = make_plan(inventory(), job(templates=tmp_path), "j-1", master_addr="10.0.0.11")
    files = render_node(p, p.nodes[0]).files
    assert files["env.sh"][0] == "export ONLY=n1\n"
    assert "torch.distributed.run" in files["run.sh"][0]  # the others still ship


def test_accelerate_command_per_node() -> None:
    p = make_plan(inventory(), job(launcher="accelerate"), "j-1", master_addr="10.0.0.11",
                  nets=NETS, homes={"n1": "/root", "n2": "/home/x"},
                  has_gpus={"n1": False, "n2": False})
    argv = p.nodes[1].argv
    assert argv[:4] == ("/opt/venv/bin/python", "-m", "accelerate.commands.launch",
                        "--multi_gpu")
    for flag, value in (("--num_machines", "2"), ("--machine_rank", "1"),
                        ("--num_processes", "4"), ("--main_process_ip", "10.0.0.11"),
                        ("--main_process_port", "29500")):
        assert argv[argv.index(flag) + 1] == value
    assert argv[-3:] == ("/scratch/fleet/code/j-e64649bc/train.py", "--msg", "it's $(rm -rf /)")
    assert p.nodes[1].env["ACCELERATE_USE_CPU"] == "true"  # CPU nodes: MULTI_CPU workers
    assert p.nodes[1].rank_base == 2
    gpu = make_plan(inventory(), job(launcher="accelerate"), "j-1", master_addr="10.0.0.11",
                    has_gpus={"n1": True, "n2": True})
    assert "ACCELERATE_USE_CPU" not in gpu.nodes[1].env


def test_command_launcher_fills_placeholders_per_node() -> None:
    cmd = ("{python}", "main.py", "--dist-url", "tcp://{master_addr}:{master_port}",
           "--world-size", "{nnodes}", "--rank", "{node_rank}", "--literal", "{{x}}")
    p = make_plan(inventory(), job(launcher="command", command=cmd, script=None, args=()), "j-1",
                  master_addr="10.0.0.11")
    assert p.nodes[1].argv == ("/opt/venv/bin/python", "main.py", "--dist-url",
                               "tcp://10.0.0.11:29500", "--world-size", "2", "--rank", "1",
                               "--literal", "{x}")


def test_legacy_launcher_is_torchrun_with_the_local_rank_as_an_argument() -> None:
    p = make_plan(inventory(), job(launcher="legacy"), "j-1", master_addr="10.0.0.11")
    argv = p.nodes[0].argv
    assert argv[1:3] == ("-m", "torch.distributed.run")
    shim = argv.index("~/fleet/runs/j-1/n1/site/fleet_local_rank.py")
    assert argv[shim + 1:shim + 3] == ("--local-rank", "~/fleet/code/j-e64649bc/train.py")
    old = make_plan(inventory(), job(launcher="legacy", local_rank_flag="--local_rank"), "j-1",
                    master_addr="10.0.0.11").nodes[0].argv
    assert old[shim + 1] == "--local_rank"
    assert "--tee" in argv


def test_rank_span_says_one_rank_as_one() -> None:
    assert rank_span(2, 1) == "rank 2"
    assert rank_span(0, 2) == "ranks 0-1"
    assert rank_span(None, 2) == rank_span(3, "gpu") == ""
    rec = NodeRecord(Host("n2", "10.0.0.12"), 1, "/r", 2, 2)
    assert rec.ranks() == "node rank 1 (ranks 2-3)"
    assert NodeRecord(Host("n2", "10.0.0.12"), 1, "/r", None).ranks() == "node rank 1"


def test_dry_run_never_hands_the_nodes_a_name_as_master_address() -> None:
    named = Inventory(Path("/inv.toml"), (Host("gpu-a", "gpu-a"), Host("gpu-b", "gpu-b")))
    p = make_plan(named, job(), "j-1")
    assert p.master.master_addr == "<IP of gpu-a>"
    assert "--master-addr" in p.nodes[1].argv
    assert p.nodes[1].argv[p.nodes[1].argv.index("--master-addr") + 1] == "<IP of gpu-a>"
    assert any("'gpu-a' is a name" in note and "--probe" in note for note in p.notes)
    # An IP in the inventory is the address itself; a probe's answer wins over the name.
    assert make_plan(inventory(), job(), "j-1").master.master_addr == "10.0.0.11"
    assert make_plan(named, job(), "j-1", master_addr="10.0.0.7").master.master_addr == \
        "10.0.0.7"
