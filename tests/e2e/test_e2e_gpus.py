"""Shared GPUs end to end, through the real CLI on three real sshd hosts with a colleague, alice,
who logs in and runs processes of her own. There is no GPU here: node1 and node3 get the
stand-in nvidia-smi (tests/fake_nvidia_smi.py, real nvidia-smi's formats and error texts),
node2 none; a GPU's process is a real process (alice's `sleep`), so ending it frees the GPU.

`fleet gpus` (a busy host, one without nvidia-smi, one whose NVML fails), `fleet up --wait`
(starts when alice's process ends, names it while waiting, times out and is interrupted naming
it), `fleet up` refusing another user's process (nothing written on any host) unless --force,
two users reserving one GPU at once (exactly one wins, every round), `fleet up` refusing
another user's lease (a GPU, a whole host) with its owner and end, and an expired lease
ignored."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import USER_ID, Testbed

pytestmark = pytest.mark.e2e

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0}
HELLO = "import socket\nprint('hello from', socket.gethostname(), flush=True)\n"
ALICE_UID = USER_ID + 1  # the testbed's first colleague


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3, colleagues=("alice",)) as bed:
        bed.fake_gpus("node1", {"gpus": [H100, H100], "apps": []})
        bed.fake_gpus("node3", {"gpus": [H100], "apps": [], "fail": "version-mismatch"})
        yield bed


@pytest.fixture
def alice_on_gpu1(tb: Testbed) -> Iterator[int]:
    """alice's process holding 18 GiB on node1's GPU 1, at 35% use; killed afterwards."""
    pid = tb.start_as("node1", "alice", "sleep", "600")
    tb.fake_gpus("node1", {"gpus": [H100, {**H100, "utilization": 35}],
                           "apps": [{"gpu": 1, "pid": pid, "used_mib": 18432}]})
    yield pid
    if tb.alive("node1", pid):
        tb.kill_in("node1", pid)


def job(tmp_path: Path, port: int) -> Path:
    (tmp_path / "hello.py").write_text(HELLO)
    path = tmp_path / "job.toml"
    path.write_text(f'inventory = "inv.toml"\nscript = "hello.py"\n[rendezvous]\nport = {port}\n')
    return path


class Lines:
    """A process's stderr read line by line in a thread, so a test can wait for one."""

    def __init__(self, p: subprocess.Popen[str]) -> None:
        self.p, self.lines, self.lock = p, list[str](), threading.Lock()
        assert p.stderr is not None
        self.thread = threading.Thread(target=self._read, args=(p.stderr,), daemon=True)
        self.thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self.lock:
                self.lines.append(line)

    def wait(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [x for x in self.lines if re.search(pattern, x)]
            if found:
                return found[0]
            assert self.p.poll() is None or self.thread.is_alive(), self.text()
            time.sleep(0.2)
        raise AssertionError(f"no line {pattern!r} in {timeout}s:\n{self.text()}")

    def finish(self, timeout: float) -> str:
        """Its stdout, once it ended (its stderr is this reader's, read to the end too)."""
        assert self.p.stdout is not None
        out = self.p.stdout.read()
        self.p.wait(timeout=timeout)
        self.thread.join(timeout=10)
        return out

    def text(self) -> str:
        with self.lock:
            return "".join(self.lines)


def test_gpus_on_a_busy_host_one_without_nvidia_smi_and_one_whose_nvml_fails(
        cli: CLI, tb: Testbed, tmp_path: Path, alice_on_gpu1: int) -> None:
    inv = tb.inventory(tmp_path / "inv.toml")
    mine = tb.start_as("node1", "root", "env", "FLEET_RUN_ID=20261124-101010-hello-ab12",
                       "sleep", "601")
    tb.fake_gpus("node1", {"gpus": [H100, {**H100, "utilization": 35}],
                           "apps": [{"gpu": 1, "pid": alice_on_gpu1, "used_mib": 18432},
                                    {"gpu": 0, "pid": mine, "used_mib": 2048}]})
    try:
        r = cli("gpus", str(inv))
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout
        assert re.search(rf"^node1\s+1\s+18\.0/79\.6 GiB\s+35%\s+alice\s+{alice_on_gpu1}\s+\d+ s"
                         r"\s+sleep 600\s*$", out, re.M), out
        assert re.search(rf"^node1\s+0\s+2\.0/79\.6 GiB\s+0%\s+root\s+{mine}\s+\d+ s\s+sleep 601"
                         r"\s+run 20261124-101010-hello-ab12\s*$", out, re.M), out
        assert re.search(r"^node2\s+-\s+no nvidia-smi here \(no NVIDIA GPU\)$", out, re.M), out
        assert re.search(r"^node3\s+-\s+nvidia-smi failed: Failed to initialize NVML: "
                         r"Driver/library version mismatch", out, re.M), out
        as_json = cli("gpus", str(inv), "--json")
        assert as_json.returncode == 0, as_json.stderr
        hosts = {h["host"]: h for h in json.loads(as_json.stdout)["hosts"]}
        gpu1 = hosts["node1"]["gpus"][1]
        assert gpu1["memory_used_mib"] == 18432 and gpu1["utilization"] == 35
        [p] = gpu1["processes"]
        assert (p["pid"], p["user"], p["command"], p["run"], p["idle"]) == (
            alice_on_gpu1, "alice", "sleep 600", None, False)
        assert hosts["node2"]["nvidia_smi"] is False and hosts["node2"]["gpus"] == []
        assert "version mismatch" in hosts["node3"]["error"] and hosts["node3"]["gpus"] == []
    finally:
        tb.kill_in("node1", mine)
    # A host that cannot be reached is its own row, and exit code 3.
    tb.kill_sshd("node2")
    try:
        r = cli("gpus", str(inv), "--node", "node2", "--node", "node1")
    finally:
        tb.start_sshd("node2")
    assert r.returncode == 3, r.stdout + r.stderr
    assert re.search(r"^node2\s+-\s+not asked: .*cannot connect", r.stdout, re.M), r.stdout
    assert re.search(r"^node1\s+1\s+18\.0/79\.6 GiB", r.stdout, re.M), r.stdout


def test_up_wait_starts_when_the_colleagues_process_ends(
        cli: CLI, tb: Testbed, tmp_path: Path, alice_on_gpu1: int) -> None:
    tb.inventory(tmp_path / "inv.toml", hosts=["node1"], per_host={"node1": {"gpus": "1"}})
    p = cli.popen("up", "--wait", str(job(tmp_path, 29711)))
    err = Lines(p)
    try:
        blocker = err.wait(r"^fleet:   node1 GPU1: 18 GiB, alice, \d+ s$")
        assert p.poll() is None, err.text()
        time.sleep(6)  # a poll or more: still waiting, nothing started
        assert p.poll() is None and "hello from" not in err.text(), err.text()
        assert "started master" not in err.text() and "node rank" not in err.text()
        tb.kill_in("node1", alice_on_gpu1)
        out = err.finish(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    err.thread.join(timeout=10)
    assert p.returncode == 0, out + err.text()
    text = err.text()
    assert "fleet: waiting until every GPU this job uses is free:\n" + blocker in text, text
    assert "fleet: every GPU this job uses is free: starting" in text
    assert "in use by user alice" not in text, text  # the plan warns of what is there now
    assert "node1 r0 | hello from node1" in out, out
    assert_nothing_left(tb, run_id_of(text))


def test_up_wait_times_out_or_is_interrupted_naming_the_blocker(
        cli: CLI, tb: Testbed, tmp_path: Path, alice_on_gpu1: int) -> None:
    tb.inventory(tmp_path / "inv.toml", hosts=["node1"], per_host={"node1": {"gpus": "1"}})
    path = job(tmp_path, 29712)
    r = cli("up", "--wait=7s", str(path), timeout=120)
    assert r.returncode == 6, r.stdout + r.stderr
    assert re.search(r"waiting 7 s for free GPUs failed on 1 host\(s\); nothing was started:\n"
                     r"  node1: GPU1: 18 GiB, alice, \d+ s "
                     r"\(still in the way when the wait ended\)",
                     r.stderr), r.stderr
    assert "hello from" not in r.stdout and "node rank" not in r.stderr
    p = cli.popen("up", "--wait", "2h", str(path))
    err = Lines(p)
    try:
        err.wait(r"^fleet:   node1 GPU1: 18 GiB, alice")
        p.send_signal(signal.SIGINT)
        err.finish(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    err.thread.join(timeout=10)
    assert p.returncode == 130, err.text()
    assert re.search(r"interrupted \(SIGINT\): stopped waiting for free GPUs; still in the way: "
                     r"node1 GPU1: 18 GiB, alice, \d+ s; nothing had been started on any node",
                     err.text()), err.text()
    assert tb.alive("node1", alice_on_gpu1)  # waiting never touches anyone's process


def homes(tb: Testbed) -> dict[str, list[str]]:
    """Every path under each host's home, as this machine sees it."""
    return {h.name: sorted(str(p) for p in h.home.rglob("*")) for h in tb.hosts}


def test_up_refuses_a_colleagues_process_unless_forced_and_never_touches_it(
        cli: CLI, tb: Testbed, tmp_path: Path, alice_on_gpu1: int) -> None:
    tb.inventory(tmp_path / "inv.toml", hosts=["node1", "node2"],
                 per_host={"node1": {"gpus": "1"}})
    path = job(tmp_path, 29716)
    before = homes(tb)
    r = cli("up", str(path))
    assert r.returncode == 6, r.stdout + r.stderr
    assert ("checking who uses the GPUs failed on 1 host(s); nothing was started:\n"
            f"  node1: GPU1: 18432 MiB in use by user alice (pid {alice_on_gpu1}) (wait for it "
            "(fleet up --wait) or start anyway (--force))\n") in r.stderr, r.stderr
    assert "node2:" not in r.stderr  # no nvidia-smi there: nothing of anyone's in the way
    assert "node rank" not in r.stderr and "hello from" not in r.stdout
    assert homes(tb) == before  # refused before any claim: nothing written on any host
    assert_nothing_left(tb, run_id_of(r.stderr))
    forced = cli("up", "--force", str(path))
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert forced.stderr.count("--force: starting although") == 1, forced.stderr
    assert (f"fleet: --force: starting although node1 GPU1: 18432 MiB in use by user alice "
            f"(pid {alice_on_gpu1})\n") in forced.stderr, forced.stderr
    assert "node1 r0 | hello from node1" in forced.stdout and \
        "node2 r1 | hello from node2" in forced.stdout, forced.stdout
    assert_nothing_left(tb, run_id_of(forced.stderr))
    assert tb.alive("node1", alice_on_gpu1)  # refused or forced, her process is never touched


def test_two_users_reserving_one_gpu_at_once_exactly_one_wins(cli: CLI, tb: Testbed,
                                                               tmp_path: Path) -> None:
    mine = tb.inventory(tmp_path / "inv.toml")
    hers = tb.inventory(tmp_path / "alice.toml", user="alice")
    for round_ in range(4):
        ps = {who: cli.popen("reserve", f"node1:{round_ % 2}", "-i", str(inv), "--for", "1h",
                             "--note", f"round {round_}")
              for who, inv in (("root", mine), ("alice", hers))}
        said = {who: p.communicate(timeout=120) for who, p in ps.items()}
        codes = {who: p.returncode for who, p in ps.items()}
        assert sorted(codes.values()) == [0, 6], (codes, said)
        winner = next(who for who, c in codes.items() if c == 0)
        loser = next(who for who, c in codes.items() if c == 6)
        assert re.search(rf"node1: GPU {round_ % 2} reserved for you \({winner}\) until "
                         r"(\w{3} )?\d\d:\d\d \(1 h\)", said[winner][1]), said[winner]
        assert re.search(rf"not reserved:\n  node1: GPU {round_ % 2} leased by {winner} until "
                         rf'(\w{{3}} )?\d\d:\d\d \((1 h|59 min) left\): "round {round_}"',
                         said[loser][1]), said[loser]
        listed = cli("reserve", "--list", "-i", str(mine))
        assert len(re.findall(rf"^node1\s+{round_ % 2}\s+", listed.stdout, re.M)) == 1, listed
        # Only the owner gives it back: the other's release names it and leaves it.
        other = cli("release", f"node1:{round_ % 2}", "-i", str(hers if loser == "alice"
                                                                   else mine))
        assert other.returncode == 0 and f"stays leased by {winner}" in other.stderr, other
        back = cli("release", f"node1:{round_ % 2}", "-i", str(mine if winner == "root"
                                                                  else hers))
        assert back.returncode == 0 and "released your lease of GPU" in back.stderr, back
    assert cli("reserve", "--list", "-i", str(mine)).stderr == \
        "fleet: no active lease on any host\n"
    # Several targets are all or nothing, and undoing drops only what this command took: the
    # lease root held before on node1 stays as it was.
    assert cli("reserve", "node1:0", "-i", str(mine), "--for", "2h").returncode == 0
    assert cli("reserve", "node3", "-i", str(hers), "--for", "1h").returncode == 0
    both = cli("reserve", "node1:0", "node3", "-i", str(mine), "--for", "5h")
    assert both.returncode == 6, both.stderr
    assert "not reserved (the leases it had taken on other hosts were dropped):\n  node3: the " \
        "whole host leased by alice until" in both.stderr, both.stderr
    listed = cli("reserve", "--list", "-i", str(mine)).stdout
    assert re.search(r"^node1\s+0\s+root\s+(\w{3} )?\d\d:\d\d\s+(2 h|1 h 59 min)\s*$", listed,
                     re.M), listed
    assert re.search(r"^node3\s+all\s+alice\s", listed, re.M) and listed.count("\n") == 3, listed
    assert cli("release", "node1", "-i", str(mine)).returncode == 0
    assert cli("release", "node3", "-i", str(hers)).returncode == 0


def test_up_refuses_another_users_lease_and_ignores_an_expired_one(cli: CLI, tb: Testbed,
                                                                    tmp_path: Path) -> None:
    tb.inventory(tmp_path / "inv.toml", hosts=["node1", "node2"],
                 per_host={"node1": {"gpus": "1"}})
    hers = tb.inventory(tmp_path / "alice.toml", user="alice")
    path = job(tmp_path, 29713)
    took = cli("reserve", "node1:1", "node2", "-i", str(hers), "--for", "2h", "--note",
               "paper deadline")
    assert took.returncode == 0, took.stderr
    try:
        r = cli("up", str(path))
        assert r.returncode == 6, r.stdout + r.stderr
        lease = r'alice until (\w{3} )?\d\d:\d\d \((2 h|1 h 59 min) left\): "paper deadline"'
        assert re.search(r"checking GPU leases failed on 2 host\(s\); nothing was started:\n"
                         rf"  node1: GPU1: leased by {lease} \(wait for it \(fleet up --wait\) "
                         r"or start anyway \(--ignore-leases\)\)\n"
                         rf"  node2: the whole host: leased by {lease}", r.stderr), r.stderr
        assert "node rank" not in r.stderr and "hello from" not in r.stdout
        shown = cli("gpus", str(tmp_path / "inv.toml"))
        assert re.search(rf"^node1\s+1\s+0\.0/79\.6 GiB\s+0%\s+leased by {lease}$",
                         shown.stdout, re.M), shown.stdout
        assert re.search(rf"^node2\s+all\s+leased by {lease}$", shown.stdout, re.M), shown.stdout
        forced = cli("up", "--ignore-leases", str(path))
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert "node2 r1 | hello from node2" in forced.stdout
        assert re.search(rf"--ignore-leases: starting although node1 GPU1: leased by {lease}",
                         forced.stderr), forced.stderr
    finally:
        gave = cli("release", "node1", "node2", "-i", str(hers))
    assert gave.returncode == 0 and gave.stderr.count("released your lease") == 2, gave.stderr
    # A lease that ended (alice's file, as fleet writes one, its end an hour ago) is ignored.
    leases = tb.dir / "vartmp-node2" / "fleet-leases"
    ended = leases / f"{ALICE_UID}-0123456789ab.lease"
    ended.write_text(json.dumps({"gpus": None, "since": time.time() - 7200,
                                 "until": time.time() - 3600, "note": "old", "origin": "x"}))
    os.chown(ended, ALICE_UID, ALICE_UID)
    r = cli("up", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "leased" not in r.stderr and "node2 r1 | hello from node2" in r.stdout
    assert "old" not in cli("gpus", str(tmp_path / "inv.toml")).stdout
    assert cli("reserve", "--list", "-i", str(hers)).stderr == \
        "fleet: no active lease on any host\n"


# ---- a colleague's attacks on the lease directory ------------------------------------------
def leases_dir(tb: Testbed, host: str) -> Path:
    """The host's /var/tmp/fleet-leases, as this machine sees it."""
    return tb.dir / f"vartmp-{host}" / "fleet-leases"


def alices(path: Path, text: str = "") -> Path:
    path.write_text(text)
    os.chown(path, ALICE_UID, ALICE_UID)
    return path


def test_a_flood_of_empty_lease_files_hides_no_lease_and_a_bigger_one_fails_closed(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    mine = tb.inventory(tmp_path / "inv.toml", hosts=["node1"], per_host={"node1": {"gpus": "0"}})
    hers = tb.inventory(tmp_path / "alice.toml", user="alice")
    d = leases_dir(tb, "node1")
    junk: list[Path] = []
    try:
        took = cli("reserve", "node1:0", "-i", str(hers), "--for", "1h", "--note", "real")
        assert took.returncode == 0, took.stderr
        # Named to come first in any order by name, and empty: what the listing cut at 500
        # names.
        junk += [alices(d / f"0-{i:012x}.lease") for i in range(500)]
        r = cli("up", str(job(tmp_path, 29714)))
        assert r.returncode == 6, r.stdout + r.stderr
        assert re.search(r'node1: GPU0: leased by alice until .*"real"', r.stderr), r.stderr
        took = cli("reserve", "node1:0", "-i", str(mine))
        assert took.returncode == 6 and re.search(
            r'not reserved:\n  node1: GPU 0 leased by alice until .*"real"', took.stderr), took
        # More than fleet reads (10000 names, empty or not: 500 files that are not empty is
        # the other bound, test_gpu_sharing's): the leases are unknown, nothing starts, nothing
        # is reserved, and `gpus` says so.
        junk += [alices(d / f"1-{i:012x}.lease") for i in range(9501)]
        r = cli("up", str(job(tmp_path, 29714)))
        assert r.returncode == 6, r.stdout + r.stderr
        # (the listing is unsorted: a lease read before the cut is named beside it)
        assert ("node1: the whole host: its leases are unknown: /var/tmp/fleet-leases holds over "
                "10000 names") in r.stderr and "(wait for it" in r.stderr, r.stderr
        assert "node rank" not in r.stderr and "hello from" not in r.stdout
        took = cli("reserve", "node1:0", "-i", str(mine))
        assert took.returncode == 6 and "node1: the lease directory /var/tmp/fleet-leases holds " \
            "over 10000 names: its leases are unknown" in took.stderr, took.stderr
        shown = cli("gpus", str(mine))
        assert re.search(r"^node1\s+all\s+leases unknown: /var/tmp/fleet-leases holds over 10000",
                         shown.stdout, re.M), shown.stdout
    finally:
        for f in junk:
            f.unlink()
        assert cli("release", "node1", "-i", str(hers)).returncode == 0


def test_a_lease_touched_to_2031_ends_within_a_week(cli: CLI, tb: Testbed,
                                                    tmp_path: Path) -> None:
    mine = tb.inventory(tmp_path / "inv.toml", hosts=["node1"])
    hers = tb.inventory(tmp_path / "alice.toml", user="alice")
    try:
        took = cli("reserve", "node1:1", "-i", str(hers), "--for", "1h")
        assert took.returncode == 0, took.stderr
        [f] = [p for p in leases_dir(tb, "node1").glob("*.lease") if p.stat().st_uid == ALICE_UID
               and p.stat().st_size and json.loads(p.read_text())["gpus"] == [1]]
        record = json.loads(f.read_text())
        f.write_text(json.dumps({**record, "until": 1_950_000_000}))  # 2031, her file still
        os.utime(f, (1_949_000_000, 1_949_000_000))  # `touch -d 2031`: the mtime only
        shown = cli("gpus", str(mine), "--json")
        assert shown.returncode == 0, shown.stderr
        [lease] = [x for x in json.loads(shown.stdout)["hosts"][0]["leases"]
                   if x["owner"] == "alice" and x["gpus"] == [1]]
        assert lease["until"] <= time.time() + 7 * 86400, lease
    finally:
        assert cli("release", "node1", "-i", str(hers)).returncode == 0


def test_a_link_as_the_lease_directory_is_named_with_its_fix(cli: CLI, tb: Testbed,
                                                            tmp_path: Path) -> None:
    mine = tb.inventory(tmp_path / "inv.toml", hosts=["node2"])
    d = leases_dir(tb, "node2")
    saved = d.with_name("fleet-leases.saved")
    if d.exists():
        d.rename(saved)
    d.symlink_to("/var/tmp/elsewhere")
    os.lchown(d, ALICE_UID, ALICE_UID)
    try:
        took = cli("reserve", "node2", "-i", str(mine))
        assert took.returncode == 6, took.stderr
        assert ("node2: the lease directory /var/tmp/fleet-leases is a link (to "
                "'/var/tmp/elsewhere'): fleet keeps leases only in a directory of its own; its "
                "owner alice or root can remove it (`rm /var/tmp/fleet-leases`)") in took.stderr, \
            took.stderr
        assert "Error" not in took.stderr
        r = cli("up", str(job(tmp_path, 29715)))
        assert r.returncode == 6 and "node2: the whole host: its leases are unknown: " \
            "/var/tmp/fleet-leases is a link or no directory" in r.stderr, r.stdout + r.stderr
    finally:
        d.unlink()
        if saved.exists():
            saved.rename(d)


def test_a_colleagues_lock_on_the_lease_directory_is_waited_for_then_named(
        cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    mine = tb.inventory(tmp_path / "inv.toml", hosts=["node1"])
    d = leases_dir(tb, "node1")
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o1777)
    holder = tb.start_as("node1", "alice", sys.executable, "-c",
                         "import fcntl, os, time\n"
                         "fcntl.flock(os.open('/var/tmp/fleet-leases', os.O_RDONLY), "
                         "fcntl.LOCK_EX)\ntime.sleep(120)")
    try:
        deadline = time.monotonic() + 20  # until /proc/locks shows her lock (its inode)
        while f":{d.stat().st_ino} " not in Path("/proc/locks").read_text():
            assert time.monotonic() < deadline and tb.alive("node1", holder)
            time.sleep(0.1)
        locked = (rf"node1: the lease directory /var/tmp/fleet-leases stayed locked for over "
                  rf"5 s, by pid {holder} of alice \(python[0-9.]*\)")
        took = cli("reserve", "node1:0", "-i", str(mine), timeout=120)
        assert took.returncode == 6 and re.search(locked, took.stderr), took.stderr
        gave = cli("release", "node1", "-i", str(mine), timeout=120)
        assert gave.returncode != 0 and re.search(locked, gave.stderr), gave.stderr
    finally:
        tb.kill_in("node1", holder)
