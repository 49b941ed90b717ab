"""Node setup and run manifests end to end through the real CLI: a setup that makes a venv on
every node and installs a local package into it (no network: the wheel travels with the code),
a job that imports it from that venv's python; a second `up` skips setup; a changed input
re-runs it; a setup failing on one node starts nothing anywhere; `fleet show` and `fleet diff`
on runs with a changed env value and a dirty tree."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

WHEEL = "greet-1.0-py3-none-any.whl"
TRAIN = '''
import sys
import torch.distributed as dist
import greet
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: {greet.hello()} via {sys.executable}", flush=True)
# Every rank is past its init before any leaves: without it a rank that connected first could
# exit while its peer was still connecting (Gloo: "Connection closed by peer", seen in CI).
dist.barrier()
dist.destroy_process_group()
'''
SETUP = '''
"$FLEET_PYTHON" -m venv .venv
# The node's torch, seen from the new venv (a lab's shared install; no download here).
here=$(.venv/bin/python -c 'import site; print(site.getsitepackages()[0])')
"$FLEET_PYTHON" -c 'import site; print(site.getsitepackages()[0])' > "$here/node-torch.pth"
pip="--no-index --force-reinstall --quiet --disable-pip-version-check"
.venv/bin/pip install $pip greet-1.0-py3-none-any.whl
echo "venv ready on $FLEET_NODE"
'''


def wheel(path: Path, greeting: str) -> None:
    """A pure-Python wheel of package `greet`, made here: pip installs it without a network."""
    files = {"greet/__init__.py": f"def hello():\n    return {greeting!r}\n",
             "greet-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: greet\nVersion: 1.0\n",
             "greet-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: fleet-tests\n"
                                          "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(text.encode())}")
    files["greet-1.0.dist-info/RECORD"] = "\n".join(record + ["greet-1.0.dist-info/RECORD,,"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def job_code(tmp_path: Path, greeting: str) -> Path:
    """The job's workdir: train.py and the greet wheel its setup installs."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    wheel(code / WHEEL, greeting)
    return code


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def job_text(env: str, setup: str = SETUP, port: int = 29561) -> str:
    return ('inventory = "inv.toml"\nworkdir = "code"\nscript = "train.py"\n'
            'python = ".venv/bin/python"\n'
            f'setup = """{setup}"""\nsetup_inputs = ["{WHEEL}"]\n'
            f"[env]\n{env}\n[rendezvous]\nport = {port}\n")


