"""Self-configuring network and `fleet check`, end to end on hosts built to mislead."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, JOBS, _need_testbed
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tricky() -> Iterator[Testbed]:
    """Two hosts whose real interfaces have different names, each with a docker0-like decoy
    created first, and whose hostnames resolve to 127.0.1.1 (as Debian's installer writes)."""
    _need_testbed()
    with Testbed(2, ifaces=["ens3", "enp0s8"], decoy=True) as tb:
        yield tb


def row(stdout: str, host: str, check: str) -> str:
    m = re.search(rf"^{host}\s+{check}\s+(PASS|WARN|FAIL)\s+(.*)$", stdout, re.M)
    assert m, f"no {check} row for {host}:\n{stdout}"
    return f"{m.group(1)} {m.group(2)}"


def test_gloo_job_runs_with_no_interface_settings(cli: CLI, tricky: Testbed,
                                                  tmp_path: Path) -> None:
    for h in tricky.hosts:  # the trap is real: a decoy listed first, loopback hostname
        out = tricky.exec(h.name, "ip", "-o", "-4", "addr", "show").stdout
        assert out.index("docker0") < out.index(h.iface)
    inv = tricky.inventory(tmp_path / "inv.toml")
    assert "interface" not in inv.read_text() and "IFNAME" not in inv.read_text()
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node1  node rank 0, interface ens3 (holds the master address" in r.stderr
    assert "node2  node rank 1, interface enp0s8 (route to the master" in r.stderr
    assert r.stdout.count("all_reduce = 10 ok") == 4, r.stdout
    planned = cli("plan", "--probe", "--json", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert planned.returncode == 0, planned.stderr
    nodes = json.loads(planned.stdout)["nodes"]
    assert [(n["interface"], n["env"]["NCCL_SOCKET_IFNAME"]) for n in nodes] == \
        [("ens3", "=ens3"), ("enp0s8", "=enp0s8")]
    assert nodes[1]["master_addr"] == tricky.hosts[0].addr


def test_check_passes_on_a_healthy_testbed(cli: CLI, tricky: Testbed, tmp_path: Path) -> None:
    inv = tricky.inventory(tmp_path / "inv.toml")
    r = cli("check", "-v", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^0 failed, \d+ warning\(s\), \d+ passed$", r.stdout, re.M), r.stdout
    assert row(r.stdout, "node2", "reach master").startswith("PASS")
    assert row(r.stdout, "node2", "torch").startswith("PASS")
    # The loopback hostname is worth a warning, with the fix.
    assert row(r.stdout, "node1", "hostname").startswith("WARN node1 resolves to 127.0.1.1")


def test_check_collective_prints_bandwidth(cli: CLI, tricky: Testbed, tmp_path: Path) -> None:
    inv = tricky.inventory(tmp_path / "inv.toml")
    r = cli("check", "--collective", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all_reduce over 4 ranks (gloo)" in r.stdout
    sizes = re.findall(r"r0 \|\s+(\d+ [KM]iB)\s+[\d.]+ms\s+([\d.]+) GB/s\s+([\d.]+) GB/s",
                       r.stdout)
    assert [s for s, _, _ in sizes] == ["1 KiB", "64 KiB", "1 MiB", "8 MiB", "32 MiB"], r.stdout
    assert all(float(bus) > 0 for _, _, bus in sizes[1:])


def test_check_names_a_host_with_another_torch(cli: CLI, tricky: Testbed, tmp_path: Path) -> None:
    fake = tricky.hosts[1].home / "fake"  # where node2 sees it: hosts have /tmp of their own
    (fake / "torch").mkdir(parents=True, exist_ok=True)
    (fake / "torch" / "__init__.py").write_text('__version__ = "1.0.0+fake"\n')
    py = tricky.hosts[1].home / "fakepython"
    py.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    py.chmod(0o755)
    inv = tricky.inventory(tmp_path / "inv.toml")
    inv.write_text(inv.read_text() + f'python = "{py}"\n')  # for the last host, node2
    r = cli("check", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 1, r.stdout + r.stderr
    assert row(r.stdout, "node2", "torch").startswith("FAIL 1.0.0+fake here, 2.14.1")
    assert "fix: install the same torch version on every node" in r.stdout


def test_firewalled_master_port_fails_check_and_up(cli: CLI, tricky: Testbed,
                                                   tmp_path: Path) -> None:
    inv = tricky.inventory(tmp_path / "inv.toml")
    rule = ["INPUT", "-p", "tcp", "--dport", "29500", "-j", "REJECT"]
    add = tricky.exec("node1", "iptables", "-A", *rule)
    assert add.returncode == 0, add.stderr
    try:
        r = cli("check", str(JOBS / "allreduce.toml"), "-i", str(inv))
        assert r.returncode == 1, r.stdout + r.stderr
        assert row(r.stdout, "node2", "reach master").startswith(
            "FAIL cannot open TCP to the master")
        assert "a firewall on the master or between the hosts blocks port 29500" in r.stdout
        up = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
        assert up.returncode == 5, up.stdout + up.stderr  # reached, but not ready
        assert "preflight (skip with --skip-checks) failed" in up.stderr
        assert re.search(r"node2: cannot open TCP to the master .*:29500", up.stderr)
        assert "started master" not in up.stderr and "nothing was started" in up.stderr
    finally:
        tricky.exec("node1", "iptables", "-D", *rule)


def test_check_names_a_host_whose_sshd_is_down(cli: CLI, tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(2) as tb:
        inv = tb.inventory(tmp_path / "inv.toml")
        tb.kill_sshd("node2")
        r = cli("check", "-v", str(JOBS / "allreduce.toml"), "-i", str(inv))
        assert r.returncode == 1, r.stdout + r.stderr
        assert row(r.stdout, "node2", "ssh").startswith("FAIL cannot connect to")
        assert "fix: check that sshd runs on" in r.stdout
        assert row(r.stdout, "node1", "ssh").startswith("PASS")


def test_connections_send_small_packets_at_once(tricky: Testbed, tmp_path: Path) -> None:
    """Every command is a few small SSH packets: with Nagle's algorithm left on, each round trip
    waited for the server's delayed ACK (48 ms a `true` here). fleet turns it off."""
    import socket

    from fleet.config.inventory import load_inventory
    from fleet.transport import open_transport
    from fleet.transport.ssh import SSHTransport

    host = load_inventory(tricky.inventory(tmp_path / "inv.toml")).hosts[0]
    with open_transport(host) as t:
        assert isinstance(t, SSHTransport)
        sock = t._transport().sock
        assert isinstance(sock, socket.socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert t.run("echo ok").out.strip() == "ok"
