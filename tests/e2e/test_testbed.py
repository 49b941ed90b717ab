"""The testbed's host profiles, seen with plain OpenSSH (not fleet): each host really is what
tests/testbed.py says it is."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from tests.conftest import _need_testbed
from tests.testbed import (
    CPU_CGROUP,
    FAKE_SMI_STATE,
    NOISE_STDERR,
    NOISE_STDOUT,
    NOISE_TITLE,
    SSHD,
    USER_ID,
    TbHost,
    Testbed,
    cpu_quota_available,
    rate_bits,
)

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


@pytest.fixture(scope="module")
def lab_c() -> Iterator[Testbed]:
    """A non-root login user and two colleagues on both hosts, one home each per host."""
    _need_testbed()
    with Testbed(2, user="lab", colleagues=("alice", "bob")) as tb:  # noqa: S604
        yield tb


def ssh(tb: Testbed, h: TbHost, command: str, timeout: float = 60, user: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    cfg = tb.ssh_config(tb.dir / "ssh_config")
    where = f"{user}@{h.addr}" if user else h.addr
    return subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", "-o",
                           "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5", where, command],
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def quiet(out: str) -> list[str]:
    """Output lines without the noisy hosts' banner (and the title it sets before them)."""
    return [x for x in NOISE_TITLE.sub("", out).splitlines()
            if x not in (NOISE_STDOUT, NOISE_STDERR)]


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


def cpu_cgroup(tb: Testbed, name: str, pid: int) -> str:
    """The cpu controller's cgroup of host-PID `pid` in host `name`, as /proc says there."""
    lines = tb.exec(name, "cat", f"/proc/{pid}/cgroup").stdout.splitlines()
    return next(x.split(":", 2)[2] for x in lines if "cpu" in x.split(":")[1].split(","))


def test_cpu_quota_holds_every_process_of_one_host(lab: Testbed) -> None:
    """A busy loop started before the host's cgroup was made, and a process started over ssh
    after, are both in it (node2's are not); the quota throttles them (its cpu.stat counts it)
    and is lifted on exit, also after a failure inside; close() removes the cgroup."""
    why = cpu_quota_available()
    if why is not None and os.environ.get("CI"):
        pytest.fail(f"the straggler tests need it, but: {why}")
    elif why is not None:
        pytest.skip(why)
    busy = lab.start_as("node1", "root", "sh", "-c", "while :; do :; done")
    try:
        outside = cpu_cgroup(lab, "node1", busy)
        with lab.cpu_quota("node1", 0.2) as cg:
            assert cg == lab.cpu_cgroup("node1") and cg.parent == CPU_CGROUP / outside.lstrip("/")
            assert (cg / "cpu.cfs_quota_us").read_text() == "20000\n"
            inside = "/" + str(cg.relative_to(CPU_CGROUP))
            r = ssh(lab, lab.hosts[0], "cat /proc/self/cgroup")
            assert f":{inside}\n" in r.stdout, r.stdout  # born in it: sshd's child's child
            assert cpu_cgroup(lab, "node1", busy) == cpu_cgroup(lab, "node1", 1) == inside
            r = ssh(lab, lab.hosts[0], f"cat /sys/fs/cgroup/cpu{inside}/cpu.cfs_quota_us")
            assert quiet(r.stdout) == ["20000"], r.stdout + r.stderr  # seen from the host too
            assert inside not in ssh(lab, lab.hosts[1], "cat /proc/self/cgroup").stdout
            deadline = time.monotonic() + 30
            while "nr_throttled 0\n" in (cg / "cpu.stat").read_text():
                assert time.monotonic() < deadline, (cg / "cpu.stat").read_text()
                time.sleep(0.2)
        assert (cg / "cpu.cfs_quota_us").read_text() == "-1\n"
        with pytest.raises(KeyError), lab.cpu_quota("node1", 0.5):
            assert (cg / "cpu.cfs_quota_us").read_text() == "50000\n"
            raise KeyError("a failure inside")
        assert (cg / "cpu.cfs_quota_us").read_text() == "-1\n"
        assert cpu_cgroup(lab, "node1", busy) == inside
    finally:
        lab.kill_in("node1", busy)


