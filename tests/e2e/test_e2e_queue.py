"""The queue end to end, through the real CLI, on three real sshd hosts with four stand-in GPUs
each (tests/fake_nvidia_smi.py) and a colleague, alice: a sweep of 24 single-GPU runs of
uneven length, queued with `--detach` beside alice's process on one GPU, placed by the runner on
node1 and started by each host's agent while no fleet process runs on this machine. What the
queue did is read from the hosts themselves (the runner's state and the runs' own logs), then
from `fleet sweep status`, `fleet logs` and `fleet ps`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.queue import ideal
from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_up import assert_no_strays
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0}
# Each run sleeps --secs (what it takes), says the GPUs it was given, and a metric at its end.
SLEEPER = """\
import argparse, os, time
p = argparse.ArgumentParser()
p.add_argument("--secs", type=float, required=True)
p.add_argument("--fail", default="no")
a = p.parse_args()
print("gpus", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
time.sleep(a.secs)
if a.fail == "yes":
    raise SystemExit("failing on purpose")
print(f"loss {100.0 / a.secs:.4f}", flush=True)
"""
# 24 uneven lengths from 10 to 40 s
LENGTHS = [10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26, 27, 29, 30, 31, 33, 34, 35, 37,
           38, 39, 40]


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3, colleagues=("alice",)) as bed:
        for h in bed.hosts:
            bed.fake_gpus(h.name, {"gpus": [H100] * 4, "apps": []})
        yield bed


def job(tmp_path: Path, extra: str = "") -> Path:
    """The sleeper as a single-GPU job of its own (`launcher = "command"`: no torchrun, whose
    start, torch imported by 11 runs at once on this machine's 2 cores, would take longer than
    the shortest run; the lab's tests queue torchrun jobs)."""
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    path = tmp_path / "job.toml"
    path.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                    'command = ["{python}", "-u", "{code_dir}/sleeper.py"]\ngpus_per_node = 1\n'
                    '[metrics]\nloss = "loss (?P<v>[0-9.]+)"\n' + extra)
    return path


def state(tb: Testbed, host: str = "node1") -> dict:  # type: ignore[type-arg]
    """The runner's state.json, read on its host (as root: the test's own eyes)."""
    path = tb.host(host).home / "fleet" / "queue" / "state.json"
    r = tb.exec(host, "sh", "-c", f"cat {path} 2>/dev/null || echo '{{}}'")
    return json.loads(r.stdout or "{}")  # type: ignore[no-any-return]


def wait_until(what: str, check: object, timeout: float, every: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(every)


def fleet_processes_here(state_dir: Path) -> list[str]:
    """Processes of this machine (outside the hosts) whose environment names this test's fleet
    state: what a fleet command of this test left running."""
    found = []
    mark = f"FLEET_STATE_DIR={state_dir}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if mark in env:
            found.append(f"{pid} {cmd.decode(errors='replace')}")
    return found


def test_a_sweep_of_24_runs_packs_the_free_gpus_with_the_laptop_gone(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    tb.inventory(tmp_path / "inv.toml")
    path = job(tmp_path)
    # a colleague's process on node2's GPU 3: 11 GPUs are the queue's
    pid = tb.start_as("node2", "alice", "sleep", "900")
    tb.fake_gpus("node2", {"gpus": [H100] * 4, "apps": [{"gpu": 3, "pid": pid, "used_mib": 9000}]})
    try:
        sweep_and_check(cli, tb, path)
        assert tb.alive("node2", pid)  # hers, untouched
    finally:
        tb.kill_in("node2", pid)
        tb.fake_gpus("node2", {"gpus": [H100] * 4, "apps": []})
    assert_no_strays(tb, 60)  # the runner and the agents ended by themselves


def sweep_and_check(cli: CLI, tb: Testbed, path: Path) -> None:
    r = cli("sweep", str(path), "--grid", "secs=" + ",".join(map(str, LENGTHS)),
            "--expect", "{secs}s", "--detach", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "24 runs queued" in r.stdout, r.stdout + r.stderr
    # the laptop side is gone: the command returned and nothing of it runs here
    assert fleet_processes_here(Path(cli.env["FLEET_STATE_DIR"])) == []
    wait_until("all 24 ended", lambda: len([x for x in state(tb).get("runs", {}).values()
                                            if x["state"] == "succeeded"]) == 24, 240)
    runs = state(tb)["runs"]
    assert len(runs) == 24
    # no GPU ran two at once
    by_gpu: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for x in runs.values():
        assert len(x["gpus"]) == 1, x
        by_gpu.setdefault((x["host"], x["gpus"][0]), []).append((x["started"], x["ended"]))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"{gpu} ran two runs at once: {spans}"
    assert len(by_gpu) == 11 and ("node2", 3) not in by_gpu, by_gpu  # never on hers
    lengths = [x["ended"] - x["started"] for x in runs.values()]
    makespan = max(x["ended"] for x in runs.values()) - min(x["started"] for x in runs.values())
    bound = ideal(lengths, 11)  # the best packing of the same lengths, searched (or less)
    gaps = sorted(b[0] - a[1] for spans in by_gpu.values()
                  for a, b in zip(spans, spans[1:], strict=False))
    print(f"makespan {makespan:.1f} s, ideal packing {bound:.1f} s: {makespan / bound:.3f}x; "
          f"a GPU idle between runs {gaps[len(gaps) // 2]:.2f} s (median), {gaps[-1]:.2f} s at "
          f"most")
    assert makespan <= 1.15 * bound, (makespan, bound, sorted(lengths))
    # each run saw the GPU it was given
    status = cli("sweep", "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    rec = json.loads(status.stdout)
    assert len(rec["runs"]) == 24
    for row in rec["runs"]:
        assert row["state"] == "succeeded", row
        secs = float(row["params"]["secs"])
        assert abs(row["metrics"]["loss"] - 100.0 / secs) < 1e-3, row
    text = cli("sweep", "status")
    assert text.returncode == 0, text.stderr
    assert "24 succeeded" in text.stdout, text.stdout
    # each run is a fleet run of its own: its log, its state, in `fleet ps`
    first = rec["runs"][0]
    logs = cli("logs", first["run_id"])
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert f"gpus {first['gpu_ids'][0]}" in logs.stdout, logs.stdout
    assert f"loss {100.0 / float(first['params']['secs']):.4f}" in logs.stdout, logs.stdout
    ps = cli("ps", "--all")
    assert ps.stdout.count(rec["sweep_id"]) == 24, ps.stdout
    assert ps.stdout.count("succeeded") == 24, ps.stdout
