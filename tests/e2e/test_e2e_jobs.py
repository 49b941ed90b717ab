"""The MNIST job and every launch style of the seeds, end to end on the testbed (CPU, Gloo)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import CLI, JOBS
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


def losses(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"r0 \| epoch \d+ batch \d+/\d+ loss ([\d.]+)$", stdout,
                                         re.M)]


def accuracy(stdout: str, epoch: int) -> float:
    m = re.search(rf"r0 \| epoch {epoch} done in [\d.]+s: test accuracy ([\d.]+)$", stdout, re.M)
    assert m, stdout
    return float(m.group(1))


def test_mnist_across_two_hosts_learns_resumes_and_syncs_data_once(cli: CLI, tb2: Testbed,
                                                                   tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", str(JOBS / "mnist.toml"), "-i", str(inv), timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "training on 4 process(es), cpu" in r.stdout
    seen = losses(r.stdout)
    assert len(seen) >= 3 and seen[-1] < seen[0] / 3, seen  # falling loss
    assert accuracy(r.stdout, 0) > 0.8  # chance is 0.1
    assert re.search(r"node2  data: sent 4 file\(s\)", r.stderr), r.stderr
    # A second run: the data moves no more, and --resume continues from the checkpoint.
    again = cli("up", str(JOBS / "mnist.toml"), "-i", str(inv), "--", "--epochs", "2",
                "--resume", timeout=400)
    assert again.returncode == 0, again.stdout + again.stderr
    for node in ("node1", "node2"):
        assert re.search(rf"{node}  data: sent 0 file\(s\), 0 bytes \(4 unchanged", again.stderr)
    assert re.search(r"r0 \| resumed from checkpoints/mnist.pt \(epoch 0 done", again.stdout)
    assert "epoch 0 batch" not in again.stdout
    assert accuracy(again.stdout, 1) > 0.8
    assert_nothing_left(tb2, run_id_of(again.stderr))


def test_mnist_on_the_default_local_inventory(cli: CLI, tmp_path: Path) -> None:
    """The README's first command."""
    cli.env["HOME"] = str(tmp_path)
    r = cli("up", str(JOBS / "mnist.toml"), timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert accuracy(r.stdout, 0) > 0.8
    assert r.stdout.rstrip().endswith("local r0 | done")


def copy_job(tmp_path: Path, script: str, toml: str) -> Path:
    shutil.copy(JOBS / script, tmp_path / script) if (JOBS / script).exists() else None
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\n' + toml)
    return job


def test_command_launcher_for_scripts_that_spawn_their_own_workers(cli: CLI, tb2: Testbed,
                                                                   tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", str(JOBS / "spawn_style.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(4):
        host = "node1" if rank < 2 else "node2"
        assert f"{host} | spawned rank {rank}/4 on {host}: sum = 10 ok" in r.stdout, r.stdout
    assert_nothing_left(tb2, run_id_of(r.stderr))
