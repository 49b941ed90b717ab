"""Hosts configured the way real labs configure them, end to end through the real CLI: login
shells other than bash, rc files that print on both streams, sshd without SFTP, one home shared
by every node (NFS-like), IPv6-only addressing, a non-root user without /usr/sbin on PATH, and a
full filesystem. On each, a 3-host all_reduce runs with correct ranks, a rank crash leaves
nothing anywhere, and detach / logs / status / stop work; none of the banners leaks into what
fleet prints."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, JOBS, _need_testbed
from tests.e2e.test_e2e_lifetime import long_job, wait_for
from tests.e2e.test_e2e_up import assert_nothing_left, rows, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

BANNER_WORDS = ("Welcome to the lab", "quota:")


@pytest.fixture(scope="module")
def mixed() -> Iterator[Testbed]:
    """bash, fish and tcsh logins, every rc file noisy, one shared home; node1 and node2 run
    Debian's stock external sftp-server (started through the noisy login shell, so it speaks
    garbage), node3 has no SFTP at all."""
    _need_testbed()
    with Testbed(3, shell=["bash", "fish", "tcsh"], noisy=True,  # noqa: S604
                 sftp=["external", "external", "none"], shared_home=True) as tb:
        yield tb


@pytest.fixture(scope="module")
def v6lab() -> Iterator[Testbed]:
    """IPv6 only, a non-root user (no /usr/sbin on PATH), zsh and dash logins, noisy, no SFTP."""
    _need_testbed()
    with Testbed(3, shell=["zsh", "dash", "bash"], noisy=True, sftp=False, ipv6=True,  # noqa: S604
                 user="lab") as tb:
        yield tb


def allreduce_job(tmp_path: Path, port: int) -> Path:
    """jobs/allreduce.py, one process per host: world size 3, all_reduce = 1+2+3."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    shutil.copy(JOBS / "allreduce.py", code / "allreduce.py")
    job = tmp_path / "ar.toml"
    job.write_text(f'inventory = "inv.toml"\nworkdir = "code"\nscript = "allreduce.py"\n'
                   f'nproc_per_node = 1\n[rendezvous]\nport = {port}\n')
    return job


def no_banner(*texts: str) -> None:
    for text in texts:
        for word in BANNER_WORDS:
            assert word not in text, f"an rc file's banner leaked into fleet's output:\n{text}"


