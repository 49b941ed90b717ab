"""The testbed's host profiles, seen with plain OpenSSH (not fleet): each host really is what
tests/testbed.py says it is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from tests.conftest import _need_testbed
from tests.testbed import NOISE_STDERR, NOISE_STDOUT, SSHD, USER_ID, TbHost, Testbed

pytestmark = pytest.mark.e2e

# The login shell's own name: the parent of a child shell (`; true` keeps the login shell from
# exec'ing into it), in a syntax that bash, zsh, dash, fish and tcsh all accept.
WHICH_SHELL = "sh -c 'cat /proc/$PPID/comm'; true"


@pytest.fixture(scope="module")
def lab() -> Iterator[Testbed]:
    """bash and zsh, both noisy, one home for both, internal-sftp on node1, no sftp on node2."""
    _need_testbed()
    with Testbed(2, shell=["bash", "zsh"], noisy=True, sftp=["internal", "none"],  # noqa: S604
                 shared_home=True) as tb:
        yield tb


@pytest.fixture(scope="module")
def lab6() -> Iterator[Testbed]:
    """fish and tcsh, noisy, IPv6-only, logged into as a non-root user."""
    _need_testbed()
    with Testbed(2, shell=["fish", "tcsh"], noisy=True, ipv6=True, user="lab") as tb:  # noqa: S604
        yield tb


def ssh(tb: Testbed, h: TbHost, command: str, timeout: float = 60,
        ) -> subprocess.CompletedProcess[str]:
    cfg = tb.ssh_config(tb.dir / "ssh_config")
    return subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "-o",
                           "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5", h.addr, command],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def quiet(out: str) -> list[str]:
    """Output lines without the noisy hosts' banner."""
    return [x for x in out.splitlines() if x not in (NOISE_STDOUT, NOISE_STDERR)]


@pytest.mark.parametrize("fixture,host,shell,probe", [
    ("lab", 0, "bash", "echo $BASH_VERSION"), ("lab", 1, "zsh", "echo $ZSH_VERSION"),
    ("lab6", 0, "fish", "echo $FISH_VERSION"), ("lab6", 1, "tcsh", "echo $version")])
def test_login_shell_and_noise(request: pytest.FixtureRequest, fixture: str, host: int,
                               shell: str, probe: str) -> None:
    tb: Testbed = request.getfixturevalue(fixture)
    h = tb.hosts[host]
    r = ssh(tb, h, f"{WHICH_SHELL}; {probe}")
    assert r.returncode == 0, r.stderr
    lines = quiet(r.stdout)
    assert lines[0] == shell, r.stdout
    assert re.search(r"\d+\.\d+", lines[1]), r.stdout  # the shell's own version variable
    # The noisy rc file speaks on both streams for a plain command.
    assert r.stdout.splitlines()[0] == NOISE_STDOUT, r.stdout
    assert NOISE_STDERR in r.stderr.splitlines(), r.stderr


def test_dash_login_shell_and_bare_host() -> None:
    """dash reads no rc file for an ssh command: a noisy dash host stays quiet."""
    _need_testbed()
    with Testbed(1, shell="dash", noisy=True) as tb:  # noqa: S604
        r = ssh(tb, tb.hosts[0], f"{WHICH_SHELL}; echo ok")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["dash", "ok"]
        assert NOISE_STDERR not in r.stderr


def test_sftp_subsystem_present_and_absent(lab: Testbed) -> None:
    for h, works in zip(lab.hosts, (True, False), strict=True):
        cfg = lab.ssh_config(lab.dir / "ssh_config")
        r = subprocess.run(["sftp", "-F", str(cfg), "-b", "-", h.addr], input="pwd\n",
                           capture_output=True, text=True, timeout=30)
        assert (r.returncode == 0) is works, r.stdout + r.stderr
        client = paramiko.SSHClient()
        client.load_host_keys(str(lab.known_hosts))
        client.connect(h.addr, username="root", key_filename=str(lab.key), timeout=10,
                       allow_agent=False, look_for_keys=False)
        try:
            if works:
                client.open_sftp().close()
            else:
                with pytest.raises(paramiko.SSHException, match="Channel closed"):
                    client.open_sftp()
        finally:
            client.close()


def test_stock_sshd_config_garbles_sftp_behind_a_noisy_rc_file() -> None:
    """By default a host runs Debian's sshd_config as shipped: PAM, StrictModes, 10 sessions a
    connection, and the external sftp-server, which a printing ~/.bashrc garbles (as on every
    stock Debian host with such an rc file); on a quiet host the same server works."""
    _need_testbed()
    with Testbed(2, noisy=[True, False]) as tb:  # noqa: S604
        h = tb.hosts[0]
        assert h.sshd_config is not None
        seen = subprocess.run([SSHD, "-T", "-f", str(h.sshd_config)], capture_output=True,
                              text=True, timeout=30)
        assert seen.returncode == 0, seen.stderr
        settings = set(seen.stdout.splitlines())
        for stock in ("usepam yes", "strictmodes yes", "maxsessions 10",
                      "maxstartups 10:30:100", "permitrootlogin without-password",
                      "subsystem sftp /usr/lib/openssh/sftp-server"):
            assert stock in settings, stock
        for host, garbled in zip(tb.hosts, (True, False), strict=True):
            client = paramiko.SSHClient()
            client.load_host_keys(str(tb.known_hosts))
            client.connect(host.addr, username="root", key_filename=str(tb.key), timeout=10,
                           allow_agent=False, look_for_keys=False)
            try:
                if garbled:
                    with pytest.raises(paramiko.SFTPError, match="Garbage packet"):
                        client.open_sftp()
                else:
                    client.open_sftp().close()
            finally:
                client.close()