def test_host_cgroups_go_with_the_testbed() -> None:
    _need_testbed()
    if cpu_quota_available() is not None:
        pytest.skip(str(cpu_quota_available()))
    with Testbed(1) as tb:
        cg = tb.cpu_cgroup("node1")
        assert (cg / "cgroup.procs").read_text().split(), "the host's processes moved in"
    assert not cg.exists()


def test_a_host_made_a_machine_keeps_its_cpu_under_load() -> None:
    """cpu_machine: a busy host of a quarter of a CPU gets that quarter while ten busy loops
    outside it, each in a session of its own (the kernel's autogroups weigh each session as
    one, as each other testbed's host is), share this machine's CPUs (by weight alone it would
    get about 2/11 of 2 CPUs: 0.18), and no more; a quota set for a while is lifted back to it,
    and on exit the host shares by weight again; the testbed's machines may not take more than a
    third of this machine's CPUs."""
    _need_testbed()
    if cpu_quota_available() is not None:
        pytest.skip(str(cpu_quota_available()))
    loops: list[subprocess.Popen[bytes]] = []
    with Testbed(1) as tb:
        # started from outside (nsenter): moved into the host's cgroup when it is made
        busy = tb.start_as("node1", "root", "sh", "-c", "while :; do :; done")
        cg = tb.cpu_cgroup("node1")
        try:
            too_much = tb.cpu_machine(["node1"], (os.cpu_count() or 1) / 3 + 0.25)
            with pytest.raises(ValueError, match="a third of this machine's"), too_much:
                pass
            with tb.cpu_machine(["node1"], 0.25):
                assert (cg / "cpu.cfs_quota_us").read_text() == "25000\n"
                assert (cg / "cpu.shares").read_text() == "262144\n"
                loops = [subprocess.Popen(["sh", "-c", "while :; do :; done"],
                                          start_new_session=True) for _ in range(10)]
                time.sleep(1)  # the loops running
                used = []
                for _ in range(2):
                    t0, c0 = time.monotonic(), tb.cpu_seconds("node1")
                    time.sleep(3)
                    used.append((tb.cpu_seconds("node1") - c0) / (time.monotonic() - t0))
                assert all(0.2 <= u <= 0.3 for u in used), used
                with tb.cpu_quota("node1", 0.1):
                    assert (cg / "cpu.cfs_quota_us").read_text() == "10000\n"
                assert (cg / "cpu.cfs_quota_us").read_text() == "25000\n"
            assert (cg / "cpu.cfs_quota_us").read_text() == "-1\n"
            assert (cg / "cpu.shares").read_text() == "1024\n"
        finally:
            for loop in loops:
                loop.kill()
                loop.wait()
            tb.kill_in("node1", busy)


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


def test_hosts_have_their_own_var_tmp(lab: Testbed) -> None:
    """/var/tmp is each host's own (fleet keeps GPU leases there), 1777 as on Debian, and
    this machine's is untouched."""
    node1, node2 = lab.hosts
    mark = f"/var/tmp/tb-mark-{lab.tag}"
    r = ssh(lab, node1, f"echo node1 > {mark}; stat -c %a /var/tmp")
    assert r.returncode == 0 and quiet(r.stdout) == ["1777"], r.stdout + r.stderr
    assert lab.exec("node1", "cat", mark).stdout == "node1\n"
    assert lab.exec("node2", "test", "-e", mark).returncode == 1
    assert not Path(mark).exists()
    assert lab.exec("node2", "stat", "-c", "%a", "/var/tmp").stdout == "1777\n"


