"""`fleet pull` end to end through the real CLI on two real sshd hosts: a run's declared outputs
brought back byte-identical from the master, a second pull that fetches nothing, a pull killed
mid-transfer resumed without sending again what arrived, --all into per-node folders, a
node that no longer has the run (or a path) named, a pull into the job's own folder that the
next `up` does not send to the nodes again; and a compromised node: one that sends more
than it listed, a link in the destination here, a name that would forge a line of `show`."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

MB = 1 << 20
BIG_MB = 60

WRITER = f"""\
import os, socket
os.makedirs("checkpoints", exist_ok=True)
os.makedirs("runs/tb", exist_ok=True)
with open("checkpoints/model.pt", "wb") as f:
    f.write(socket.gethostname().encode() + os.urandom(3 * {MB} + 7))
with open("checkpoints/big.bin", "wb") as f:
    for _ in range({BIG_MB}):
        f.write(os.urandom({MB}))
with open("runs/tb/events.txt", "w") as f:
    f.write("loss 0.1 on " + socket.gethostname() + "\\n")
"""


@pytest.fixture(scope="module")
def bed(tb2: Testbed, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[Testbed, CLI, str]]:
    """Two hosts, and one finished run whose job wrote its outputs on each."""
    here = tmp_path_factory.mktemp("pull")
    cli = CLI(here)
    (here / "code").mkdir()
    (here / "code" / "write.py").write_text(WRITER)
    tb2.inventory(here / "inv.toml")
    (here / "job.toml").write_text(
        'inventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
        'command = ["{python}", "write.py"]\nnproc_per_node = 1\n'
        'outputs = ["checkpoints/", "runs/"]\n[rendezvous]\nport = 29561\n')
    r = cli("up", str(here / "job.toml"), timeout=300)
    assert r.returncode == 0, r.stderr
    run_id = next((here / ".fleet").rglob("run.json")).parent.name
    yield tb2, cli, run_id


def record(cli: CLI, run_id: str) -> Path:
    """The run's local record."""
    return next((cli.cwd / ".fleet").rglob(f"{run_id}/run.json")).parent


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(MB):
            h.update(b)
    return h.hexdigest()


def code_dir(tb: Testbed, cli: CLI, run_id: str, host: str) -> Path:
    """The job's directory on a host (under its home: visible from here)."""
    m = json.loads((record(cli, run_id) / "manifest.json").read_text())
    return Path(m["nodes"][host]["code_dir"].replace("~", str(tb.host(host).home), 1))


def outputs(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): sha(p) for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