def test_shared_home(lab: Testbed) -> None:
    node1, node2 = lab.hosts
    assert node1.home == node2.home
    r1 = ssh(lab, node1, "echo from-node1 > ~/shared-marker; stat -c %i ~")
    r2 = ssh(lab, node2, "cat ~/shared-marker; stat -c %i ~")
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert quiet(r2.stdout) == ["from-node1", quiet(r1.stdout)[0]]


def test_hosts_have_their_own_processes_and_tmp(lab: Testbed) -> None:
    node1, node2 = lab.hosts
    r = ssh(lab, node1, "nohup sleep 3599.5 >/dev/null 2>&1 </dev/null & "
                        "echo private > /tmp/only-on-node1; ls /proc")
    assert r.returncode == 0, r.stderr
    pids = [p for p in quiet(r.stdout) if p.isdigit()]
    assert "1" in pids and len(pids) < 20, pids  # init, sshd, this session: a fresh machine
    seen = {}
    for h in lab.hosts:
        ps = lab.exec(h.name, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        seen[h.name] = ps.stdout
    assert "sleep 3599.5" in seen["node1"] and "sleep 3599.5" not in seen["node2"]
    assert lab.exec("node1", "cat", "/tmp/only-on-node1").stdout == "private\n"
    assert lab.exec("node2", "test", "-e", "/tmp/only-on-node1").returncode == 1
    assert not Path("/tmp/only-on-node1").exists()
    # The testbed's own directory stays where it is inside every host.
    assert ssh(lab, node2, f"test -f {lab.key}.pub").returncode == 0
    # PID 1 is the host's init, sshd its child.
    assert lab.exec("node1", "cat", "/proc/1/cmdline").stdout.startswith(sys.executable)
    with open(f"/proc/{node1.sshd_pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[1] == str(node1.init_pid)
    lab.exec("node1", "pkill", "-f", "sleep 3599.5")


def test_small_tmpfs_in_one_host(lab: Testbed) -> None:
    node1 = lab.hosts[0]
    small = node1.home / "tiny"
    lab.mount_tmpfs("node1", small, "64k")
    try:
        assert not os.path.ismount(small)  # only inside node1
        r = ssh(lab, node1, f"df -k {small} | tail -1; head -c 200000 /dev/zero > {small}/f")
        assert r.returncode != 0 and "No space left on device" in r.stderr, r.stderr
        assert quiet(r.stdout)[0].split()[1] == "64", r.stdout
        r = ssh(lab, lab.hosts[1], f"df -k {small} | tail -1")  # not on node2
        assert quiet(r.stdout)[0].split()[0] != "tmpfs", r.stdout
    finally:
        lab.umount("node1", small)
    assert lab.exec("node1", "mountpoint", "-q", str(small)).returncode != 0


def test_ipv6_only_host(lab6: Testbed) -> None:
    node1, node2 = lab6.hosts
    assert node1.addr.startswith("fd00:") and node1.addr.endswith("::11")
    assert lab6.known_hosts.read_text().startswith(f"{node1.addr} ssh-ed25519 ")
    r = ssh(lab6, node1, "ip -4 addr show scope global; echo v6:; ip -6 addr show dev eth0; "
                         "getent hosts node2")
    assert r.returncode == 0, r.stderr
    v4, v6 = "\n".join(quiet(r.stdout)).split("v6:\n")
    assert v4.strip() == ""  # no IPv4 but loopback
    assert f"inet6 {node1.addr}/64 scope global" in v6 and "inet6 fe80::" in v6
    assert re.search(rf"^{re.escape(node2.addr)}\s+node2$", v6, re.M), v6
    assert f'address = "{node1.addr}"' in lab6.inventory(lab6.dir / "inv.toml").read_text()


def test_non_root_user(lab6: Testbed) -> None:
    assert 'user = "lab"' in lab6.inventory(lab6.dir / "inv.toml").read_text()
    for h in lab6.hosts:
        r = ssh(lab6, h, f"id -u; env | grep ^PATH=; ls -ld ~ | cut -d' ' -f3; "
                         f"{sys.executable} -c 'import torch, os; print(os.getuid(), "
                         "torch.tensor([2]).item())'", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        uid, path, owner, py = quiet(r.stdout)
        assert uid == str(USER_ID) and owner == "lab"
        assert "/usr/sbin" not in path and "/sbin" not in path.split(":"), path
        assert py == f"{USER_ID} 2"


def test_kill_sshd_then_host() -> None:
    """sshd dies: the host's other processes live on, logins are refused; sshd comes back;
    the host dies: everything on it is gone."""
    _need_testbed()
    with Testbed(1) as tb:
        h = tb.hosts[0]
        r = ssh(tb, h, "nohup sleep 3598.5 >/dev/null 2>&1 </dev/null & echo started")
        assert r.stdout == "started\n", r.stderr

        def sleeping() -> bool:
            return "sleep 3598.5" in tb.exec("node1", "sh", "-c",
                                             "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout

        assert sleeping()
        old = h.sshd_pid
        tb.kill_sshd("node1")
        assert h.sshd_pid == 0 and not Path(f"/proc/{old}").exists()
        assert ssh(tb, h, "true").returncode == 255
        assert sleeping()
        tb.start_sshd("node1")
        assert h.sshd_pid and ssh(tb, h, "echo back").stdout == "back\n"
        init = h.init_pid
        tb.kill_host("node1")
        assert not Path(f"/proc/{init}").exists()
        assert h.proc is not None and h.proc.poll() is not None
        assert tb.pids(h.ns) == []
        assert ssh(tb, h, "true").returncode == 255
