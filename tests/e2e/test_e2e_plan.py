"""`fleet plan --probe` end to end: what `up` would move, to which node, by which route, said by
the real CLI from real sshd hosts, and nothing written on them to find it out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_data import MB, job, make_data
from tests.e2e.test_e2e_up import assert_no_strays
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

ROUTE = ("route: this machine -> node1 -> node2 (each byte once over this machine's uplink; "
         "nodes pass it on over TCP, on an ephemeral port, authenticated per run; a node the "
         "one before cannot reach is fed from here directly)")


def test_plan_says_what_moves_before_and_after_an_up(cli: CLI, tb2: Testbed,
                                                    tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml", workdir="~/fleet-plan")
    make_data(tmp_path / "data", [12, 8])  # 20 MiB and labels.txt (3890 bytes)
    j = job(tmp_path, 29811)
    total = 20 * MB + 3890 + len("print('hi')\n")

    # Before any up: everything, to both nodes, relayed; nothing made on the nodes to say it
    r = cli("plan", "--probe", str(j))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for host in ("node1", "node2"):
        assert f"  {host}: 20.0 MiB to stream" in r.stdout, out
        assert "    data: 3 file(s) differ (labels.txt, shard0.bin, shard1.bin), 20.0 MiB; " \
               "0 unchanged (no data directory there yet)" in r.stdout, out
    assert ROUTE in r.stdout, out
    assert "this machine sends at most 20.0 MiB" in r.stdout, out
    for h in tb2.hosts:
        assert not (h.home / "fleet-plan").exists(), f"{h.name}: plan --probe made its workdir"
    assert_no_strays(tb2)
    r = cli("plan", "--probe", "--json", str(j))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)["data"]
    assert [(n["host"], n["how"], n["bytes_at_most"]) for n in data["nodes"]] == [
        ("node1", "stream", total), ("node2", "stream", total)]
    assert data["route"] == {"kind": "relay", "chain": ["node1", "node2"], "bundle": [],
                             "uplink_bytes_at_most": total}

    r = cli("up", str(j), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

    # After it: nothing to send
    r = cli("plan", "--probe", str(j))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for host in ("node1", "node2"):
        assert f"  {host}: 0 bytes: nothing to send" in r.stdout, out
    assert "    data: 0 file(s) differ, 0 bytes; 3 unchanged" in r.stdout, out
    assert "route: nothing moves" in r.stdout, out

    # A touched file: compared on the nodes, only the blocks that differ would move
    shard = tmp_path / "data" / "shard0.bin"
    later = shard.stat().st_mtime + 60  # a new time for sure (times compare in whole seconds)
    os.utime(shard, (later, later))
    r = cli("plan", "--probe", str(j))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for host in ("node1", "node2"):
        assert f"  {host}: at most 12.0 MiB to stream" in r.stdout, out
    assert "    data: 1 file(s) differ (shard0.bin), 12.0 MiB; 1 with an older copy there: " \
           "compared block by block, only the blocks that differ move (none where only the " \
           "time changed); 2 unchanged" in r.stdout, out
    assert ROUTE in r.stdout, out
    assert_no_strays(tb2)