def battery(cli: CLI, tb: Testbed, tmp_path: Path, port: int) -> None:
    """up with correct ranks, a crash that leaves nothing, then detach/logs/status/stop."""
    tb.inventory(tmp_path / "inv.toml")
    r = cli("up", str(allreduce_job(tmp_path, port)))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert f"{host} r{rank} | rank {rank}/3 on {host}: all_reduce = 6 ok" in r.stdout, out
    assert_nothing_left(tb, run_id_of(r.stderr))
    no_banner(r.stdout, r.stderr)

    crash = cli("up", str(long_job(tmp_path, port + 1, FAIL_RANK=1, TICK_S=0.2)))
    out = crash.stdout + crash.stderr
    assert crash.returncode == 1, out
    assert "first failure: node2 (node rank 1), rank 1 (local rank 0), exit code 1:" in \
        crash.stderr, out
    assert "RuntimeError: injected failure on rank 1" in crash.stderr, out
    assert_nothing_left(tb, run_id_of(crash.stderr))
    no_banner(crash.stdout, crash.stderr)

    detached = cli("up", "--detach", str(long_job(tmp_path, port + 2, TICK_S=0.2)))
    assert detached.returncode == 0, detached.stdout + detached.stderr
    run_id = run_id_of(detached.stderr)
    wait_for(lambda: "tick 3 of rank 2" in cli("logs", run_id).stdout, 120, "rank 2's ticks")
    logs = cli("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert re.search(rf"^{host} r{rank} \| tick 0 of rank {rank}$", logs.stdout, re.M), \
            logs.stdout
    status = cli("status", run_id)
    assert len(rows(r"running", status.stdout)) == 3, status.stdout
    # Every rank's stack, taken on these hosts too (their shells, their user), run untouched.
    dump = cli("dump", run_id)
    assert dump.returncode == 0, dump.stdout + dump.stderr
    assert sum(int(n) for n in re.findall(r"\((\d+) process\(es\)\)", dump.stdout)) == 3, \
        dump.stdout
    assert re.search(r"long\.py:\d+ in main$", dump.stdout, re.M), dump.stdout
    assert len(rows(r"running", cli("status", run_id).stdout)) == 3
    no_banner(dump.stdout, dump.stderr)
    stop = cli("stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert_nothing_left(tb, run_id, timeout=5)
    status = cli("status", run_id)
    assert len(rows(r"stopped", status.stdout)) == 3, status.stdout
    no_banner(logs.stdout, logs.stderr, status.stdout, status.stderr, stop.stdout, stop.stderr)


def test_fish_tcsh_noisy_no_sftp_shared_home(cli: CLI, mixed: Testbed, tmp_path: Path) -> None:
    battery(cli, mixed, tmp_path, 29561)
    # One home for every node: each node kept a run directory of its own in it.
    runs = mixed.hosts[0].home / "fleet" / "runs"
    for run in runs.iterdir():
        assert sorted(p.name for p in run.iterdir()) == ["node1", "node2", "node3"], run


def test_shared_home_syncs_once_and_check_says_so(cli: CLI, mixed: Testbed,
                                                  tmp_path: Path) -> None:
    inv = mixed.inventory(tmp_path / "inv.toml")
    job = allreduce_job(tmp_path, 29565)
    (tmp_path / "code" / "extra.py").write_text("x = 1\n")
    r = cli("up", str(job))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node1, node2, node3 share one filesystem under their workdir" in r.stderr, r.stderr
    assert re.search(r"node1\s+code: sent 2 file", r.stderr), r.stderr
    assert re.search(r"node2\s+code: shared with node1", r.stderr), r.stderr
    chk = cli("check", "-v", str(job))
    assert chk.returncode == 0, chk.stdout + chk.stderr
    assert re.search(r"^node2\s+storage\s+PASS\s+workdir shared with node1, node3", chk.stdout,
                     re.M), chk.stdout
    # Debian's sftp-server behind a printing rc file: named, with the rc file's fix, no crash.
    for host in ("node1", "node2"):
        assert re.search(rf"^{host}\s+sftp\s+WARN\s+not usable \(the sftp-server's output is "
                         "garbled", chk.stdout, re.M), chk.stdout
    assert re.search(r"^node3\s+sftp\s+WARN\s+not available", chk.stdout, re.M), chk.stdout
    assert re.search(r"^node2\s+rc files\s+WARN\s+the login shell prints 2 line", chk.stdout,
                     re.M), chk.stdout
    assert "[[ $- == *i* ]] || return" in chk.stdout and "status is-interactive" in chk.stdout
    assert "internal error" not in chk.stdout + chk.stderr
    assert re.search(r"^node2\s+ssh\s+PASS\s+.*login shell /usr/bin/fish", chk.stdout, re.M), \
        chk.stdout
    plan = cli("plan", "--probe", str(job), "-i", str(inv))
    assert "shared storage: node1, node2, node3" in plan.stdout, plan.stdout + plan.stderr


def test_ipv6_only_non_root_zsh_dash(cli: CLI, v6lab: Testbed, tmp_path: Path) -> None:
    battery(cli, v6lab, tmp_path, 29571)


def test_ipv6_interfaces_and_check(cli: CLI, v6lab: Testbed, tmp_path: Path) -> None:
    v6lab.inventory(tmp_path / "inv.toml")
    job = allreduce_job(tmp_path, 29575)
    chk = cli("check", "-v", str(job))
    assert chk.returncode == 0, chk.stdout + chk.stderr
    master = v6lab.hosts[0].addr
    assert re.search(rf"^node2\s+reach master\s+PASS\s+TCP to {re.escape(master)}:29575",
                     chk.stdout, re.M), chk.stdout
    assert re.search(r"^node2\s+interface\s+PASS\s+eth0 \(route to the master", chk.stdout,
                     re.M), chk.stdout
    plan = cli("plan", "--probe", "--json", str(job))
    assert plan.returncode == 0, plan.stderr
    assert f'"master_addr": "{master}"' in plan.stdout
    assert '"GLOO_SOCKET_IFNAME": "eth0"' in plan.stdout


def test_full_filesystem_names_host_cause_and_fix(cli: CLI, v6lab: Testbed,
                                                  tmp_path: Path) -> None:
    small = "/srv/fleet-small"
    v6lab.mount_tmpfs("node3", small, "256k")
    # Filled to the last block by something else, as a full scratch disk is.
    v6lab.exec("node3", "sh", "-c", f"cat /dev/zero > {small}/filler 2>/dev/null; true")
    v6lab.inventory(tmp_path / "inv.toml", per_host={"node3": {"workdir": str(small)}})
    job = allreduce_job(tmp_path, 29579)
    r = cli("up", str(job))
    out = r.stdout + r.stderr
    assert r.returncode == 5, out
    assert re.search(rf"node3: cannot write {small}/.* on node3: 0 bytes of [0-9.]+ "
                     rf"(bytes|KiB) arrived; the disk or your quota is full \(0 bytes free on "
                     rf"{small}\)\. Free space there, or set `workdir`", r.stderr), out
    assert "nothing was started" in r.stderr and "started master" not in r.stderr
    for h in v6lab.hosts:
        assert not v6lab.run_processes(h.name, run_id_of(r.stderr))
    runs = v6lab.hosts[0].home / "fleet" / "runs" / run_id_of(r.stderr)
    assert not runs.exists(), "node1 kept a half-prepared run"
    chk = cli("check", str(job))
    assert chk.returncode == 1
    assert re.search(r"^node3\s+write\s+FAIL\s+cannot write", chk.stdout, re.M), chk.stdout


def test_different_torch_is_refused_unless_allowed(cli: CLI, mixed: Testbed,
                                                   tmp_path: Path) -> None:
    """A node whose python reports another torch: `up` refuses, naming both versions."""
    fake = mixed.hosts[0].home / "fakepy"
    fake.mkdir(exist_ok=True)
    site = fake / "site"
    (site / "torch-2.0.0.dist-info").mkdir(parents=True, exist_ok=True)
    (site / "torch-2.0.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.0.0\n")
    wrapper = fake / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    mixed.inventory(tmp_path / "inv.toml", per_host={"node3": {"python": str(wrapper)}})
    job = allreduce_job(tmp_path, 29583)
    r = cli("up", str(job))
    assert r.returncode == 5, r.stdout + r.stderr
    assert re.search(r"node3: torch 2\.0\.0 here, [\w.+]+ on node1", r.stderr), r.stderr
    assert "--allow-version-mismatch" in r.stderr
