"""The bulk of the data through OpenSSH's `ssh` on real sshd hosts: the head of the relay fed by
the binary (its command line logged by a wrapper on PATH), the data verified on both hosts;
and a binary that cannot log in, where fleet's own connection carries the stream instead."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_data import assert_clean, assert_same, job, make_data
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


def wrapper(tmp_path: Path, body: str) -> Path:
    """An `ssh` first on PATH that logs each command line (one argument a line) to ssh.N.log,
    then runs `body`."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    ssh = bin_ / "ssh"
    ssh.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/ssh.$$.log\n{body}\n")
    ssh.chmod(0o755)
    return bin_


def logged(tmp_path: Path) -> list[list[str]]:
    return [p.read_text().splitlines() for p in sorted(tmp_path.glob("ssh.*.log"))]


def test_the_head_of_the_relay_is_fed_through_ssh_with_fleets_trust(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    real = shutil.which("ssh")
    if real is None:
        pytest.skip("no OpenSSH client here")
    body = f'exec {real} "$@"'
    cli.env["PATH"] = f"{wrapper(tmp_path, body)}:{cli.env['PATH']}"
    tb2.inventory(tmp_path / "inv.toml", workdir="~/fleet-ossh-a")
    make_data(tmp_path / "data", [40, 30])  # past openssh.BULK_MIN
    r = cli("up", str(job(tmp_path, 29861)), timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "this machine -> node1 -> node2" in r.stderr, out
    runs = logged(tmp_path)
    assert len(runs) == 1, runs  # the head only: node2 is fed by node1
    args = runs[0]
    assert args[-2:] == [tb2.host("node1").addr, "/bin/sh -s"], args
    assert args[:2] == ["-F", "/dev/null"], args
    for opt in ("StrictHostKeyChecking=yes", "BatchMode=yes", "GlobalKnownHostsFile=/dev/null"):
        assert opt in args, (opt, args)
    known = next(a for a in args if a.startswith("UserKnownHostsFile="))
    assert known.endswith(f" {tb2.known_hosts}"), known
    assert_same(tb2, tmp_path / "data", ["node1", "node2"], "~/fleet-ossh-a")
    assert_clean(tb2)


def test_a_binary_that_cannot_log_in_leaves_the_stream_to_fleets_connection(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    body = "echo 'Host key verification failed.' >&2; exit 255"
    cli.env["PATH"] = f"{wrapper(tmp_path, body)}:{cli.env['PATH']}"
    tb2.inventory(tmp_path / "inv.toml", hosts=["node1"], workdir="~/fleet-ossh-b")
    make_data(tmp_path / "data", [66])
    r = cli("up", str(job(tmp_path, 29862)), timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert len(logged(tmp_path)) == 1, out  # tried once, then fleet's own connection
    assert_same(tb2, tmp_path / "data", ["node1"], "~/fleet-ossh-b")
    assert_clean(tb2)
