"""`fleet doctor` end to end, through the real CLI on four real sshd hosts of this module's own
testbed, damaged one way at a time and mended after: one host's link shaped to 50 Mbit/s both
ways (tc tbf on its veth and its interface) is named and no other; a clean testbed names
nothing (exit 0); a host whose stand-in nvidia-smi reports uncorrected ECC errors is named;
with `[doctor] before` and `[restart]`, a host the doctor names before a restart gives way to
the spare; interrupted while it measures, it leaves nothing.
After each, nothing of fleet's is left running on any host, and no port is left listening
but sshd's (the sinks are ended by PID)."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_data import listening
from tests.e2e.test_e2e_heal import assert_clean, attempt_ids, no_traceback, start
from tests.e2e.test_e2e_up import assert_no_strays, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0}


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(4) as bed:
        yield bed


def inventory(tb: Testbed, path: Path,
              per_host: dict[str, dict[str, object]] | None = None) -> Path:
    """The testbed's inventory with `[doctor] steal = 1`: the hosts are namespaces of one
    kernel, so the steal each reads is this machine's own, the same on every host (a busy
    hypervisor under CI stole 20% of it once, and every host was named for it). Steal is
    judged in the unit tests; here only the damage each test makes may name a host."""
    tb.inventory(path, per_host=per_host)
    with path.open("a") as f:
        f.write("\n[doctor]\nsteal = 1.0\n")
    return path


def no_listeners(tb: Testbed, timeout: float = 5) -> None:
    """No TCP port listened on, on any host, but sshd's (the hosts' own /proc/net/tcp)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: listening(tb, h.name) for h in tb.hosts}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"ports left listening: {left}"
        time.sleep(0.2)


def doctor(tb: Testbed, cli: CLI, tmp_path: Path, full: bool = False
           ) -> tuple[int, dict[str, object], str]:
    inv = inventory(tb, tmp_path / "inv.toml")
    r = cli("doctor", str(inv), *(() if full else ("--quick",)), "--json", timeout=240)
    assert r.stdout.strip(), r.stderr
    assert_no_strays(tb)
    no_listeners(tb)
    return r.returncode, json.loads(r.stdout), r.stderr


def test_shaped_host_is_named_and_no_other(tb: Testbed, cli: CLI, tmp_path: Path) -> None:
    """As a person reads it: the line that names node3, and the summary that names no other."""
    inv = inventory(tb, tmp_path / "inv.toml")
    tb.shape_host("node3", "50mbit")
    try:
        r = cli("doctor", str(inv), "--quick", timeout=240)
    finally:
        tb.shape_host("node3", None)
    assert_no_strays(tb)
    no_listeners(tb)
    said = r.stdout + r.stderr
    assert re.search(r"^node3: link to node\d [\d.]+ Mbit/s \(median [\d.]+ [GM]bit/s\); node3 "
                     r"is the common end of the 3 slow pairs$", said, re.M), said
    assert re.search(r"4 hosts, 6 links in \d+ rounds \(quick\): 1 host named: node3$", said,
                     re.M), said
    assert not re.search(r"^node[124]: ", said, re.M), said
    assert r.returncode == 5, said


def test_clean_testbed_names_nothing(tb: Testbed, cli: CLI, tmp_path: Path) -> None:
    """The full form: its ring all-reduce too (Gloo, one process a host)."""
    code, out, err = doctor(tb, cli, tmp_path, full=True)
    assert out["findings"] == [] and out["unreached"] == {}, (out, err)
    assert code == 0
    assert len(out["links"]) == 6 and all(x["bits_per_s"] for x in out["links"])  # type: ignore
    hosts = out["hosts"]
    assert isinstance(hosts, dict) and sorted(hosts) == ["node1", "node2", "node3", "node4"]
    assert all(h["disk_write_bytes_per_s"] and h["cores"] for h in hosts.values())
    ring = out["allreduce"]
    assert isinstance(ring, dict) and ring["backend"] == "gloo" and ring["ranks"] == 4, ring
    assert ring["busbw_bytes_per_s"] and ring["error"] is None, ring


