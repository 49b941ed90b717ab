"""Every launcher really distributes, and nodes may differ, end to end through the real CLI:
accelerate's own test script as one 4-process run over 2 hosts, c10d lines tagged with their
true global ranks, a legacy script that parses --local_rank only, a 2-host run with 2
processes on one node and 1 on the other (chosen by GPU indices), and a `command` job running
torchrun itself whose failure summary shows the traceback."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def shared2() -> Iterator[Testbed]:
    """Two hosts with one home (accelerate's test script assumes shared storage)."""
    _need_testbed()
    with Testbed(2, shared_home=True) as tb:
        yield tb


def job_file(tmp_path: Path, toml: str, script: tuple[str, str] | None = None) -> Path:
    if script:
        (tmp_path / script[0]).write_text(script[1])
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\n' + toml)
    return job


def failure_summary(r: subprocess.CompletedProcess[str], head: str) -> str:
    """The summary of a failed run, from its first line, which matches `head`."""
    assert r.returncode == 1, r.stdout + r.stderr
    summary = r.stderr[r.stderr.index("first failure:"):]
    assert re.match("first failure: " + head, summary), summary
    return summary


def accelerate_job(tmp_path: Path, script: str, nproc: int, port: int) -> Path:
    """One of accelerate's own test scripts, run from the installed package."""
    return job_file(tmp_path, f'launcher = "accelerate"\nnproc_per_node = {nproc}\n'
                    f'module = "accelerate.test_utils.scripts.{script}"\n'
                    f"[rendezvous]\nport = {port}\n")


def states(stdout: str) -> list[tuple[str, int, str, int, int]]:
    """(host, tag rank, distributed type, processes, process index) as accelerate reports them
    (test_script prints its state from every process), read from each tag's own lines."""
    by_tag: dict[tuple[str, int], list[str]] = {}
    for host, rank, text in re.findall(r"^(node\d) r(\d) \| (.*)$", stdout, re.M):
        by_tag.setdefault((host, int(rank)), []).append(text)
    out = []
    for (host, rank), lines in by_tag.items():
        # In order, though a warning on the same process's stderr may come between them.
        m = re.search(r"^Distributed environment: (\S+).*?^Num processes: (\d+)$.*?"
                      r"^Process index: (\d+)$", "\n".join(lines), re.M | re.S)
        if m:
            out.append((host, rank, m.group(1), int(m.group(2)), int(m.group(3))))
    return out


def test_accelerate_runs_its_own_test_scripts_distributed(cli: CLI, shared2: Testbed,
                                                          tmp_path: Path) -> None:
    shared2.inventory(tmp_path / "inv.toml")
    # 2 hosts x 2 processes: accelerate reports one MULTI_CPU run of 4, each its own index...
    r = cli("up", str(accelerate_job(tmp_path, "test_script", 2, 29541)), timeout=400)
    assert sorted(states(r.stdout)) == [
        ("node1", 0, "DistributedType.MULTI_CPU", 4, 0),
        ("node1", 1, "DistributedType.MULTI_CPU", 4, 1),
        ("node2", 2, "DistributedType.MULTI_CPU", 4, 2),
        ("node2", 3, "DistributedType.MULTI_CPU", 4, 3)], r.stdout + r.stderr
    # ...and test_script, written for 2 processes (its tensor split expects one row each),
    # fails on rank 2 or 3 with an empty share, which only one run of 4 can give; fleet's
    # summary names it with accelerate's traceback.
    summary = failure_summary(r, r"node2 \(node rank 1\), rank [23] \(local rank [01]\)")
    assert "test_split_between_processes_tensor" in summary
    assert "torch.Size([0, 4]) != torch.Size([1, 4])" in summary
    assert_nothing_left(shared2, run_id_of(r.stderr))
    # 2 hosts x 1 process, the size it was written for: the whole self-test passes.
    r = cli("up", str(accelerate_job(tmp_path, "test_script", 1, 29547)), timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(states(r.stdout)) == [("node1", 0, "DistributedType.MULTI_CPU", 2, 0),
                                        ("node2", 1, "DistributedType.MULTI_CPU", 2, 1)], r.stdout
    assert "**Test reinstantiated state**" in r.stdout
    # 2 hosts x 2 processes with test_sync, which any size passes: its distributed no_sync
    # tests run (a lone process would run the NOOP ones), from local rank 0 of each node.
    r = cli("up", str(accelerate_job(tmp_path, "test_sync", 2, 29548)), timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    header = r"^(node\d r\d) \| \*\*Test Distributed `no_sync` context manager\*\*$"
    assert sorted(re.findall(header, r.stdout, re.M)) == ["node1 r0", "node2 r2"], r.stdout
    assert "NOOP" not in r.stdout
    assert_nothing_left(shared2, run_id_of(r.stderr))


RANKS = '''
import os, socket
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} local {os.environ['LOCAL_RANK']} on "
      f"{socket.gethostname()} gpus={os.environ.get('CUDA_VISIBLE_DEVICES', '-')}: "
      f"{t.item():g}", flush=True)
dist.destroy_process_group()
'''


def rank_lines(stdout: str) -> list[tuple[str, int, int, int, str, str]]:
    """(tag host, tag rank, rank, world, host, gpus) of every line the script printed."""
    return [(h, int(tr), int(r), int(w), host, gpus) for h, tr, r, w, host, gpus in re.findall(
        r"^(node\d) r(\d+) \| rank (\d+)/(\d+) local \d on (node\d) gpus=(\S+): \d+$",
        stdout, re.M)]


def test_c10d_lines_carry_their_true_global_ranks(cli: CLI, tb2: Testbed,
                                                  tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = job_file(tmp_path, 'script = "ranks.py"\nnproc_per_node = 2\n'
                   '[rendezvous]\nbackend = "c10d"\nport = 29542\n', ("ranks.py", RANKS))
    r = cli("up", str(job))
    assert r.returncode == 0, r.stdout + r.stderr
    seen = rank_lines(r.stdout)
    assert sorted(rank for _, rank, *_ in seen) == [0, 1, 2, 3], r.stdout
    for tag_host, tag_rank, rank, world, host, _ in seen:
        assert (tag_host, tag_rank, world) == (host, rank, 4)  # the tag is the truth
    assert " l0 | " not in r.stdout and " l1 | " not in r.stdout
    assert "node_rank is only used for static" not in r.stdout + r.stderr  # none passed
    run_id = run_id_of(r.stderr)
    # fleet logs --rank N: that rank's line, wherever c10d put it.
    for rank in (1, 2):
        one = cli("logs", run_id, "--rank", str(rank))
        assert one.returncode == 0, one.stdout + one.stderr
        assert [x[1] for x in rank_lines(one.stdout)] == [rank], one.stdout
    none = cli("logs", run_id, "--rank", "9")
    assert none.returncode == 2 and "no log line of global rank 9" in none.stderr


LEGACY_UNDERSCORE = '''
import argparse, socket
import torch, torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int, required=True)  # the pre-2.0 spelling only
p.add_argument("--tag")
a = p.parse_args()
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"legacy local_rank {a.local_rank} rank {dist.get_rank()} tag {a.tag} on "
      f"{socket.gethostname()}: {t.item():g}", flush=True)
dist.destroy_process_group()
'''


@pytest.mark.parametrize("flag, port", [("--local_rank", 29543), ("--local-rank", 29544)])
def test_legacy_scripts_get_the_local_rank_spelt_their_way(cli: CLI, tb2: Testbed,
                                                           tmp_path: Path, flag: str,
                                                           port: int) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    script = LEGACY_UNDERSCORE.replace('"--local_rank"', f'"{flag}"')
    job = job_file(tmp_path, f'script = "legacy.py"\nlauncher = "legacy"\n'
                   f'local_rank_flag = "{flag}"\nnproc_per_node = 2\nargs = ["--tag", "x"]\n'
                   f"[rendezvous]\nport = {port}\n", ("legacy.py", script))
    r = cli("up", str(job))
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(4):
        host = "node1" if rank < 2 else "node2"
        assert f"{host} r{rank} | legacy local_rank {rank % 2} rank {rank} tag x on {host}: 4" \
            in r.stdout, r.stdout


def test_nodes_of_different_sizes_one_chosen_by_gpu_indices(cli: CLI, tb2: Testbed,
                                                            tmp_path: Path) -> None:
    """node1 runs 2 processes (gpus = "0-1": this testbed has no GPU, which fleet warns about),
    node2 runs 1: world size 3, all_reduce 3, tags and ranks agree."""
    inv = tb2.inventory(tmp_path / "inv.toml", per_host={"node1": {"gpus": "0-1"}})
    job = job_file(tmp_path, 'script = "ranks.py"\n[rendezvous]\nport = 29545\n',
                   ("ranks.py", RANKS))
    r = cli("up", str(job))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(rank_lines(r.stdout)) == [
        ("node1", 0, 0, 3, "node1", "0,1"), ("node1", 1, 1, 3, "node1", "0,1"),
        ("node2", 2, 2, 3, "node2", "-")], r.stdout
    assert re.search(r"node1  warning: gpus = 0,1, but nvidia-smi is not on this node's PATH",
                     r.stderr), r.stderr
    plan = cli("plan", str(job))
    assert "processes: 2 on GPU(s) 0,1, ranks 0-1 of world size 3" in plan.stdout, plan.stdout
    assert "processes: 1, rank 2 of world size 3" in plan.stdout
    check = cli("check", str(job))
    assert re.search(r"node1\s+chosen gpus\s+WARN\s+gpus = 0,1: nvidia-smi is not on this "
                     r"node's PATH", check.stdout), check.stdout
    assert "chosen gpus" not in "".join(line for line in check.stdout.splitlines()
                                        if line.startswith("node2"))
    # A GPU index that is not a list or a range: named with the file and key, nothing started.
    inv.write_text(inv.read_text().replace('gpus = "0-1"', 'gpus = "0-x"'))
    bad = cli("up", str(job))
    assert bad.returncode == 2 and f"{inv}: hosts[0].gpus: '0-x' is not" in bad.stderr


CRASH = '''
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("joined", flush=True)
if dist.get_rank() == 3:
    raise ValueError("batch 17 has no labels")
time.sleep(120)  # the others wait (no collective: rank 3 alone fails) until fleet stops them
'''


def test_command_job_running_torchrun_itself_fails_with_its_traceback(cli: CLI, tb2: Testbed,
                                                                      tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = job_file(tmp_path, 'launcher = "command"\ncommand = ["{python}", "-m", '
                   '"torch.distributed.run", "--nnodes", "{nnodes}", "--node-rank", '
                   '"{node_rank}", "--nproc-per-node", "2", "--master-addr", "{master_addr}", '
                   '"--master-port", "{master_port}", "--tee", "3", "crash.py"]\n'
                   "nproc_per_node = 2\n[rendezvous]\nport = 29546\n", ("crash.py", CRASH))
    r = cli("up", str(job))
    summary = failure_summary(r, r"node2 \(node rank 1\), rank 3 \(local rank 1\), exit code 1:")
    assert "Traceback (most recent call last):" in summary
    assert "ValueError: batch 17 has no labels" in summary
    # Its workers' lines carry global ranks, though fleet did not start torchrun itself.
    assert re.search(r"^node2 r3 \| joined$", r.stdout, re.M), r.stdout
    assert "stopped as a consequence: node1" in r.stderr
    assert_nothing_left(tb2, run_id_of(r.stderr))


# nvidia-smi as a node with two GPUs answers: GPU 1 holds another user's memory (pid 4242,
# not visible from the node: another container's).
FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index*) printf '%s\\n' '0, GPU-aaa, 10, 81559, 0, Fake H100' \\
                                      '1, GPU-bbb, 30000, 81559, 97, Fake H100' ;;
  *--query-compute-apps=gpu_uuid*) printf 'GPU-bbb, 4242, 29990\\n' ;;
  *--query-compute-apps*) printf '4242, python, 29990 MiB\\n' ;;
  *--query-gpu=driver_version*) printf '570.86\\n570.86\\n' ;;
esac
"""


def test_chosen_gpus_that_do_not_exist_stop_the_launch_and_busy_ones_are_named(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    """Busy ones refuse the launch unless --force. node2 lists GPUs 0-1 (a fake nvidia-smi on
    its PATH only; it stays there for the rest of this module, which is why this test comes
    last)."""
    tb2.put_on_path("node2", "nvidia-smi", FAKE_SMI)
    inv = tb2.inventory(tmp_path / "inv.toml", per_host={"node2": {"gpus": "0,2"}})
    job = job_file(tmp_path, 'script = "ranks.py"\n[rendezvous]\nport = 29549\n',
                   ("ranks.py", RANKS))
    r = cli("up", str(job))
    assert r.returncode == 5, r.stdout + r.stderr  # a node not ready for the job
    assert ("choosing GPUs failed on 1 host(s); nothing was started:\n  node2: gpus = 0,2 in "
            "the inventory, but GPU(s) 2 do not exist here (this node has GPUs 0-1)") \
        in r.stderr, r.stderr
    assert "started master" not in r.stderr
    # GPU 1 alone: it exists, and the node says whose memory is on it: refused, unless forced.
    inv.write_text(inv.read_text().replace('gpus = "0,2"', 'gpus = "1"'))
    r = cli("up", str(job))
    assert r.returncode == 6, r.stdout + r.stderr  # busy
    assert ("node2: GPU1: 29990 MiB in use by a process not visible here (pid 4242) (wait for "
            "it (fleet up --wait) or start anyway (--force))") in r.stderr, r.stderr
    assert "started master" not in r.stderr
    r = cli("up", "--force", str(job))
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("--force: starting although node2 GPU1: 29990 MiB in use by a process not visible "
            "here (pid 4242)") in r.stderr, r.stderr
    assert re.search(r"^node2 r1 \| rank 1/2 local 0 on node2 gpus=1: 2$", r.stdout, re.M)
    check = cli("check", str(job))
    assert re.search(r"node2\s+chosen gpus\s+WARN\s+gpus = 1: GPU 1 has 29990 MiB in use by "
                     r"a process not visible here \(pid 4242\)", check.stdout), check.stdout
    assert "fleet up refuses them" in check.stdout, check.stdout
    assert_nothing_left(tb2, run_id_of(r.stderr))
