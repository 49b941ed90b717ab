"""What gets synced, end to end through the real CLI on testbed hosts: files .gitignore and
.fleetignore name never reach a node, and `fleet plan` says so with sizes; a file an earlier
sync put there and this one no longer sends (ignored, or deleted here) is removed from the
node's code directory, while what the job wrote there stays; `fleet diff` says an added
argument once for every node; `fleet show --json` lists each node's installed packages."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Says what the job's directory holds on the node, whether a stale package would still import,
# and leaves a file of its own there (a job's output, which no sync may remove).
TRAIN = '''
import os, sys
for root, dirs, files in sorted(os.walk(".")):
    for name in sorted(files):
        print("seen", os.path.join(root, name)[2:], flush=True)
try:
    import pkg
    print("pkg importable", flush=True)
except ImportError:
    print("pkg absent", flush=True)
with open("job_output.txt", "a") as f:
    f.write("written by the job\\n")
print("args", *sys.argv[1:], flush=True)
'''
TYPOS = [f"typo{i}.toml" for i in range(1, 8)]


def workdir(root: Path) -> Path:
    code = root / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "build").mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "pkg" / "__init__.py").write_text("")
    (code / "pkg" / "old.py").write_text("OLD = 1\n")
    (code / "helper.py").write_text("H = 2\n")
    (code / "weights.bin").write_bytes(b"w" * 300_000)
    (code / "build" / "out.o").write_bytes(b"o" * 5000)
    (code / "model.ckpt").write_bytes(b"c" * 7000)
    for name in TYPOS:
        (code / name).write_text("nproc_per_nod = 2\n")
    (code / ".gitignore").write_text("typo*.toml\nbuild/\n")
    (code / ".fleetignore").write_text("*.ckpt\n")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    return code


def seen(stdout: str, host: str) -> set[str]:
    return {line.split(" | seen ", 1)[1] for line in stdout.splitlines()
            if line.startswith(f"{host} ") and " | seen " in line}


def said(stdout: str, host: str, what: str) -> bool:
    return any(line.startswith(f"{host} ") and line.endswith(f" | {what}")
               for line in stdout.splitlines())


def test_ignored_files_never_reach_a_node_and_stale_ones_are_removed(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    code = workdir(tmp_path)
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nscript = "train.py"\n'
                   'nproc_per_node = 1\n[rendezvous]\nport = 29741\n')

    # `fleet plan`: what would be synced, with sizes, and what is ignored by which file;
    # it connects to nothing.
    plan = cli("plan", str(job))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    sizes = {p: (code / p).stat().st_size for p in
             ("train.py", "pkg/__init__.py", "pkg/old.py", "helper.py", "weights.bin",
              ".gitignore", ".fleetignore")}
    total = sum(sizes.values())
    assert f"code to sync: 7 file(s), {total / 1024:.1f} KiB from {code} (largest: " \
           "weights.bin 293.0 KiB, train.py " in plan.stdout, plan.stdout
    assert "  ignored by .gitignore: 8 (build/, typo1.toml, typo2.toml and 5 more)" in \
        plan.stdout, plan.stdout
    assert "  ignored by .fleetignore: 1 (model.ckpt)" in plan.stdout, plan.stdout
    assert "connected" not in plan.stderr
    js = json.loads(cli("plan", str(job), "--json").stdout)["sync"]
    assert js["files"] == 7 and js["bytes"] == total
    assert js["largest"][0] == {"path": "weights.bin", "bytes": 300_000}
    assert sorted(i["path"] for i in js["ignored"] if i["by"] == ".gitignore") == \
        ["build/", *TYPOS]

    first = cli("up", str(job), timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "fleet: not sent: 8 path(s) by .gitignore, 1 by .fleetignore" in first.stderr
    for host in ("node1", "node2"):
        files = seen(first.stdout, host)
        assert {"train.py", "pkg/old.py", "helper.py", "weights.bin"} <= files, files
        assert not any(f.startswith(("typo", "build", "model.ckpt")) for f in files), files
        assert said(first.stdout, host, "pkg importable")
    node_code = [next((h.home / "fleet" / "code").iterdir()) for h in tb2.hosts]
    for d in node_code:  # the import left bytecode beside the package
        assert list((d / "pkg" / "__pycache__").glob("__init__.*.pyc")), list(d.rglob("*"))

    # The package deleted here, a helper now ignored: both go from the nodes; what the job
    # wrote there stays. One argument added: `fleet diff` says it once.
    for p in ("old.py", "__init__.py"):
        (code / "pkg" / p).unlink()
    (code / "pkg").rmdir()
    (code / ".fleetignore").write_text("*.ckpt\nhelper.py\n")
    second = cli("up", str(job), "--", "--resume", timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    for host in ("node1", "node2"):
        assert f"fleet: {host}  code: removed 3 file(s) an earlier sync left that are no " \
               "longer synced (deleted or ignored here)" in second.stderr, second.stderr
        files = seen(second.stdout, host)
        assert "job_output.txt" in files and "train.py" in files, files
        assert not any(f.startswith(("pkg", "helper")) for f in files), files
        assert said(second.stdout, host, "pkg absent"), second.stdout
        assert said(second.stdout, host, "args --resume"), second.stdout
    for d in node_code:
        assert not (d / "pkg").exists() and (d / "job_output.txt").exists()

    a, b = run_id_of(first.stderr), run_id_of(second.stderr)
    diff = cli("diff", a, b)
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.count("--resume") == 1, diff.stdout
    assert "on every node (2): command: … train.py {+--resume+}" in diff.stdout.splitlines()
    for gone in ("helper.py", "pkg/__init__.py", "pkg/old.py"):
        assert f"file {gone}: removed" in diff.stdout, diff.stdout


def test_show_records_each_nodes_installed_packages(cli: CLI, tb2: Testbed,
                                                    tmp_path: Path) -> None:
    """The job's interpreter's `pip freeze`: the list and its hash in the manifest, a count
    and the hash in `fleet show`'s text."""
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('ok')\n")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nscript = "train.py"\n'
                   'nproc_per_node = 1\n[rendezvous]\nport = 29742\n')
    r = cli("up", str(job), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    run = run_id_of(r.stderr)
    m = json.loads(cli("show", run, "--json").stdout)
    torch = f"torch=={importlib.metadata.version('torch')}"
    for host in ("node1", "node2"):
        packages = m["nodes"][host]["packages"]
        assert torch in packages["list"] and packages["count"] == len(packages["list"])
        text = "".join(f"{p}\n" for p in packages["list"])
        assert packages["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    shown = cli("show", run).stdout
    assert re.search(r"^  packages: \d+ installed \(sha256 [0-9a-f]{12}; `fleet show --json` "
                     r"lists them\)$", shown, re.M), shown
    assert "torch==" not in shown


def test_a_script_an_ignore_file_leaves_out_stops_before_any_host(cli: CLI, tb2: Testbed,
                                                                  tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print('ok')\n")
    (code / ".gitignore").write_text("*.py\n")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nscript = "train.py"\n'
                   'nproc_per_node = 1\n[rendezvous]\nport = 29743\n')
    for command in ("plan", "up"):
        r = cli(command, str(job), timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{job}: script: train.py is left out of the sync by {code / '.gitignore'}; " \
               f"send it with a line `!train.py` in {code / '.fleetignore'}" in r.stderr, r.stderr
        assert "connected" not in r.stderr
    (code / ".fleetignore").write_text("!train.py\n")
    r = cli("up", str(job), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "node1 r0 | ok" in r.stdout, r.stdout