def test_host_with_ecc_errors_is_named(tb: Testbed, cli: CLI, tmp_path: Path) -> None:
    for name in ("node1", "node2"):
        tb.fake_gpus(name, {"gpus": [H100, H100], "apps": []})
    tb.fake_gpus("node2", {"gpus": [H100, {**H100, "ecc_uncorrected": 2}], "apps": []})
    try:
        code, out, err = doctor(tb, cli, tmp_path)
    finally:
        tb.fake_gpus("node2", {"gpus": [H100, H100], "apps": []})
    assert out["named"] == ["node2"], (out["findings"], err)
    assert code == 5
    assert [f["line"] for f in out["findings"]] == [  # type: ignore
        "node2: GPU1: 2 uncorrected ECC errors"]


# Every node says which attempt runs where; on attempt 1 node1 fails after a while (the others
# are stopped by the fail-fast), attempt 2 ends well everywhere.
ONCE = '''import os, socket, sys, time
attempt, host = int(os.environ["FLEET_ATTEMPT"]), socket.gethostname()
print(f"attempt {attempt} on {host}", flush=True)
if attempt == 1:
    time.sleep(4 if host == "node1" else 60)
    sys.exit(3)
'''


def test_a_host_the_doctor_names_before_a_restart_gives_way_to_the_spare(
        tb: Testbed, cli: CLI, tmp_path: Path) -> None:
    """`[doctor] before = "quick"`: the hosts pass before attempt 1; node3's link degrades
    while it runs (shaped to 50 Mbit/s once its part printed); node1 fails; before attempt 2
    the doctor names node3, and node4, the spare, takes its place."""
    inventory(tb, tmp_path / "inv.toml", per_host={"node4": {"spare": True}})
    (tmp_path / "once.py").write_text(ONCE)
    job = tmp_path / "once.toml"
    job.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                   'command = ["{python}", "once.py"]\n[rendezvous]\nport = 29961\n'
                   '[restart]\nmax = 1\nbackoff = 0\n[doctor]\nbefore = "quick"\n')
    proc, out, err = start(cli, job, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while "attempt 1 on node3" not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        tb.shape_host("node3", "50mbit")
        assert proc.wait(timeout=240) == 0, out.read_text() + err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        tb.shape_host("node3", None)
    said, printed = err.read_text(), out.read_text()
    run_id = run_id_of(said)
    ids = attempt_ids(cli, run_id)
    assert_clean(tb, ids)
    no_traceback(said)
    assert said.index("fleet doctor: every host and link within bounds") < \
        said.index("[doctor] before attempt 2: fleet doctor --quick")
    assert re.search(r"restart: node3 replaced by spare node4 \(fleet doctor: node3: link to "
                     r"node\d [\d.]+ Mbit/s \(median [\d.]+ [GM]bit/s\); node3 is the common end "
                     r"of the 3 slow pairs\)", said), said
    assert "node4 | attempt 2 on node4" in printed and "attempt 2 on node3" not in printed
    assert ids == [run_id, f"{run_id}-a2"], ids
    data = json.loads((cli.cwd / ".fleet" / "runs" / run_id / "attempts.json").read_text())
    assert [a["replaced"] for a in data["attempts"]] == [{"node3": "node4"}, {}]


def test_interrupted_while_measuring_links_leaves_nothing(tb: Testbed, cli: CLI,
                                                          tmp_path: Path) -> None:
    """Ctrl-C while the link tests run (the full form: 3 s a link): fleet ends every sink by
    its PID on its way out, and the senders end with them; exit 130."""
    inv = inventory(tb, tmp_path / "inv.toml")
    p = cli.popen("doctor", str(inv))
    try:
        deadline = time.monotonic() + 120
        while not any("fleet-doctor-sink" in line for line in tb.stray_processes("node1")):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.1)
        time.sleep(1.0)  # into the first round
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert_no_strays(tb, timeout=15)
    no_listeners(tb)
