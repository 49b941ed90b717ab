"""`fleet up` end to end: the real CLI, real sshd hosts in network namespaces, real torchrun."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import CLI, JOBS
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


def run_id_of(stderr: str) -> str:
    m = re.search(r"run (\S+): ", stderr)
    assert m, stderr
    return m.group(1)


def assert_nothing_left(tb: Testbed, run_id: str, timeout: float = 20) -> None:
    """No process of the run on any host, as seen from the hosts themselves."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: tb.run_processes(h.name, run_id) for h in tb.hosts}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"processes of {run_id} still alive: {left}"
        time.sleep(0.5)


def rows(state: str, status: str) -> list[str]:
    """`fleet status` rows in that state (`node rank 1 (ranks 2-3)  running`); `state` is a
    regex."""
    return re.findall(rf"node rank \d+ \(ranks? [\d-]+\)  {state}", status)


def assert_no_strays(tb: Testbed, timeout: float = 5) -> None:
    """No process of fleet's (nor anything else) on any host but its init and sshd: nothing
    left after a launch that failed before it started (a preflight listener would live 20 s)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: tb.stray_processes(h.name) for h in tb.hosts}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"left on the hosts: {left}"
        time.sleep(0.2)


def test_allreduce_across_two_hosts(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    # Every rank's correct result, tagged by the host it ran on (the node's own hostname too).
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"{host} r{rank} | rank {rank}/4 on {host}: all_reduce = 10 ok" in r.stdout, \
            r.stdout
    # No interface settings anywhere, though each host's name resolves to 127.0.1.1: fleet
    # detected the interface (the seeds' `Gloo connectFullMesh failed ... 127.0.x.x`).
    assert "interface eth0" in r.stderr
    # Master first: node2's launcher starts only once node1's has (its torchrun then waits
    # for the master's store by itself).
    assert r.stderr.index("node1  started master") < r.stderr.index("node2  started")
    run_id = run_id_of(r.stderr)
    assert_nothing_left(tb2, run_id)
    # The run is recorded locally and on every node.
    assert (cli.cwd / ".fleet" / "runs" / run_id / "run.json").is_file()
    for h in tb2.hosts:
        run_dir = h.home / "fleet" / "runs" / run_id / h.name
        assert (run_dir / "exit_code").read_text().strip() == "0"
        assert (run_dir / "env.sh").stat().st_mode & 0o777 == 0o600


def test_allreduce_on_default_local_inventory(cli: CLI, tmp_path: Path) -> None:
    cli.env["HOME"] = str(tmp_path)
    r = cli("up", str(JOBS / "allreduce.toml"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^local r0 \| rank 0/2 on .*: all_reduce = 3 ok$", r.stdout, re.M)
    assert re.search(r"^local r1 \| rank 1/2 on .*: all_reduce = 3 ok$", r.stdout, re.M)


def failing_job(tmp_path: Path, body: str) -> Path:
    (tmp_path / "fail.py").write_text(body)
    job = tmp_path / "fail.toml"
    job.write_text('inventory = "inv.toml"\nscript = "fail.py"\nnproc_per_node = 2\n'
                   '[rendezvous]\nport = 29511\n')
    return job


def test_failing_script_exits_non_zero_and_leaves_nothing(cli: CLI, tb2: Testbed,
                                                          tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = failing_job(tmp_path, "import os, sys, time\n"
                      "if os.environ['RANK'] == '2':\n"
                      "    sys.exit('boom from rank 2')\n"
                      "time.sleep(300)\n"
                      "print('slept to the end', flush=True)\n")
    r = cli("up", str(job), timeout=100)  # a hang guard, a third of the ranks' sleep
    assert r.returncode == 1, r.stdout + r.stderr
    assert "slept to the end" not in r.stdout, "the failure did not stop the sleeping ranks"
    assert "node2 r2 | boom from rank 2" in r.stdout
    assert "node2 (node rank 1) failed" in r.stderr
    assert_nothing_left(tb2, run_id_of(r.stderr))


def test_unreachable_host_stops_the_launch_before_anything_starts(cli: CLI, tb2: Testbed,
                                                                  tmp_path: Path) -> None:
    inv = tb2.inventory(tmp_path / "inv.toml")
    # node2's address on a port where nothing listens: refused, whatever the order.
    inv.write_text(inv.read_text().replace(f'address = "{tb2.hosts[1].addr}"',
                                           f'address = "{tb2.hosts[1].addr}"\nport = 2222'))
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 3, r.stdout + r.stderr
    assert re.search(r"node2: cannot connect to .*:2222", r.stderr), r.stderr
    assert "nothing was started" in r.stderr
    run_dir = tb2.hosts[0].home / "fleet" / "runs" / run_id_of(r.stderr)
    assert not run_dir.exists(), "node1 was prepared although node2 was unreachable"


def test_unknown_host_key_is_refused(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inv = tb2.inventory(tmp_path / "inv.toml", hosts=["node1"], known_hosts=str(empty))
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 3
    assert re.search(rf"node1: unknown host key for {tb2.hosts[0].addr} \(ssh-ed25519 SHA256:",
                     r.stderr), r.stderr
    assert "nothing was started" in r.stderr


def test_changed_host_key_is_refused_loudly(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    other = tb2.hosts[1].host_key_pub  # node2's key, claimed for node1's address
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{tb2.hosts[0].addr} ssh-ed25519 {other}\n")
    inv = tb2.inventory(tmp_path / "inv.toml", hosts=["node1"], known_hosts=str(wrong))
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 3
    assert f"node1: HOST KEY CHANGED for {tb2.hosts[0].addr}" in r.stderr, r.stderr


def test_known_failure_is_explained(cli: CLI, tmp_path: Path) -> None:
    """A failing run's log is matched against the known signatures, with a hint to fix it."""
    cli.env["HOME"] = str(tmp_path)
    (tmp_path / "inv.toml").write_text('[[hosts]]\nname = "local"\naddress = "localhost"\n')
    job = failing_job(tmp_path, "import fleet_no_such_module_xyz\n")
    r = cli("up", str(job))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first failure: local (node rank 0), rank " in r.stderr, r.stderr
    assert "ModuleNotFoundError: No module named 'fleet_no_such_module_xyz'" in r.stderr
    assert re.search(r"fleet: hint: .*python", r.stderr), r.stderr
