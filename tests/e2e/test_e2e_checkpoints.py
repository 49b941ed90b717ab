"""Checkpoints that survive their host, end to end on hosts that share nothing: a torchrun job
saves on global rank 0 only, every epoch, into ckpt/; fleet copies each settled file to the
other node and the spare while the run goes on; the master's host is killed (sshd too); the
spare takes its place and every rank resumes from the checkpoint fleet copied before the loss,
and the run succeeds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_heal import LIMIT_S, attempt_ids, finish, jobdir, no_traceback, start
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Each rank resumes from the newest file in its own node's ckpt/ (no shared storage), and says
# so; ranks that would resume from different epochs fail the run (as a real job would diverge).
JOB = '''import os, socket, time
from pathlib import Path
import torch, torch.distributed as dist

ATTEMPT = int(os.environ["FLEET_ATTEMPT"])
dist.init_process_group("gloo")
rank, host = dist.get_rank(), socket.gethostname()
ckpt = Path("ckpt")
ckpt.mkdir(exist_ok=True)
saved = sorted(ckpt.glob("epoch=*.ckpt"), key=lambda p: int(p.stem.split("=")[1]))
start = torch.load(saved[-1])["epoch"] + 1 if saved else 0
starts = [torch.tensor([0]) for _ in range(dist.get_world_size())]
dist.all_gather(starts, torch.tensor([start]))
if len({int(s.item()) for s in starts}) != 1:
    raise SystemExit(f"rank {rank}: the ranks would resume from {[int(s) for s in starts]}")
if start:
    print(f"rank {rank} attempt {ATTEMPT} on {host} resumed at epoch {start}", flush=True)
last = 40 if ATTEMPT == 1 else start + 3
for epoch in range(start, last):
    print(f"rank {rank} attempt {ATTEMPT} on {host} epoch {epoch}", flush=True)
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        tmp = ckpt / "next.tmp"
        torch.save({"epoch": epoch, "weights": torch.zeros(1 << 18)}, tmp)
        tmp.rename(ckpt / f"epoch={epoch}.ckpt")
        for old in sorted(ckpt.glob("epoch=*.ckpt"),
                          key=lambda p: int(p.stem.split("=")[1]))[:-10]:
            old.unlink()
    time.sleep(1.0)
print(f"rank {rank} attempt {ATTEMPT} on {host} finished", flush=True)
dist.destroy_process_group()
'''

COPIED = re.compile(r"^fleet: checkpoint epoch=(\d+)\.ckpt \(1\.0 MiB\) from node1 to "
                    r"node2, node3, \d+\.\d s$", re.M)


def test_the_spare_resumes_from_the_checkpoint_copied_before_the_master_was_lost(
        cli: CLI, tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(3) as tb:
        d = jobdir(tmp_path)
        tb.inventory(d / "inv.toml", per_host={"node3": {"spare": True}})
        (d / "ckpt_job.py").write_text(JOB)
        job = d / "ckpt.toml"
        job.write_text('inventory = "inv.toml"\nscript = "ckpt_job.py"\nnproc_per_node = 1\n'
                       '[rendezvous]\nport = 29931\n[watchdog]\nunreachable_after = 4\n'
                       '[restart]\nmax = 1\nbackoff = 1\ncheckpoints = "ckpt/"\n')
        proc, out_path, err_path = start(cli, job, tmp_path)

        def copied() -> bool:
            return any(int(e) >= 3 for e in COPIED.findall(err_path.read_text()))
        try:
            wait_for(copied, 150, "fleet to copy node1's checkpoint of epoch 3 or later")
            before = max(int(e) for e in COPIED.findall(err_path.read_text()))
            tb.kill_host("node1")
            finish(proc, LIMIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        err, out = err_path.read_text(), out_path.read_text()
        run_id = run_id_of(err)
        assert proc.returncode == 0, out + err
        assert attempt_ids(cli, run_id) == [run_id, f"{run_id}-a2"], err
        no_traceback(err)
        assert "fleet: restart: node1 replaced by spare node3 (node1 was lost)\n" in err, err
        # Warm: the spare and node2 hold the newest checkpoint already, nothing moves.
        said = re.search(r"^fleet: checkpoint epoch=(\d+)\.ckpt \(1\.0 MiB\) is on every node "
                         r"already$", err, re.M)
        assert said and int(said.group(1)) >= before, err
        resumed = {int(e) for e in re.findall(
            r"^node[23] r\d \| rank \d attempt 2 on node[23] resumed at epoch (\d+)$", out, re.M)}
        assert resumed == {int(said.group(1)) + 1}, out
        assert min(resumed) >= 3, out
        assert re.search(r"^node3 r0 \| rank 0 attempt 2 on node3 finished$", out, re.M), out
        # What fleet saw is recorded here: the newest file it saw settle, and who held it.
        kept = (cli.cwd / ".fleet" / "runs" / run_id / "checkpoints.json").read_text()
        assert f'"rel": "ckpt/epoch={said.group(1)}.ckpt"' in kept, kept
        # The job keeps its newest ten: fleet pruned its copies of the older ones on node2.
        held = sorted(int(p.stem.split("=")[1]) for p in
                      (tb.dir / "home2").rglob("ckpt/epoch=*.ckpt"))
        assert held and len(held) <= 11 and min(held) >= int(said.group(1)) - 10, held
