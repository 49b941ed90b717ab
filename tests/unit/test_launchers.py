"""Launchers and nodes as they are, the pure parts: per-host process counts and GPUs, rank
bases, every launcher's command line, the node-side shim and sitecustomize, nvidia-smi's
output, rank tags learnt at launch, and a traceback found in any launcher's log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import nodeside
from fleet.config.inventory import Host, Inventory, load_inventory
from fleet.config.job import Job, Launcher, Rendezvous, RendezvousBackend, load_job
from fleet.config.procs import Procs
from fleet.errors import ConfigError
from fleet.facts import run_state
from fleet.facts.failure import log_traceback, parse_report
from fleet.facts.gpus import absent, busy, parse_gpus
from fleet.plan import make_plan
from fleet.render import NODESIDE
from fleet.run.logs import Tagger
from tests.unit.test_config import job_file, write


def plan_of(hosts: list[Host], **kw: object):  # type: ignore[no-untyped-def]
    base = dict(path=Path("/jobs/j.toml"), name="j", inventory=Path("/inv.toml"),
                workdir=Path("/jobs"), script="train.py", nproc_per_node=1)
    gpus = kw.pop("has_gpus", None)
    base.update(kw)
    return make_plan(Inventory(Path("/inv.toml"), tuple(hosts)), Job(**base),  # type: ignore
                     "j-1", master_addr="10.0.0.1", has_gpus=gpus)  # type: ignore[arg-type]


def arg(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---- per-host process counts and GPUs ------------------------------------------------------
def test_nodes_of_different_sizes_get_prefix_sum_rank_bases_and_one_world_size() -> None:
    p = plan_of([Host("a", "10.0.0.1", nproc_per_node=2), Host("b", "10.0.0.2"),
                 Host("c", "10.0.0.3", gpus=(4, 5, 6))], nproc_per_node=1)
    assert [n.nproc for n in p.nodes] == [2, 1, 3]
    assert [n.rank_base for n in p.nodes] == [0, 2, 3]
    assert {n.world_size for n in p.nodes} == {6}
    assert [arg(n.argv, "--nproc-per-node") for n in p.nodes] == ["2", "1", "3"]
    c = p.nodes[2].env
    assert c["CUDA_VISIBLE_DEVICES"] == "4,5,6" and c["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_VISIBLE_DEVICES" not in p.nodes[0].env


def test_a_hosts_own_count_wins_over_its_gpus() -> None:
    p = plan_of([Host("a", "10.0.0.1", nproc_per_node=1, gpus=(0, 1))])
    assert p.nodes[0].nproc == 1


def test_command_launcher_placeholders_per_node() -> None:
    p = plan_of([Host("a", "10.0.0.1", nproc_per_node=2), Host("b", "10.0.0.2")],
                launcher=Launcher.COMMAND, script=None,
                command=("{python}", "x.py", "{nproc_per_node}", "{first_rank}", "{world_size}"))
    assert [n.argv[2:] for n in p.nodes] == [("2", "0", "3"), ("1", "2", "3")]


def test_c10d_passes_no_node_rank_and_ranks_are_learnt_at_launch() -> None:
    p = plan_of([Host("a", "10.0.0.1"), Host("b", "10.0.0.2")], nproc_per_node=2,
                rendezvous=Rendezvous(RendezvousBackend.C10D, 29400, 60))
    for n in p.nodes:
        assert "--node-rank" not in n.argv and n.rank_base is None
    assert any("RANK" in note for note in p.notes)


def test_a_word_count_leaves_ranks_to_launch() -> None:
    p = plan_of([Host("a", "10.0.0.1"), Host("b", "10.0.0.2", nproc_per_node=Procs.GPU)])
    assert [n.rank_base for n in p.nodes] == [None, None] and p.nodes[0].world_size is None


@pytest.mark.parametrize("value, gpus", [('"4-7"', (4, 5, 6, 7)), ("[0, 1]", (0, 1)),
                                         ('"0,2,5-6"', (0, 2, 5, 6)), ('"3"', (3,))])
def test_inventory_gpus(tmp_path: Path, value: str, gpus: tuple[int, ...]) -> None:
    inv = load_inventory(write(tmp_path, "inv.toml", f'[[hosts]]\nname = "a"\naddress = "x"\n'
                                                     f"gpus = {value}\n"))
    assert inv.hosts[0].gpus == gpus


@pytest.mark.parametrize("line, key, message", [
    ("gpus = 2", "hosts[0].gpus", "a list of GPU indices"),
    ('gpus = "7-4"', "hosts[0].gpus", "runs backwards"),
    ('gpus = "a-b"', "hosts[0].gpus", "a list of GPU indices"),
    ("gpus = [0, 0]", "hosts[0].gpus", "twice"),
    ("gpus = []", "hosts[0].gpus", "at least one"),
    ("gpus = [-1]", "hosts[0].gpus", "0 or more"),
    ("nproc_per_node = 0", "hosts[0].nproc_per_node", "at least 1"),
    ('nproc_per_node = "many"', "hosts[0].nproc_per_node", "positive integer or one of"),
])
def test_inventory_gpu_and_count_errors_name_the_key(tmp_path: Path, line: str, key: str,
                                                     message: str) -> None:
    path = write(tmp_path, "inv.toml", f'[[hosts]]\nname = "a"\naddress = "x"\n{line}\n')
    with pytest.raises(ConfigError) as e:
        load_inventory(path)
    assert e.value.key == key and message in str(e.value) and str(path) in str(e.value)


# ---- accelerate ----------------------------------------------------------------------------
def test_accelerate_refuses_nodes_of_different_sizes_or_kinds() -> None:
    hosts = [Host("a", "10.0.0.1", nproc_per_node=2), Host("b", "10.0.0.2")]
    with pytest.raises(ConfigError, match="same number of processes.*a 2, b 1"):
        plan_of(hosts, launcher=Launcher.ACCELERATE)
    with pytest.raises(ConfigError, match="a have GPUs and b have none"):
        plan_of([Host("a", "10.0.0.1"), Host("b", "10.0.0.2")], launcher=Launcher.ACCELERATE,
                has_gpus={"a": True, "b": False})
    with pytest.raises(ConfigError, match="static rendezvous"):
        plan_of([Host("a", "10.0.0.1")], launcher=Launcher.ACCELERATE,
                rendezvous=Rendezvous(RendezvousBackend.C10D, 29400, 60))


def test_accelerate_runs_a_module_and_takes_launcher_args_last() -> None:
    p = plan_of([Host("a", "10.0.0.1"), Host("b", "10.0.0.2")], launcher=Launcher.ACCELERATE,
                script=None, module="pkg.train", nproc_per_node=2,
                launcher_args=("--mixed_precision", "bf16"), has_gpus={"a": True, "b": True})
    argv = p.nodes[1].argv
    assert argv[-4:] == ("--mixed_precision", "bf16", "--module", "pkg.train")
    assert arg(argv, "--num_processes") == "4" and arg(argv, "--machine_rank") == "1"
    assert argv.index("--mixed_precision") < argv.index("--mixed_precision", argv.index(
        "--mixed_precision") + 1)  # fleet's default first, the job's wins


# ---- job files -----------------------------------------------------------------------------
def test_two_job_files_of_one_name_never_share_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = job_file(tmp_path / "a"), job_file(tmp_path / "b")
    ja, jb = load_job(one), load_job(two)
    assert ja.name == jb.name == "job"
    assert ja.slot != jb.slot and ja.slot.startswith("job-")
    assert load_job(one).slot == ja.slot  # the next run of one job file finds its directory


@pytest.mark.parametrize("body, key, message", [
    ('module = "pkg.m"\n', "module", "either script or module"),
    ('local_rank_flag = "--local_rank"\n', "local_rank_flag", 'only used with launcher = '),
    ('launcher = "legacy"\nlocal_rank_flag = "-l"\n', "local_rank_flag", "must be one of"),
    ('launcher_args = "--x"\n', "launcher_args", "list of strings"),
])
def test_job_launcher_keys_errors(tmp_path: Path, body: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(job_file(tmp_path, body))
    assert e.value.key == key and message in str(e.value)


def test_a_module_instead_of_a_script(tmp_path: Path) -> None:
    write(tmp_path, "inv.toml", '[[hosts]]\nname = "a"\naddress = "x"\n')
    path = write(tmp_path, "job.toml", 'inventory = "inv.toml"\nmodule = "pkg.train"\n')
    job = load_job(path)
    assert job.module == "pkg.train" and job.script is None
    bad = write(tmp_path, "bad.toml", 'inventory = "inv.toml"\nmodule = "pkg/train.py"\n')
    with pytest.raises(ConfigError, match="not a python module name"):
        load_job(bad)


# ---- node-side files -----------------------------------------------------------------------
SCRIPT = "import sys, os\nprint(sys.argv[1:], os.path.basename(sys.argv[0]))\n"


@pytest.mark.parametrize("flag", ["--local_rank", "--local-rank"])
def test_legacy_shim_passes_the_local_rank_as_the_script_wants(tmp_path: Path,
                                                               flag: str) -> None:
    (tmp_path / "legacy.py").write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(NODESIDE / "fleet_local_rank.py"), flag,
                          str(tmp_path / "legacy.py"), "--lr", "1"], capture_output=True,
                         text=True, env={**os.environ, "LOCAL_RANK": "3"}, check=True)
    assert out.stdout.strip() == f"['{flag}=3', '--lr', '1'] legacy.py"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "m.py").write_text(SCRIPT)
    mod = subprocess.run([sys.executable, str(NODESIDE / "fleet_local_rank.py"), flag, "-m",
                          "pkg.m"], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "LOCAL_RANK": "0"}, check=True)
    assert mod.stdout.strip().startswith(f"['{flag}=0']")


def test_sitecustomize_records_a_workers_rank_and_runs_the_one_it_shadows(
        tmp_path: Path) -> None:
    site, other, run = tmp_path / "site", tmp_path / "other", tmp_path / "run"
    site.mkdir()
    other.mkdir()
    run.mkdir()
    (site / "sitecustomize.py").write_text(nodeside.text("sitecustomize.py") + "\n")
    (other / "sitecustomize.py").write_text("print('the shadowed one ran')\n")
    env = {**os.environ, "PYTHONPATH": f"{site}:{other}", "FLEET_RUN_DIR": str(run),
           "RANK": "5", "LOCAL_RANK": "1"}
    out = subprocess.run([sys.executable, "-c", "print('script')"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["the shadowed one ran", "script"]
    assert (run / "ranks" / "1").read_text() == "5\n"
    agent = {k: v for k, v in env.items() if k not in ("RANK", "LOCAL_RANK")}
    (run / "ranks" / "1").unlink()
    subprocess.run([sys.executable, "-c", "pass"], env=agent, check=True)
    assert not (run / "ranks" / "1").exists()  # not a worker: nothing written


# ---- rank tags learnt at launch ------------------------------------------------------------
def test_parse_ranks() -> None:
    assert run_state.parse_ranks("0 2\n1 3\njunk\n10 x\n") == {0: 2, 1: 3}


def test_tagger_asks_once_per_local_rank_and_falls_back_to_local_tags() -> None:
    asked = []

    def ask() -> dict[int, int]:
        asked.append(1)
        return {0: 4}

    tag = Tagger("node2", None, ask)
    assert tag("[default0]:hi").tag == "node2 r4"
    assert tag("[default0]:again").rank == 4
    assert tag("[default1]:unknown").tag == "node2 l1"
    assert tag("[default1]:still").tag == "node2 l1"
    assert tag("plain").tag == "node2"
    assert len(asked) == 2
    assert Tagger("n", 6, ask)("[default1]:x").tag == "n r7" and len(asked) == 2


# ---- nvidia-smi ----------------------------------------------------------------------------
SMI = """me=alice
now=1795534438
=== leases
=== gpus
0, GPU-aaa, 10, 81559, 0, NVIDIA H100 80GB HBM3
1, GPU-bbb, 30000, 81559, 97, NVIDIA H100 80GB HBM3
2, GPU-ccc, 5000, 81559, [N/A], NVIDIA H100 80GB HBM3
=== rc 0
=== apps
GPU-bbb\t4242\t29990\tbob\t7260\t\tpython train.py --lr 0.1
GPU-ccc\t77\t4990\talice\t12\t20261124-101010-a-ab12\tpython x.py
GPU-aaa\t99\t100\t\t\t\t
"""


def test_parse_gpus_and_what_the_chosen_ones_say() -> None:
    f = parse_gpus(SMI)
    assert f.smi and f.count == 3 and f.me == "alice"
    assert f.gpus[1].used_mib == 30000 and f.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert absent((0, 1), f) is None
    assert "GPU(s) 4, 5 do not exist here (this node has GPUs 0-2)" in (absent((1, 4, 5), f) or "")
    assert busy((1, 2), f) == ["GPU 1 has 29990 MiB in use by user bob (pid 4242)"]
    assert busy((0,), f) == ["GPU 0 has 100 MiB in use by a process not visible here (pid 99)"]
    assert busy((2,), f) == []  # alice's own
    missing = parse_gpus("nvidia-smi=missing\n")
    assert not missing.smi and "not on this node's PATH" in (absent((0,), missing) or "")
    broken = parse_gpus("me=a\n=== gpus\nNVIDIA-SMI has failed because it couldn't communicate "
                        "with the NVIDIA driver.\n=== rc 9\n=== apps\n")
    assert broken.smi and broken.count == 0 and "couldn't communicate" in broken.error
    assert "lists no GPU: NVIDIA-SMI has failed" in (absent((0,), broken) or "")


# ---- a traceback from any launcher's log ---------------------------------------------------
TORCHRUN_LOG = """[default0]:step 1
[default1]:Traceback (most recent call last):
[default1]:  File "/code/train.py", line 9, in <module>
[default0]:step 2
[default1]:    main()
[default1]:ValueError: bad batch
[default1]:later noise
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_10:00:00
  host      : node1
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 123)
"""


def test_summary_traceback_when_the_launcher_keeps_no_error_files_here() -> None:
    """A job that runs torchrun itself (launcher = "command"): the root cause is in node.log,
    its error files are not in fleet's run directory."""
    r = parse_report("=== log\n" + TORCHRUN_LOG, "node1", 0)
    assert r is not None and r.rank == 3 and r.local_rank == 1 and r.exitcode == 1
    assert r.traceback.splitlines() == [
        "Traceback (most recent call last):", '  File "/code/train.py", line 9, in <module>',
        "    main()", "ValueError: bad batch"]


