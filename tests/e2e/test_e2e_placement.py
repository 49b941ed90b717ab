"""A job that asks for part of the lab (`nodes`, `gpus_per_node`), end to end on two real sshd
hosts of four stand-in GPUs each (tests/fake_nvidia_smi.py) with a colleague, alice: on node1
her process holds GPU 0 and her lease GPU 1. A `nodes = 1, gpus_per_node = 2` job runs on
node1's GPUs 2 and 3 (CUDA_VISIBLE_DEVICES as its ranks see it) and gives its run lease back
(its end, Ctrl-C); two such runs started at once (detached) take disjoint GPUs under their run
leases, and a third job shares a host with one of them on the GPUs left; `fleet stop` takes a
run's lease away; a job that asks more than is free is refused with every host's word and
nothing left anywhere, and `--wait` starts once a run's lease went with its end."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_gpus import Lines
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0}
SHOW = ("import os, sys, time\n"
        "print('on', os.uname().nodename, 'CVD', os.environ.get('CUDA_VISIBLE_DEVICES'),\n"
        "      os.environ.get('CUDA_DEVICE_ORDER'), flush=True)\n"
        "time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)\n")


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(2, colleagues=("alice",)) as bed:
        pid = bed.start_as("node1", "alice", "sleep", "900")
        bed.fake_gpus("node1", {"gpus": [H100] * 4,
                                "apps": [{"gpu": 0, "pid": pid, "used_mib": 18432}]})
        bed.fake_gpus("node2", {"gpus": [H100] * 4, "apps": []})
        yield bed


@pytest.fixture(scope="module")
def alices_lease(tb: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """alice's lease of node1's GPU 1, for the whole module."""
    d = tmp_path_factory.mktemp("alice")
    cli = CLI(d)
    hers = tb.inventory(d / "alice.toml", user="alice")
    took = cli("reserve", "node1:1", "-i", str(hers), "--for", "2h", "--note", "hers")
    assert took.returncode == 0, took.stderr
    yield
    cli("release", "node1", "-i", str(hers))


def job(tmp_path: Path, name: str, port: int, nodes: int, gpus: int, nap: float = 0) -> Path:
    (tmp_path / "show.py").write_text(SHOW)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'inventory = "inv.toml"\nscript = "show.py"\nargs = ["{nap}"]\n'
                    f"nodes = {nodes}\ngpus_per_node = {gpus}\n[rendezvous]\nport = {port}\n")
    return path


def run_leases(tb: Testbed) -> dict[str, list[dict[str, object]]]:
    """Per host the run leases in its lease directory, as this machine sees it."""
    out: dict[str, list[dict[str, object]]] = {}
    for h in ("node1", "node2"):
        d = tb.dir / f"vartmp-{h}" / "fleet-leases"
        found = [json.loads(p.read_text()) for p in d.glob("*.lease")] if d.is_dir() else []
        out[h] = [x for x in found if x.get("run")]
    return out


def wait_gone(tb: Testbed, run_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while any(x["run"] == run_id for xs in run_leases(tb).values() for x in xs):
        assert time.monotonic() < deadline, f"run lease of {run_id} still there: {run_leases(tb)}"
        time.sleep(0.5)


def test_a_placed_job_runs_on_the_free_gpus_and_gives_its_lease_back(
        cli: CLI, tb: Testbed, tmp_path: Path, alices_lease: None) -> None:
    tb.inventory(tmp_path / "inv.toml")
    path = job(tmp_path, "two", 29741, nodes=1, gpus=2)
    plan = cli("plan", str(path))
    assert plan.returncode == 0, plan.stderr
    assert "the hosts and GPUs are chosen at launch: fleet up takes 1 host with 2 free GPUs" \
        in plan.stdout, plan.stdout
    r = cli("up", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 host with 2 free GPUs, chosen now among 2 host(s)" in r.stderr, r.stderr
    assert re.search(r"node1 .*chosen, GPUs 2,3 \(run lease taken\)", r.stderr), r.stderr
    # Both ranks (nproc_per_node = gpus_per_node) see the chosen GPUs, in nvidia-smi's order.
    for rank in (0, 1):
        assert f"node1 r{rank} | on node1 CVD 2,3 PCI_BUS_ID" in r.stdout, r.stdout
    assert "node2" not in r.stdout, r.stdout
    status = cli("status", run_id_of(r.stderr), "--json")
    assert [n["host"] for n in json.loads(status.stdout)["nodes"]] == ["node1"], status.stdout
    assert run_leases(tb) == {"node1": [], "node2": []}
    assert_nothing_left(tb, run_id_of(r.stderr))
    # Interrupted while it runs: the teardown gives its run lease back too.
    p = cli.popen("up", str(job(tmp_path, "long", 29746, nodes=1, gpus=2, nap=120)))
    err = Lines(p)
    try:
        err.wait(r"started master", timeout=60)
        [taken] = run_leases(tb)["node1"]
        assert taken["gpus"] == [2, 3], taken
        p.send_signal(signal.SIGINT)
        out = err.finish(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    err.thread.join(timeout=10)
    assert p.returncode == 130, out + err.text()
    assert run_leases(tb) == {"node1": [], "node2": []}, err.text()
    assert_nothing_left(tb, str(taken["run"]))


def test_two_placed_runs_at_once_take_disjoint_gpus_and_their_leases_go_with_them(
        cli: CLI, tb: Testbed, tmp_path: Path, alices_lease: None) -> None:
    tb.inventory(tmp_path / "inv.toml")
    first = job(tmp_path, "first", 29742, nodes=1, gpus=2, nap=60)
    second = job(tmp_path, "second", 29743, nodes=1, gpus=2, nap=60)
    ps = [cli.popen("up", "--detach", str(p)) for p in (first, second)]
    said = [(p.communicate(timeout=120), p.returncode) for p in ps]
    ids = []
    for (out, err), code in said:
        assert code == 0, out + err
        ids.append(run_id_of(err))
    try:
        held = run_leases(tb)
        gpus = {(h, g) for h, xs in held.items() for x in xs for g in x["gpus"]}  # type: ignore
        assert gpus == {("node1", 2), ("node1", 3), ("node2", 0), ("node2", 1)}, held
        assert {x["run"] for xs in held.values() for x in xs} == set(ids), held
        shown = cli("gpus", str(tmp_path / "inv.toml"))
        for run_id in ids:
            assert f"leased by root for run {run_id} until" in shown.stdout, shown.stdout
        # Another job shares node2 with the run there, on the GPUs its run lease left free.
        third = cli("up", "--node", "node2", str(job(tmp_path, "third", 29749, nodes=1, gpus=2)))
        assert third.returncode == 0, third.stdout + third.stderr
        assert "node2 r1 | on node2 CVD 2,3 PCI_BUS_ID" in third.stdout, third.stdout
        # A detached run stopped: its run lease goes with it.
        for run_id in ids:
            stop = cli("stop", run_id)
            assert stop.returncode == 0, stop.stdout + stop.stderr
            wait_gone(tb, run_id)
    finally:
        for run_id in ids:
            cli("stop", run_id)
    for run_id in ids:
        assert_nothing_left(tb, run_id)


def homes(tb: Testbed) -> dict[str, list[str]]:
    return {h.name: sorted(str(p) for p in h.home.rglob("*")) for h in tb.hosts}


def test_not_enough_free_gpus_is_refused_with_nothing_left(
        cli: CLI, tb: Testbed, tmp_path: Path, alices_lease: None) -> None:
    tb.inventory(tmp_path / "inv.toml")
    before = homes(tb)
    r = cli("up", str(job(tmp_path, "big", 29744, nodes=2, gpus=3)))
    assert r.returncode == 6, r.stdout + r.stderr
    assert re.search(r"choosing 2 hosts with 3 free GPUs each \(fleet up --wait waits for them\) "
                     r"failed on 1 host\(s\); nothing was started:\n"
                     r"  node1: 2 free: GPU0: 18432 MiB in use by user alice \(pid \d+\); "
                     r"GPU1: leased by alice\n", r.stderr), r.stderr
    assert "node rank" not in r.stderr and "CVD" not in r.stdout
    assert homes(tb) == before and run_leases(tb) == {"node1": [], "node2": []}
    waited = cli("up", "--wait=3s", str(job(tmp_path, "big", 29744, nodes=2, gpus=3)))
    assert waited.returncode == 6 and "waiting 3 s for 2 hosts with 3 free GPUs each" \
        in waited.stderr, waited.stderr
    assert homes(tb) == before and run_leases(tb) == {"node1": [], "node2": []}
    # More hosts than the inventory has: the job file's key is named.
    more = cli("up", str(job(tmp_path, "more", 29745, nodes=3, gpus=1)))
    assert more.returncode == 2 and "more.toml: nodes: asks for 3 hosts, but the inventory " \
        in more.stderr, more.stderr


def test_wait_starts_once_a_runs_lease_goes_with_it(cli: CLI, tb: Testbed, tmp_path: Path,
                                                     alices_lease: None) -> None:
    tb.inventory(tmp_path / "inv.toml")
    short = cli("up", "--detach", str(job(tmp_path, "short", 29747, nodes=1, gpus=2, nap=8)))
    assert short.returncode == 0, short.stderr
    assert "node1  chosen, GPUs 2,3" in short.stderr, short.stderr
    p = cli.popen("up", "--wait=2m", str(job(tmp_path, "both", 29748, nodes=2, gpus=2)))
    err = Lines(p)
    try:
        err.wait(rf"waiting for 2 hosts with 2 free GPUs each \(at most 2 min\): node1: 0 free: "
                 rf"GPU0: 18432 MiB in use by user alice \(pid \d+\); GPU1: leased by alice; "
                 rf"GPU2: leased by run {run_id_of(short.stderr)} of root; GPU3: leased by run ")
        out = err.finish(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    err.thread.join(timeout=10)
    assert p.returncode == 0, out + err.text()
    assert "node1 r0 | on node1 CVD 2,3 PCI_BUS_ID" in out and \
        "node2 r2 | on node2 CVD 0,1 PCI_BUS_ID" in out, out
    assert run_leases(tb) == {"node1": [], "node2": []}
    assert_nothing_left(tb, run_id_of(short.stderr))