def test_pull_brings_the_master_outputs_back_and_a_second_fetches_nothing(
        bed: tuple[Testbed, CLI, str]) -> None:
    tb, cli, run_id = bed
    r = cli("pull")  # the latest run, its declared outputs, into ./<run id>/
    assert r.returncode == 0, r.stderr
    out = cli.cwd / run_id
    node = code_dir(tb, cli, run_id, "node1")
    want = {rel: h for rel, h in outputs(node).items()
            if rel.startswith(("checkpoints/", "runs/"))}
    assert len(want) == 3
    assert outputs(out) == want
    assert (out / "checkpoints" / "model.pt").read_bytes().startswith(b"node1")
    assert re.search(r"node1 +3 file\(s\) fetched", r.stderr), r.stderr
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    again = cli("pull", run_id)
    assert again.returncode == 0, again.stderr
    # Nothing crossed the link (fleet counts the block bytes that came), and no file here was
    # replaced (a fetched file is renamed into place: a new inode).
    assert "nothing fetched" in again.stderr and "(0 bytes sent)" in again.stderr, again.stderr
    assert "3 file(s) unchanged, not fetched again" in again.stderr
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.rglob("*")
            if p.is_file()} == before
    shown = cli("show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "outputs: checkpoints, runs" in shown.stdout
    assert re.search(r"checkpoints/big\.bin  60\.0 MiB", shown.stdout), shown.stdout


def test_an_interrupted_pull_resumes_without_sending_again_what_arrived(
        bed: tuple[Testbed, CLI, str]) -> None:
    tb, cli, run_id = bed
    dest = cli.cwd / "resumed"
    part = dest / "checkpoints" / ".big.bin.fleet-part"
    h = tb.host("node1")
    # node1's own link toward here held to about 5 MB/s: the 60 MB file takes ~12 s
    tb.exec("node1", "tc", "qdisc", "add", "dev", h.iface, "root", "tbf", "rate", "40mbit",
            "burst", "65536", "latency", "100ms")
    try:
        p = cli.popen("pull", run_id, "checkpoints/big.bin", "--to", str(dest))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (part.exists() and
                                                   part.stat().st_size > 15 * MB):
            time.sleep(0.1)
        assert part.exists(), p.communicate(timeout=30)
        p.send_signal(signal.SIGKILL)
        p.communicate(timeout=30)
    finally:
        tb.exec("node1", "tc", "qdisc", "del", "dev", h.iface, "root")
    arrived = part.stat().st_size
    assert 15 * MB < arrived < BIG_MB * MB and not (dest / "checkpoints" / "big.bin").exists()
    r = cli("pull", run_id, "checkpoints/big.bin", "--to", str(dest))
    assert r.returncode == 0, r.stderr
    node = code_dir(tb, cli, run_id, "node1")
    assert sha(dest / "checkpoints" / "big.bin") == sha(node / "checkpoints" / "big.bin")
    assert not part.exists()
    m = re.search(r"\(([\d.]+) MiB sent, ([\d.]+) MiB already here from an earlier pull\)",
                  r.stderr)
    assert m, r.stderr
    sent, kept = float(m[1]), float(m[2])
    assert kept >= (arrived // MB) - 1 and sent + kept == pytest.approx(BIG_MB, abs=0.2)


def test_all_pulls_every_node_into_its_own_folder(bed: tuple[Testbed, CLI, str]) -> None:
    tb, cli, run_id = bed
    r = cli("pull", run_id, "--all", "--to", "every")
    assert r.returncode == 0, r.stderr
    for host in ("node1", "node2"):
        got = outputs(cli.cwd / "every" / host)
        node = outputs(code_dir(tb, cli, run_id, host))
        assert got and all(node[rel] == h for rel, h in got.items()), host
        assert (cli.cwd / "every" / host / "runs" / "tb" / "events.txt").read_text() == \
            f"loss 0.1 on {host}\n"


def test_a_path_or_a_run_no_longer_there_is_named(bed: tuple[Testbed, CLI, str]) -> None:
    tb, cli, run_id = bed
    r = cli("pull", run_id, "no/such.pt", "--to", "missing")
    assert r.returncode == 1
    assert re.search(r"node1 +\S+/no/such\.pt is not there", r.stderr), r.stderr
    assert not (cli.cwd / "missing").exists()  # nothing came: no folder made, not even its mark
    bad = cli("pull", run_id, "../etc/passwd")
    assert bad.returncode == 2 and "'..'" in bad.stderr
    rec = json.loads((record(cli, run_id) / "run.json").read_text())
    run_dir = next(n["run_dir"] for n in rec["nodes"] if n["host"]["name"] == "node2")
    tb.exec("node2", "rm", "-rf", run_dir.replace("~", str(tb.host("node2").home), 1))
    gone = cli("pull", run_id, "--all", "--to", "gone")
    assert gone.returncode == 1, gone.stderr
    assert re.search(r"node2 +no longer has the run: \S+/runs/" + run_id, gone.stderr), \
        gone.stderr
    assert (cli.cwd / "gone" / "node1" / "checkpoints" / "model.pt").exists()


def test_a_default_pull_inside_the_job_folder_is_not_sent_again_by_up(
        bed: tuple[Testbed, CLI, str], tmp_path: Path) -> None:
    """The first hour's end: `fleet pull` run in the job's folder puts ./<run id>/ inside the
    workdir; the next `fleet up` names it and leaves it out, and no node receives it."""
    tb, _, _ = bed
    cli = CLI(tmp_path)  # the job's folder is the workdir, and where the user stands
    tb.inventory(tmp_path / "inv.toml", ["node1"])
    (tmp_path / "write.py").write_text(
        'import os\nos.makedirs("checkpoints", exist_ok=True)\n'
        'open("checkpoints/model.pt", "w").write("weights")\n')
    (tmp_path / "job.toml").write_text(
        'inventory = "inv.toml"\nworkdir = "."\nexclude = ["/.fleet"]\n'
        'launcher = "command"\ncommand = ["{python}", "write.py"]\nnproc_per_node = 1\n'
        'outputs = ["checkpoints/"]\n[rendezvous]\nport = 29563\n')
    first = cli("up", "job.toml", timeout=300)
    assert first.returncode == 0, first.stderr
    run_id = next((tmp_path / ".fleet").rglob("run.json")).parent.name
    r = cli("pull")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / run_id / "checkpoints" / "model.pt").read_text() == "weights"
    assert (tmp_path / run_id / ".fleet-pulled").exists()
    again = cli("up", "job.toml", timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"not sent: {tmp_path / run_id}: results of `fleet pull`" in again.stderr, \
        again.stderr
    second = max((tmp_path / ".fleet").rglob("run.json"), key=lambda p: p.stat().st_mtime)
    node = code_dir(tb, cli, second.parent.name, "node1")
    assert (node / "write.py").exists() and (node / "checkpoints" / "model.pt").exists()
    assert not (node / run_id).exists(), sorted(p.name for p in node.iterdir())

# ---- a compromised node ------------------------------------------------------------------------
# node1's python, as its inventory names it: the real one, until the test compromises the node
# (writes a word into LIES); then its `ferry send` is a program that answers as it likes.
PYTHON = """#!/bin/sh
if [ "$3" = send ] && [ -s {lies} ]; then exec {real} {liar} "$@"; fi
exec {real} "$@"
"""

# A `ferry send` that lies: for the first file asked, 64 MiB where the listing said 13 bytes, in
# frames that are otherwise well formed (the right sha256 of what it sends).
LIAR = """\
import hashlib, json, struct, sys
out = sys.stdout.buffer
item = json.loads(sys.stdin.readline())[0]
path = item["path"] if isinstance(item, dict) else item
def frame(kind, payload):
    out.write(struct.pack(">cI", kind, len(payload)) + payload)
out.write(b"\\n" + sys.argv[5].encode() + b"\\n")
block, n = b"x" * (1 << 20), 64
frame(b"F", json.dumps({"root": 0, "path": path, "size": n * len(block), "mode": 0o644,
                        "mtime": 0, "blocks": None, "for": [0]}).encode())
whole = hashlib.sha256()
for _ in range(n):
    whole.update(block)
    frame(b"D", block)
frame(b"E", json.dumps({"sha256": whole.hexdigest()}).encode())
frame(b"Z", b"")
out.flush()
"""


@pytest.fixture(scope="module")
def hostile(tb2: Testbed, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Testbed, CLI, str, Path]]:
    """A finished run on node1 alone, whose job left out/small.txt (13 bytes), node1's python
    a program the test can turn into a liar (the file LIES, empty: honest)."""
    here = tmp_path_factory.mktemp("hostile")
    cli = CLI(here)
    lies = tb2.dir / "node1-lies"
    lies.write_text("")
    liar = tb2.dir / "node1-liar.py"
    liar.write_text(LIAR)
    python = tb2.dir / "node1-python"
    python.write_text(PYTHON.format(lies=lies, real=sys.executable, liar=liar))
    python.chmod(0o755)
    (here / "code").mkdir()
    tb2.inventory(here / "inv.toml", ["node1"], python=str(python))
    (here / "job.toml").write_text(
        'inventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
        'command = ["sh", "-c", "mkdir -p out && printf \'hello, world\\\\n\' > out/small.txt"]\n'
        'nproc_per_node = 1\noutputs = ["out/"]\n[rendezvous]\nport = 29562\n')
    r = cli("up", str(here / "job.toml"), timeout=300)
    assert r.returncode == 0, r.stderr
    run_id = next((here / ".fleet").rglob("run.json")).parent.name
    assert (code_dir(tb2, cli, run_id, "node1") / "out" / "small.txt").stat().st_size == 13
    yield tb2, cli, run_id, lies


def test_a_node_that_sends_more_than_it_listed_is_named_and_nothing_of_it_is_kept(
        hostile: tuple[Testbed, CLI, str, Path]) -> None:
    tb, cli, run_id, lies = hostile
    lies.write_text("64 MiB for 13 bytes")
    try:
        r = cli("pull", run_id, "out/small.txt", "--to", "overrun")
    finally:
        lies.write_text("")
    assert r.returncode == 1, r.stderr
    assert re.search(r"node1 +broke the protocol sending files from \S+: it sent more "
                     r"than it listed: out/small\.txt was listed at 13 bytes, and it began "
                     r"sending 64\.0 MiB; nothing of that file was kept", r.stderr), r.stderr
    dest = cli.cwd / "overrun"
    assert not [p for p in dest.rglob("*")  # no file, no partial file: only the pull's mark
                if p.is_file() and p.name != ".fleet-pulled"]
    shown = cli("show", run_id)
    assert "outputs: out; not pulled yet" in shown.stdout, shown.stdout


def test_a_link_in_the_destination_is_named_as_this_machines_own(
        hostile: tuple[Testbed, CLI, str, Path]) -> None:
    tb, cli, run_id, _ = hostile
    dest, outside = cli.cwd / "linked", cli.cwd / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "out").symlink_to(outside)
    r = cli("pull", run_id, "--to", str(dest))
    assert r.returncode == 1, r.stderr
    assert f"{dest}/out: a symbolic link on this machine, in the destination" in r.stderr, \
        r.stderr
    assert "broke the protocol" not in r.stderr
    assert not list(outside.iterdir())
    (cli.cwd / "a-file").write_text("")
    (cli.cwd / "dangling").symlink_to(cli.cwd / "gone")
    for bad in ("a-file", "dangling"):
        r = cli("pull", run_id, "--to", bad)
        assert r.returncode == 2 and f"--to {bad}: not a directory" in r.stderr, r.stderr


def test_a_pulled_name_cannot_forge_a_line_of_show(hostile: tuple[Testbed, CLI, str, Path]
                                                   ) -> None:
    tb, cli, run_id, _ = hostile
    forged = "    forged.pt  1.0 GiB"  # a line of its own, were the name printed raw
    (code_dir(tb, cli, run_id, "node1") / "out" / f"a\n{forged}\nb").write_text("x")
    r = cli("pull", run_id, "--to", "named")
    assert r.returncode == 0, r.stderr
    shown = cli("show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert forged not in shown.stdout.splitlines(), shown.stdout
    assert f"    out/a^J{forged}^Jb  1 bytes" in shown.stdout.splitlines(), shown.stdout