def test_setup_once_then_skipped_rerun_on_change_and_manifests(cli: CLI, tb2: Testbed,
                                                               tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    code = job_code(tmp_path, "hello from greet")
    git(code, "init", "-q")
    git(code, "add", ".")
    git(code, "commit", "-qm", "greet 1.0")
    job = tmp_path / "job.toml"
    job.write_text(job_text('LR = "0.1"'))

    plan = cli("plan", str(job))
    assert "setup:     runs unless it already succeeded here" in plan.stdout, plan.stdout
    first = cli("up", str(job), timeout=400)
    assert first.returncode == 0, first.stdout + first.stderr
    for node in ("node1", "node2"):
        assert f"{node} setup | venv ready on {node}" in first.stdout, first.stdout
        assert re.search(rf"{node}  setup: done", first.stderr)
    runs = re.findall(r"^node\d r(\d) \| rank \1: hello from greet via (\S+)$", first.stdout,
                      re.M)
    assert sorted(r for r, _ in runs) == ["0", "1"], first.stdout
    assert all(exe.endswith("/.venv/bin/python") and "/code/job-" in exe for _, exe in runs)

    second = cli("up", str(job), timeout=400)
    assert second.returncode == 0, second.stdout + second.stderr
    assert " setup | " not in second.stdout
    for node in ("node1", "node2"):
        assert f"{node}  setup: skipped (unchanged since it last succeeded here)" \
            in second.stderr, second.stderr
    probe = cli("plan", str(job), "--probe")
    assert probe.stdout.count("setup:     skipped (unchanged") == 2, probe.stdout

    # A changed input (and an env value): setup runs again, the job sees the new package.
    wheel(code / WHEEL, "hello from greet, rebuilt")
    job.write_text(job_text('LR = "0.2"'))
    third = cli("up", str(job), timeout=400)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "node2 setup | venv ready on node2" in third.stdout
    assert "hello from greet, rebuilt via" in third.stdout

    a, c = run_id_of(first.stderr), run_id_of(third.stderr)
    diff = cli("diff", a, c)
    assert diff.returncode == 0, diff.stderr
    # Said once for both nodes (identical changes across hosts are said once).
    for line in ("code: clean -> dirty", f"file {WHEEL}: changed",
                 "on every node (2): env LR 0.1 -> 0.2", "on every node (2): setup "):
        assert line in diff.stdout, diff.stdout
    assert "file train.py" not in diff.stdout and ": torch" not in diff.stdout
    show = cli("show", c)
    assert show.returncode == 0, show.stderr
    assert re.search(r"^code: commit [0-9a-f]{40}, dirty; 2 file\(s\) synced$", show.stdout,
                     re.M), show.stdout
    assert re.search(r"^\[node2\] node rank 1, .*python 3\.\d+\.\d+, torch \d", show.stdout, re.M)
    assert "  env LR=0.2" in show.stdout
    # The master keeps the manifest in its run directory too.
    kept = tb2.host("node1").home / "fleet" / "runs" / c / "node1" / "manifest.json"
    assert json.loads(kept.read_text())["run_id"] == c
    assert_nothing_left(tb2, c)


def test_a_setup_failing_on_one_node_starts_nothing_anywhere(cli: CLI, tb2: Testbed,
                                                             tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job_code(tmp_path, "unused")
    setup = ('echo "preparing $FLEET_NODE"\n[ "$FLEET_NODE" != node2 ] || '
             '{ echo "no space left for the wheel" >&2; exit 7; }\n')
    job = tmp_path / "job.toml"
    job.write_text(job_text('LR = "0.1"', setup, port=29562).replace(
        'python = ".venv/bin/python"\n', ""))
    r = cli("up", str(job))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "setup failed on 1 host(s); nothing was started:" in r.stderr, r.stderr
    assert re.search(r"node2: setup exited 7; its output ends:\n\s+preparing node2\n\s+no space "
                     r"left for the wheel", r.stderr), r.stderr
    assert "started master" not in r.stderr and "nothing had been started" in r.stderr
    run_id = run_id_of(r.stderr)
    for h in tb2.hosts:
        assert not (h.home / "fleet" / "runs" / run_id).exists()
    assert_nothing_left(tb2, run_id)


def test_an_interrupt_during_setup_leaves_nothing_running(cli: CLI, tb2: Testbed,
                                                          tmp_path: Path) -> None:
    """Ctrl-C while every node's setup runs (a long install, say): the setups are stopped,
    their directories removed, and the exit says nothing had started."""
    tb2.inventory(tmp_path / "inv.toml")
    job_code(tmp_path, "unused")
    job = tmp_path / "job.toml"
    job.write_text(job_text('LR = "0.1"', 'echo "installing on $FLEET_NODE"\nsleep 120\n',
                            port=29563).replace('python = ".venv/bin/python"\n', ""))
    cli.env["FLEET_FAULT"] = "setup:int"
    r = cli("up", str(job), timeout=120)
    assert r.returncode == 130, r.stdout + r.stderr
    assert "interrupted (SIGINT): nothing had been started on any node" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    run_id = run_id_of(r.stderr)
    assert_nothing_left(tb2, run_id)  # no setup shell, no sleep
    for h in tb2.hosts:
        assert not (h.home / "fleet" / "runs" / run_id).exists()
