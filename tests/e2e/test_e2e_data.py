"""Data at real scale, end to end through the real CLI on real sshd hosts: hundreds of MB
streamed once from here and relayed node to node, shared storage synced once, a touched file
not sent again, a changed block sent alone, an interrupted transfer resumed, a node that
cannot be reached by the others fed directly, a full disk and a file changed mid-transfer
each named; after every case nothing of fleet's is left running or listening on any host."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_up import assert_no_strays
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

MB = 1 << 20


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3) as bed:
        yield bed


def make_data(root: Path, sizes_mb: list[int]) -> None:
    """Random files (incompressible, as datasets and weights are), written 1 MiB at a time."""
    root.mkdir(parents=True, exist_ok=True)
    for i, size in enumerate(sizes_mb):
        with open(root / f"shard{i}.bin", "wb") as f:
            for _ in range(size):
                f.write(os.urandom(MB))
    (root / "labels.txt").write_text("".join(f"{i}\n" for i in range(1000)))


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(MB):
            h.update(b)
    return h.hexdigest()


def job(tmp_path: Path, port: int) -> Path:
    """A job that only syncs (its command is `true`): the transfer is all there is to see."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "main.py").write_text("print('hi')\n")
    path = tmp_path / "job.toml"
    path.write_text('inventory = "inv.toml"\nworkdir = "code"\ndata = "data"\n'
                    'launcher = "command"\ncommand = ["true"]\nnproc_per_node = 1\n'
                    f'[rendezvous]\nport = {port}\n')
    return path


def node_data(tb: Testbed, host: str, workdir: str) -> Path:
    """The data directory on a host (under its home: visible from here)."""
    base = Path(workdir.replace("~", str(tb.host(host).home), 1)) / "data"
    found = list(base.glob("data-*"))
    assert len(found) == 1, f"{host}: {found}"
    return found[0]


def listening(tb: Testbed, host: str) -> list[str]:
    """TCP ports listened on inside the host, but sshd's 22."""
    out = tb.exec(host, "sh", "-c", "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null").stdout
    ports = []
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) > 3 and f[3] == "0A" and ":" in f[1]:
            port = int(f[1].rsplit(":", 1)[1], 16)
            if port != 22:
                ports.append(str(port))
    return ports


def assert_clean(tb: Testbed) -> None:
    assert_no_strays(tb)
    left = {h.name: listening(tb, h.name) for h in tb.hosts}
    assert not any(left.values()), f"still listening: {left}"


def assert_same(tb: Testbed, data: Path, hosts: list[str], workdir: str) -> None:
    want = {p.name: sha(p) for p in data.iterdir()}
    for host in hosts:
        there = node_data(tb, host, workdir)
        got = {p.name: sha(p) for p in there.iterdir() if not p.name.startswith(".")}
        assert got == want, host
        assert not [p for p in there.iterdir() if p.name.endswith(".fleet-part")], host


@contextlib.contextmanager
def uplink(tb: Testbed, rate: str) -> Iterator[None]:
    """This machine's egress toward the hosts limited to `rate` for a while (the hosts talk to
    each other unshaped)."""
    tb.shape_uplink(rate)
    try:
        yield
    finally:
        tb.shape_uplink(None)


def wait_for(p: subprocess.Popen[str], pattern: str, limit: float) -> list[str]:
    """stderr lines of a running fleet until one matches (read in this thread, bounded)."""
    assert p.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return seen
    raise AssertionError(f"no {pattern!r} in {''.join(seen)}")


def mid_transfer(cli: CLI, tb: Testbed, job_path: Path, rate: str, after: float,
                 act: Callable[[subprocess.Popen[str]], None]) -> tuple[int, str]:
    """`fleet up` behind an uplink of `rate`: `after` seconds into its stream, act(process);
    then (its exit code, its stderr). Killed if it hangs."""
    with uplink(tb, rate):
        p = cli.popen("up", str(job_path))
        try:
            wait_for(p, r"data: streaming", 60)
            time.sleep(after)
            act(p)
            _, err = p.communicate(timeout=120)
            return p.returncode, err
        finally:
            if p.poll() is None:
                p.kill()


