"""Pure planning and rendering: ranks, env precedence, torchrun lines, golden node scripts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fleet import preview
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job, Launcher, Rendezvous, RendezvousBackend
from fleet.facts.net import NodeNet
from fleet.plan import Plan, make_plan, rank_span
from fleet.render import render_node
from fleet.run.record import NodeRecord
from fleet.transport.sync import Scan

H = preview.How

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


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
    assert n1.env["FLEET_ATTEMPT_ID"] == "j-1"


def test_a_later_attempt_has_the_runs_id_and_its_own() -> None:
    p = make_plan(inventory(), job(), "j-1-a3", master_addr="10.0.0.11", nets=NETS, run="j-1")
    assert {(n.env["FLEET_RUN_ID"], n.env["FLEET_ATTEMPT_ID"]) for n in p.nodes} == {
        ("j-1", "j-1-a3")}
    assert p.nodes[0].run_dir.endswith("/runs/j-1-a3/n1")  # each attempt has its directory


def test_static_and_c10d_torchrun_lines() -> None:
    p = make_plan(inventory(), job(), "j-1", master_addr="10.0.0.11", nets=NETS)
    argv = p.nodes[1].argv
    assert argv[:3] == ("/opt/venv/bin/python", "-m", "torch.distributed.run")
    i = argv.index("--node-rank")
    assert argv[i + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.11"
    assert argv[argv.index("--local-addr") + 1] == "10.0.0.12"
    assert argv[-2:] == ("--msg", "it's $(rm -rf /)")
    c = make_plan(inventory(), job(rendezvous=Rendezvous(RendezvousBackend.C10D, 29400, 60)), "j-2",
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
    p = make_plan(inventory(), job(launcher=Launcher.ACCELERATE), "j-1", master_addr="10.0.0.11",
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
    gpu = make_plan(inventory(), job(launcher=Launcher.ACCELERATE), "j-1", master_addr="10.0.0.11",
                    has_gpus={"n1": True, "n2": True})
    assert "ACCELERATE_USE_CPU" not in gpu.nodes[1].env


def test_command_launcher_fills_placeholders_per_node() -> None:
    cmd = ("{python}", "main.py", "--dist-url", "tcp://{master_addr}:{master_port}",
           "--world-size", "{nnodes}", "--rank", "{node_rank}", "--literal", "{{x}}")
    p = make_plan(inventory(), job(launcher=Launcher.COMMAND, command=cmd, script=None, args=()),
                  "j-1", master_addr="10.0.0.11")
    assert p.nodes[1].argv == ("/opt/venv/bin/python", "main.py", "--dist-url",
                               "tcp://10.0.0.11:29500", "--world-size", "2", "--rank", "1",
                               "--literal", "{x}")


def test_legacy_launcher_is_torchrun_with_the_local_rank_as_an_argument() -> None:
    p = make_plan(inventory(), job(launcher=Launcher.LEGACY), "j-1", master_addr="10.0.0.11")
    argv = p.nodes[0].argv
    assert argv[1:3] == ("-m", "torch.distributed.run")
    shim = argv.index("~/fleet/runs/j-1/n1/site/fleet_local_rank.py")
    assert argv[shim + 1:shim + 3] == ("--local-rank", "~/fleet/code/j-e64649bc/train.py")
    old = make_plan(inventory(), job(launcher=Launcher.LEGACY, local_rank_flag="--local_rank"),
                    "j-1", master_addr="10.0.0.11").nodes[0].argv
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


# ---- what `fleet plan` says would move (fleet.preview) ------------------------------------------
MiB = 1 << 20


def scans(code: dict[str, tuple[int, int]], data: dict[str, tuple[int, int]]) -> tuple[Scan, Scan]:
    return (Scan(Path("/jobs"), {r: Path("/jobs", r) for r in code}, code),
            Scan(Path("/d"), {r: Path("/d", r) for r in data}, data))


def three_nodes(storage: list[list[str]] | None = None) -> Plan:
    inv = Inventory(Path("/inv.toml"), tuple(Host(f"n{i}", f"10.0.0.1{i}") for i in (1, 2, 3)))
    return make_plan(inv, job(data=Path("/d")), "j-1", master_addr="10.0.0.11",
                     homes={f"n{i}": "/root" for i in (1, 2, 3)}, storage=storage)


CODE = {"train.py": (1000, 100)}
DATA = {"a.bin": (12 * MiB, 100), "b.bin": (8 * MiB, 100), "labels.txt": (4000, 100)}


def test_the_listing_creates_nothing_and_says_which_directory_is_absent(tmp_path: Path) -> None:
    there = tmp_path / "code dir"
    (there / "sub").mkdir(parents=True)
    (there / "sub" / "x.py").write_text("print()\n")
    (there / ".big.bin.fleet-part").write_bytes(b"\0" * 10)
    gone = tmp_path / "data" / "d-1"
    script = preview.listing_script([str(there), str(gone)])
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    code, data = preview.parse_listing(r.stdout, 2)
    assert code is not None and set(code) == {"sub/x.py", ".big.bin.fleet-part"}
    assert code["sub/x.py"][0] == 8
    assert data is None
    assert not (tmp_path / "data").exists()


def test_the_listing_parser_takes_only_what_follows_its_markers() -> None:
    out = ("motd noise\tsize\t1\n#dir 1 absent\nstray\t1\t2\n#dir 0\nf.py\t12\t1700000000.5\n"
           "broken line\n#dir 7\nno\t1\t1\n#dir 0 gone\n")
    code, data = preview.parse_listing(out, 2)
    # "#dir 7" names no directory asked: a line of the listing it is in, like any other
    assert code == {"f.py": (12, 1700000000_500000000), "no": (1, 1_000000000)}
    assert data is None
    assert preview.parse_listing("", 1) == [None]  # a directory never named is not there


def test_a_dir_move_counts_partial_files_and_older_copies_apart() -> None:
    there = {"a.bin": (12 * MiB, 99), ".b.bin.fleet-part": (MiB, 5), "labels.txt": (4000, 100)}
    d = preview.dir_move("data", DATA, there)
    assert d.differ == ("a.bin", "b.bin") and d.bytes == 20 * MiB
    assert (d.partial, d.older, d.unchanged, d.present) == (1, 1, 1, True)
    absent = preview.dir_move("data", DATA, None)
    assert absent.present is False and absent.held == 0 and len(absent.differ) == 3


def test_how_sent_follows_the_upload_rule() -> None:
    big = preview.dir_move("data", DATA, {})
    small = preview.dir_move("code", CODE, {})
    resume = preview.dir_move("code", CODE, {".train.py.fleet-part": (10, 1)})
    same = preview.dir_move("code", CODE, CODE)
    assert preview.how_sent((big,)) is H.STREAM
    assert preview.how_sent((small,)) is H.BUNDLE
    assert preview.how_sent((resume,)) is H.STREAM  # a partial file is resumed
    assert preview.how_sent((same,)) is H.NOTHING


def test_a_first_sync_to_two_nodes_is_relayed_and_a_sharer_gets_nothing() -> None:
    plan = three_nodes([["n1"], ["n2", "n3"]])
    code, data = scans(CODE, DATA)
    p = preview.preview(plan, code, data, {"n1": [None, None], "n2": [None, None]}, ("n1",))
    assert p.nodes is not None and p.route is not None
    assert [(n.host, n.how, n.shares) for n in p.nodes] == [
        ("n1", H.STREAM, None), ("n2", H.STREAM, None), ("n3", H.SHARED, "n2")]
    assert p.route.kind is preview.RouteKind.RELAY and p.route.chain == ("n1", "n2")
    assert p.route.uplink == 20 * MiB + 1000 + 4000  # once, not once per node
    text = "\n".join(preview.lines(p))
    assert "data: 4 file(s), 20.0 MiB to sync (code 1 file(s), 1000 bytes; data 3 file(s)" in text
    assert "  n1: 20.0 MiB to stream" in text
    assert "data: 3 file(s) differ (a.bin, b.bin, labels.txt), 20.0 MiB; 0 unchanged (no data " \
           "directory there yet)" in text
    assert "  n3: shares n2's storage: nothing sent" in text
    assert ("route: this machine -> n1 -> n2 (each byte once over this machine's uplink; nodes "
            "pass it on over TCP, on an ephemeral port, authenticated per run; a node the one "
            "before cannot reach is fed from here directly)") in text
    assert "note: n1: no workdir there yet" in text
    assert preview.synced(plan) == {
        "n1": [("code", plan.nodes[0].code_dir), ("data", plan.nodes[0].data_dir)],
        "n2": [("code", plan.nodes[1].code_dir), ("data", plan.nodes[1].data_dir)]}


def test_one_streamed_node_is_fed_directly_and_small_changes_go_in_bundles() -> None:
    plan = three_nodes()
    code, data = scans(CODE, DATA)
    touched = {**DATA, "a.bin": (12 * MiB, 200)}
    p = preview.preview(plan, code, data, {
        "n1": [CODE, touched], "n2": [{}, DATA], "n3": "RemoteCommandError: no"})
    assert p.nodes is not None and p.route is not None
    assert [n.how for n in p.nodes] == [H.STREAM, H.BUNDLE, H.UNLISTED]
    text = "\n".join(preview.lines(p))
    assert "  n1: at most 12.0 MiB to stream" in text
    assert ("data: 1 file(s) differ (a.bin), 12.0 MiB; 1 with an older copy there: compared "
            "block by block, only the blocks that differ move") in text
    assert "  n2: 1000 bytes in its one bundle" in text
    assert "  n3: could not be listed: RemoteCommandError: no" in text
    assert "route: this machine -> n1; n2: in one bundle per node" in text
    only_small = preview.preview(plan, code, data, {n: [{}, DATA] for n in ("n1", "n2", "n3")})
    assert only_small.route is not None and only_small.route.kind is preview.RouteKind.BUNDLE
    assert preview.route_line(only_small.route) == \
        "route: in one bundle per node (2.9 KiB in all)"
    same = preview.preview(plan, code, data, {n: [CODE, DATA] for n in ("n1", "n2", "n3")})
    words = preview.lines(same)
    assert "  n1: 0 bytes: nothing to send" in words
    assert words[-1].startswith("route: nothing moves")


def test_without_a_probe_only_the_local_side_and_json_says_the_same() -> None:
    plan = three_nodes()
    code, data = scans(CODE, DATA)
    p = preview.preview(plan, code, data)
    assert preview.lines(p) == ["data: 4 file(s), 20.0 MiB to sync (code 1 file(s), 1000 "
                                "bytes; data 3 file(s), 20.0 MiB); what moves is known with "
                                "--probe"]
    assert preview.as_json(p) == {
        "local": [{"dir": "code", "files": 1, "bytes": 1000},
                  {"dir": "data", "files": 3, "bytes": 20 * MiB + 4000}],
        "probed": False, "nodes": None, "route": None}
    probed = preview.as_json(preview.preview(plan, code, data, {
        "n1": [None, None], "n2": [CODE, DATA], "n3": [CODE, {}]}))
    nodes = probed["nodes"]
    assert isinstance(nodes, list)
    assert [(n["host"], n["how"], n["bytes_at_most"]) for n in nodes] == [
        ("n1", "stream", 20 * MiB + 5000), ("n2", "nothing", 0), ("n3", "stream", 20 * MiB + 4000)]
    assert nodes[0]["dirs"][1] == {"dir": "data", "present": False, "differ": 3,
                                   "files": ["a.bin", "b.bin", "labels.txt"],
                                   "bytes": 20 * MiB + 4000, "partial": 0, "older": 0,
                                   "unchanged": 0}
    assert probed["route"] == {"kind": "relay", "chain": ["n1", "n3"], "bundle": [],
                               "uplink_bytes_at_most": 20 * MiB + 5000}