def test_colleagues_log_in_and_run_processes(lab_c: Testbed) -> None:
    node1, node2 = lab_c.hosts
    for user, uid in (("lab", USER_ID), ("alice", USER_ID + 1), ("bob", USER_ID + 2)):
        for h in lab_c.hosts:
            r = ssh(lab_c, h, "id -un; id -u; echo $HOME; ls -ld ~ | cut -d' ' -f3", user=user)
            assert r.returncode == 0, r.stderr
            name, got_uid, home, owner = quiet(r.stdout)
            assert (name, got_uid, owner) == (user, str(uid), user)
            assert home == str(h.home if user == "lab" else f"{h.home}-{user}")
    cfg = lab_c.ssh_config(lab_c.dir / "alice_config", user="alice")
    r = subprocess.run(["ssh", "-F", str(cfg), "-o", "BatchMode=yes", node1.addr, "id -un"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.stdout == "alice\n", r.stderr
    inv = lab_c.inventory(lab_c.dir / "inv.toml", user="alice").read_text()
    assert inv.count("user = ") == 1 and 'user = "alice"' in inv
    # A colleague's job: a process of alice's inside node1, its PID as node1 sees it.
    pid = lab_c.start_as("node1", "alice", "sleep", "3596.5")
    for _ in range(100):  # setsid execs the command a moment after start_as returns its pid
        ps = lab_c.exec("node1", "ps", "-o", "user=,sid=,args=", "-p", str(pid))
        user, sid, args = ps.stdout.split(maxsplit=2)
        if args != "setsid sleep 3596.5\n":
            break
        time.sleep(0.1)
    assert (user, sid, args) == ("alice", str(pid), "sleep 3596.5\n"), ps.stdout
    env = lab_c.exec("node1", "cat", f"/proc/{pid}/environ").stdout.split("\0")
    assert f"HOME={node1.home}-alice" in env and "USER=alice" in env, env
    assert lab_c.alive("node1", pid)
    assert "sleep 3596.5" not in lab_c.exec("node2", "ps", "-eo", "args").stdout
    root_pid = lab_c.start_as("node2", "root", "sleep", "3596.25")
    lab_pid = lab_c.start_as("node2", "lab", "sleep", "3596.75")
    ps = lab_c.exec("node2", "ps", "-o", "user=", "-p", f"{root_pid},{lab_pid}")
    assert ps.stdout.split() == ["root", "lab"]
    with pytest.raises(ValueError, match="no user 'carol' on node1"):
        lab_c.start_as("node1", "carol", "true")
    lab_c.kill_in("node1", pid)
    deadline = time.monotonic() + 5
    while lab_c.alive("node1", pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not lab_c.alive("node1", pid)
    for p in (root_pid, lab_pid):
        lab_c.kill_in("node2", p)


def test_fake_gpus_over_ssh(lab_c: Testbed) -> None:
    """nvidia-smi on node1 only, answering from the state a test writes: a colleague's process
    is listed while it lives, as on a real GPU."""
    node1, node2 = lab_c.hosts
    for h in lab_c.hosts:
        assert ssh(lab_c, h, "command -v nvidia-smi").returncode != 0  # no GPU by default
    pid = lab_c.start_as("node1", "alice", "sleep", "3595.5")
    lab_c.fake_gpus("node1", {
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559},
                 {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                  "utilization": 80, "uuid": "GPU-00000000-1111-2222-3333-444444444444"}],
        "apps": [{"gpu": 1, "pid": pid, "used_mib": 18432}]})
    state = lab_c.dir / f"tmp-node1/{FAKE_SMI_STATE}"
    assert state.stat().st_mode & 0o777 == 0o644
    assert not list(state.parent.glob(f"{FAKE_SMI_STATE}.*"))  # no temporary left
    apps = "nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits"
    gpus = "nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits"
    r = ssh(lab_c, node1, f"{apps}; {gpus}")
    assert r.returncode == 0, r.stderr
    assert quiet(r.stdout) == [f"GPU-00000000-1111-2222-3333-444444444444, {pid}, 18432",
                               "0, 0, 0", "1, 18432, 80"]
    assert ssh(lab_c, node2, "command -v nvidia-smi").returncode != 0
    lab_c.kill_in("node1", pid)
    deadline = time.monotonic() + 5
    while lab_c.alive("node1", pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    r = ssh(lab_c, node1, f"{apps}; {gpus}")
    assert quiet(r.stdout) == ["0, 0, 0", "1, 0, 0"], r.stdout + r.stderr
    # A new state replaces the old one: the driver fails now.
    lab_c.fake_gpus("node1", {"gpus": [], "apps": [], "fail": "version-mismatch"})
    r = ssh(lab_c, node1, "nvidia-smi -L", user="bob")
    assert r.returncode == 18
    assert quiet(r.stdout)[0] == "Failed to initialize NVML: Driver/library version mismatch"


def test_started_processes_end_with_the_testbed() -> None:
    _need_testbed()
    with Testbed(1, colleagues=("alice",)) as tb:  # noqa: S604
        pid = tb.start_as("node1", "alice", "sleep", "3594.5")
        assert tb.alive("node1", pid)
    left = subprocess.run(["pgrep", "-f", "sleep 3594.5"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


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
        # The dead host's PIDs are the machine's to give again (pid_max wraps within a CI
        # run): nothing of the testbed enters or signals them afterwards.
        assert h.init_pid == 0 and h.sshd_pid == 0
        assert tb.exec("node1", "true").returncode != 0
        bystander = subprocess.Popen(["sleep", "3598.25"])  # as if given the dead init's PID
        try:
            h.init_pid = bystander.pid
            tb.close()
            assert bystander.poll() is None, "close() signalled a PID the host no longer owns"
        finally:
            bystander.kill()
            bystander.wait(timeout=10)


# One TCP transfer: its receiver counts the bytes to the sender's EOF.
RECEIVE = """import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
c, _ = s.accept()
n = 0
while data := c.recv(1 << 16):
    n += len(data)
print(n, flush=True)
"""
SEND = """import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20) as c:
    c.sendall(bytes(int(sys.argv[3])))
"""


def tcp_send(tb: Testbed, src: TbHost | None, dst: TbHost | None, size: int,
             port: int = 5201) -> None:
    """`size` bytes over one TCP connection from src to dst (None: this machine, on the
    bridge's address), each end a python in its host's network namespace; all of them
    arrived."""
    def where(h: TbHost | None) -> list[str]:
        return ["nsenter", "-t", str(h.init_pid), "-n", "--"] if h else []

    addr = dst.addr if dst else tb.gateway
    recv = subprocess.Popen([*where(dst), sys.executable, "-I", "-S", "-c", RECEIVE, addr,
                             str(port)], stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert recv.stdout is not None
        ready, _, _ = select.select([recv.stdout], [], [], 10)
        assert ready and recv.stdout.readline() == "ready\n"
        send = subprocess.run([*where(src), sys.executable, "-I", "-S", "-c", SEND, addr,
                               str(port), str(size)], capture_output=True, text=True, timeout=30)
        assert send.returncode == 0, send.stderr
        out, _ = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait(10)
    assert int(out) == size


def bucket(tb: Testbed) -> tuple[int, int]:
    """The bridge's token bucket as the kernel counts it: (bytes it passed, times a packet
    found no token and had to wait)."""
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", tb.bridge], capture_output=True,
                         text=True, timeout=10, check=True).stdout
    m = re.search(r"qdisc tbf .*\n Sent (\d+) bytes \d+ pkt \(dropped \d+, overlimits (\d+)",
                  out)
    assert m, out
    return int(m[1]), int(m[2])


def test_rate_bits() -> None:
    assert rate_bits("100mbit") == 100e6 and rate_bits("1.5gbit") == 1.5e9
    assert rate_bits("512kibit") == 512 * 1024
    for bad in ("100mbps", "fast", "0mbit", "mbit", ""):
        with pytest.raises(ValueError):
            rate_bits(bad)


def test_uplink_shapes_this_machines_link_only() -> None:
    """Testbed(uplink=...): what this machine sends to a host goes through a token bucket at
    the rate, which holds it back; what a host sends to another host, or back here, does not
    pass it. Told by the kernel's own counts of the bucket, not by a clock (5 MB at 20 mbit
    would take 2 s)."""
    _need_testbed()
    size = 5_000_000
    with Testbed(2, uplink="20mbit") as tb:
        node1, node2 = tb.hosts
        assert re.search(r"qdisc tbf \S+ root .*rate 20Mbit", subprocess.run(
            ["tc", "qdisc", "show", "dev", tb.bridge], capture_output=True, text=True,
            timeout=10).stdout)
        sent, waited = bucket(tb)
        tcp_send(tb, None, node1, size)
        up_sent, up_waited = bucket(tb)
        assert up_sent - sent >= size, (sent, up_sent)  # the upload went through the bucket
        assert up_waited > waited, (waited, up_waited)  # ... which held it to the rate
        tcp_send(tb, node1, node2, size)
        tcp_send(tb, node2, None, size)
        # host to host, and host to here: past the bucket (only this machine's ACKs for the
        # latter pass it, a few hundred bytes), and nothing of theirs waited for a token
        after_sent, after_waited = bucket(tb)
        assert after_sent - up_sent < size // 100, (up_sent, after_sent)
        assert after_waited == up_waited, (up_waited, after_waited)
    assert subprocess.run(["ip", "link", "show", tb.bridge], capture_output=True,
                          timeout=10).returncode != 0  # the qdisc went with the bridge