def test_hundreds_of_mb_to_three_hosts_two_sharing_storage(cli: CLI, tb: Testbed,
                                                           tmp_path: Path) -> None:
    shared = str(tb.host("node2").home / "fleet-data-a")
    tb.inventory(tmp_path / "inv.toml", workdir="~/fleet-data-a",
                 per_host={"node3": {"workdir": shared}})
    make_data(tmp_path / "data", [120, 120, 60])
    j = job(tmp_path, 29801)
    r = cli("up", str(j), timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # Once over this machine's uplink, relayed between the two nodes that do not share storage
    assert "to 2 node(s): this machine -> node1 -> node2" in r.stderr, out
    assert "node3  code: shared with node2" in r.stderr, out
    assert re.search(r"node1\s+data: sent 4 file\(s\), 300 MiB", r.stderr), out
    assert "fleet: data: 300 MiB sent to 2 nodes" in r.stderr, out  # one copy, not 600 MiB
    assert_same(tb, tmp_path / "data", ["node1", "node2"], "~/fleet-data-a")
    assert_clean(tb)

    # Touched only: the content is compared, nothing is sent again
    for p in (tmp_path / "data").iterdir():
        os.utime(p)
    r = cli("up", str(j), timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "streaming" not in r.stderr, out
    for host in ("node1", "node2"):
        assert f"{host}  data: sent 0 file(s), 0 bytes (4 unchanged" in r.stderr, out
        assert f"{host}  data: 4 file(s) with a new time but the same content" in r.stderr, out

    # One block changed in the middle of a 120 MB file: that block moves, the rest is kept
    with open(tmp_path / "data" / "shard0.bin", "r+b") as f:
        f.seek(50 * MB + 123)
        f.write(b"changed")
    r = cli("up", str(j), timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "node1  data: sent 1 file(s), 1 MiB (3 unchanged" in r.stderr, out
    assert "node1  data: 119.0 MiB of the files sent were there already" in r.stderr, out
    assert_same(tb, tmp_path / "data", ["node1", "node2"], "~/fleet-data-a")
    assert_clean(tb)


def test_a_node_the_others_cannot_reach_gets_the_data_from_here(cli: CLI, tb: Testbed,
                                                                tmp_path: Path) -> None:
    tb.inventory(tmp_path / "inv.toml", workdir="~/fleet-data-b")
    make_data(tmp_path / "data", [20])
    # node3 takes SSH and nothing else that others start (as a host firewall would); the
    # job is only `true`, so the port checks that would stop a torch job are skipped
    rules = ["-p", "tcp", "--syn", "!", "--dport", "22", "-j", "DROP"]
    assert tb.exec("node3", "iptables", "-I", "INPUT", *rules).returncode == 0
    try:
        r = cli("up", "--skip-checks", str(job(tmp_path, 29802)), timeout=300)
    finally:
        tb.exec("node3", "iptables", "-D", "INPUT", *rules)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "data: node2 cannot reach node3" in r.stderr, out
    assert "node3 gets the data from this machine directly" in r.stderr, out
    assert "this machine -> node1 -> node2; this machine -> node3" in r.stderr, out
    assert_same(tb, tmp_path / "data", ["node1", "node2", "node3"], "~/fleet-data-b")
    assert_clean(tb)


def test_an_interrupted_transfer_stops_at_once_and_resumes(cli: CLI, tb: Testbed,
                                                           tmp_path: Path) -> None:
    tb.inventory(tmp_path / "inv.toml", hosts=["node1", "node2"], workdir="~/fleet-data-c")
    make_data(tmp_path / "data", [60])
    j = job(tmp_path, 29803)
    # 60 MB at 40 Mbit: about 12 s
    code, err = mid_transfer(cli, tb, j, "40mbit", 4, lambda p: p.send_signal(signal.SIGINT))
    assert code == 130, err
    assert_clean(tb)  # nothing left on the nodes to go on writing
    # stopped, not finished first: the file is still a part, short of its 60 MB
    parts = [q for q in (tb.host("node1").home / "fleet-data-c" / "data").rglob("*.fleet-part")]
    assert parts and 0 < parts[0].stat().st_size < 60 * MB, parts
    kept = parts[0].stat().st_size
    r = cli("up", str(j), timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"node1\s+data: ([\d.]+) MiB of the files sent were there already", r.stderr)
    assert m and float(m.group(1)) >= (kept // MB) - 1, out
    assert_same(tb, tmp_path / "data", ["node1", "node2"], "~/fleet-data-c")
    assert_clean(tb)


def test_a_full_disk_mid_transfer_is_named_and_a_later_run_repairs_it(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    tb.inventory(tmp_path / "inv.toml", workdir="~/fleet-data-d")
    make_data(tmp_path / "data", [40, 40])
    j = job(tmp_path, 29804)
    full = tb.host("node2").home / "fleet-data-d" / "data"
    tb.mount_tmpfs("node2", full, size="50m")
    try:
        r = cli("up", str(j), timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 5, out
        assert re.search(r"node2: no space left writing \S+/fleet-data-d/data/data-\w+/"
                         r"shard1\.bin \([\d.]+ \w+ free there\): free space there", r.stderr), out
        assert "started master" not in r.stderr and "nothing was started" in r.stderr, out
        assert_clean(tb)
    finally:
        tb.umount("node2", full)
    # the nodes after it in the relay got everything; node2 gets the rest now
    r = cli("up", str(j), timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert_same(tb, tmp_path / "data", ["node1", "node2", "node3"], "~/fleet-data-d")
    assert_clean(tb)


def test_a_file_changed_while_it_is_sent_stops_the_launch(cli: CLI, tb: Testbed,
                                                          tmp_path: Path) -> None:
    tb.inventory(tmp_path / "inv.toml", hosts=["node1"], workdir="~/fleet-data-e")
    make_data(tmp_path / "data", [40])
    j = job(tmp_path, 29805)
    def edit(_: subprocess.Popen[str]) -> None:
        with open(tmp_path / "data" / "shard0.bin", "r+b") as f:
            f.seek(39 * MB)
            f.write(b"written while fleet sends it")
    code, err = mid_transfer(cli, tb, j, "40mbit", 2, edit)  # 40 MB: about 8 s
    assert code == 2, err
    assert f"{tmp_path / 'data' / 'shard0.bin'} changed while fleet sent it" in err, err
    assert "nothing was started" in err, err
    assert_clean(tb)
    r = cli("up", str(j), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same(tb, tmp_path / "data", ["node1"], "~/fleet-data-e")
    assert_clean(tb)


def test_a_node_lost_mid_relay_is_named_and_the_others_stop_at_once(
        cli: CLI, tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(3) as bed:
        bed.inventory(tmp_path / "inv.toml", workdir="~/fleet-data-f")
        make_data(tmp_path / "data", [40])
        # node2 is the middle of the relay: node1 passes data to it (40 MB: about 8 s)
        code, err = mid_transfer(cli, bed, job(tmp_path, 29806), "40mbit", 2,
                                 lambda _: bed.kill_host("node2"))
        assert code != 0, err
        # the transfer ended on node2's own end, seen as it came; not after a stall watch
        # (node2 silent for 25 s, or node1 waiting 20 s to pass it data)
        assert re.search(r"node2: lost mid-transfer", err), err
        assert not re.search(r"stalled|no progress for|waited \d+s|nothing moved", err), err
        assert "nothing was started" in err, err
        for host in ("node1", "node3"):
            left = bed.stray_processes(host)
            deadline = time.monotonic() + 5
            while left and time.monotonic() < deadline:
                time.sleep(0.2)
                left = bed.stray_processes(host)
            assert not left, (host, left)
            assert not listening(bed, host), host


def test_the_same_engine_fetches_from_a_node_over_ssh(tb: Testbed, tmp_path: Path) -> None:
    """The way back (what `fleet pull` will use): a node's files streamed here over its SSH
    connection, verified, strictly placed; nothing of it left on the node."""
    from fleet.config.inventory import load_inventory
    from fleet.transport import open_transport
    from fleet.transport.transfer.pull import fetch
    from fleet.transport.transfer.wanted import Want

    inv = load_inventory(tb.inventory(tmp_path / "inv.toml", hosts=["node1"]))
    outputs = tb.host("node1").home / "outputs-g"
    (outputs / "ckpt").mkdir(parents=True)
    big = os.urandom(30 * MB + 5)
    (outputs / "ckpt" / "last.pt").write_bytes(big)
    (outputs / "metrics.json").write_text('{"loss": 0.1}\n')
    here = tmp_path / "pulled"
    here.mkdir()
    t = open_transport(inv.hosts[0])
    try:
        got = fetch(t, inv.hosts[0].python, str(outputs),
                    [Want("ckpt/last.pt", len(big)), Want("metrics.json", 14)], here)
    finally:
        t.close()
    assert (here / "ckpt" / "last.pt").read_bytes() == big
    assert got["ckpt/last.pt"] == hashlib.sha256(big).hexdigest()
    assert (here / "metrics.json").read_text() == '{"loss": 0.1}\n'
    assert_clean(tb)
