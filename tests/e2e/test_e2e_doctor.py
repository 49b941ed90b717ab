"""`fleet doctor` end to end, through the real CLI on four real sshd hosts of this module's own
testbed, damaged one way at a time and mended after: one host's link shaped to 50 Mbit/s both
ways (tc tbf on its veth and its interface) is named and no other; a clean testbed names
nothing (exit 0); a host whose stand-in nvidia-smi reports uncorrected ECC errors is named.
After each, nothing of fleet's is left running on any host, and no port is left listening
but sshd's (the sinks are ended by PID)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_up import assert_no_strays
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0}


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(4) as bed:
        yield bed


def no_listeners(tb: Testbed, timeout: float = 5) -> None:
    """No TCP port listening on any host but sshd's, as the preflight's own checks look."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: [line for line in tb.exec(h.name, "ss", "-Hltnp").stdout.splitlines()
                         if "sshd" not in line] for h in tb.hosts}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"ports left listening: {left}"
        time.sleep(0.2)


def doctor(tb: Testbed, cli: CLI, tmp_path: Path) -> tuple[int, dict[str, object], str]:
    inv = tb.inventory(tmp_path / "inv.toml")
    r = cli("doctor", str(inv), "--quick", "--json", timeout=240)
    assert r.stdout.strip(), r.stderr
    assert_no_strays(tb)
    no_listeners(tb)
    return r.returncode, json.loads(r.stdout), r.stderr


def test_shaped_host_is_named_and_no_other(tb: Testbed, cli: CLI, tmp_path: Path) -> None:
    """As a person reads it: the line that names node3, and the summary that names no other."""
    inv = tb.inventory(tmp_path / "inv.toml")
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
    code, out, err = doctor(tb, cli, tmp_path)
    assert out["findings"] == [] and out["unreached"] == {}, (out, err)
    assert code == 0
    assert len(out["links"]) == 6 and all(x["bits_per_s"] for x in out["links"])  # type: ignore
    hosts = out["hosts"]
    assert isinstance(hosts, dict) and sorted(hosts) == ["node1", "node2", "node3", "node4"]
    assert all(h["disk_write_bytes_per_s"] and h["cores"] for h in hosts.values())


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