def test_summary_traceback_of_a_plain_script() -> None:
    log = "starting\nTraceback (most recent call last):\n  File \"x.py\", line 1\n" \
          "    f()\nKeyError: 'k'\nbye\n"
    r = parse_report("=== log\n" + log, "node2", 1)
    assert r is not None and r.traceback.endswith("KeyError: 'k'")
    assert log_traceback("no traceback\nlast words\n", None) == "no traceback\nlast words"


# ---- watchdog and debugging env ------------------------------------------------------------
def test_debug_env_wins_and_flight_recorder_env_points_into_the_run_dir() -> None:
    from fleet.config.job import Watchdog
    p = plan_of([Host("a", "10.0.0.1", env={"NCCL_DEBUG": "WARN"})], debug=True,
                watchdog=Watchdog(30.0, nccl_flight_recorder=True))
    env = p.nodes[0].env
    assert env["NCCL_DEBUG"] == "INFO" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert env["TORCH_CPP_LOG_LEVEL"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "~/fleet/runs/j-1/a/nccl_trace_rank_"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "~/fleet/runs/j-1/a/nccl_trace_pipe_"
    plain = plan_of([Host("a", "10.0.0.1")]).nodes[0].env
    assert "NCCL_DEBUG" not in plain and "TORCH_FR_BUFFER_SIZE" not in plain


@pytest.mark.parametrize("body, key, message", [
    ("[watchdog]\nhang_timeout = 0\n", "watchdog.hang_timeout", "positive number"),
    ('[watchdog]\nhang_timeout = "5m"\n', "watchdog.hang_timeout", "must be a number"),
    ("[watchdog]\nhang = 5\n", "watchdog.hang", "unknown key"),
    ("[watchdog]\nnccl_flight_recorder = 1\n", "watchdog.nccl_flight_recorder",
     "true or false"),
    ("[watchdog]\nunreachable_after = 1\n", "watchdog.unreachable_after",
     "at least 4 (fleet asks every node every 2s), not 1"),
    ("[watchdog]\nunreachable_after = inf\n", "watchdog.unreachable_after", "not inf"),
    ("[watchdog]\nunreachable_after = nan\n", "watchdog.unreachable_after", "not nan"),
    ('[watchdog]\nunreachable_after = "30s"\n', "watchdog.unreachable_after",
     "must be a number"),
])
def test_watchdog_errors_name_the_key(tmp_path: Path, body: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(job_file(tmp_path, body))
    assert e.value.key == key and message in str(e.value)


def test_watchdog_settings(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "debug = true\n[watchdog]\nhang_timeout = 300\n"))
    assert job.watchdog.hang_timeout == 300.0 and not job.watchdog.nccl_flight_recorder
    assert job.debug
    assert load_job(job_file(tmp_path)).watchdog.hang_timeout is None  # never, by default
    assert load_job(job_file(tmp_path)).watchdog.unreachable_after == 10.0
    slow = load_job(job_file(tmp_path, "[watchdog]\nunreachable_after = 30\n"))
    assert slow.watchdog.unreachable_after == 30.0
