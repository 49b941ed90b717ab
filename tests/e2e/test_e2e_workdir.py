"""A workdir as users have them, end to end through the real CLI: links, special files, sparse
and unreadable files each get the rule docs/JOBS.md's "What is synced" states, said by name, and
the manifest records the bytes the nodes received, not the local files as they are later."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_no_strays, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Lists what the job's working directory holds on the node, with each file's sha256.
LIST = '''
import hashlib, os
for root, dirs, files in sorted(os.walk(".")):
    for name in sorted(files):
        path = os.path.join(root, name)[2:]
        if path.startswith(".fleet") or "__pycache__" in path:
            continue
        kind = "link" if os.path.islink(path) else "file"
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
        print(f"seen {path} {kind} {os.path.getsize(path)} {digest}", flush=True)
'''


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def job(tmp_path: Path, code: Path, port: int, extra: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f'inventory = "inv.toml"\nworkdir = "{code.name}"\nscript = "list.py"\n'
                    f'nproc_per_node = 1\n{extra}[rendezvous]\nport = {port}\n')
    return path


def test_links_special_and_sparse_files_follow_one_rule_each(cli: CLI, tb2: Testbed,
                                                            tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "list.py").write_text(LIST)
    (code / "pkg" / "model.py").write_text("WEIGHTS = 42\n")
    secret = tmp_path / "outside" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY\n")
    os.symlink("pkg/model.py", code / "model_link.py")  # a file inside: followed
    os.symlink("pkg", code / "pkg_link")  # a directory inside: followed
    os.symlink(secret.parent, code / "keys")  # outside the workdir: never sent
    os.symlink("nowhere.py", code / "dangling.py")
    os.symlink(".", code / "pkg" / "loop")  # a directory holding itself
    os.mkfifo(code / "pipe")  # reading it would block forever
    with open(code / "sparse.img", "wb") as f:
        f.truncate(8 << 20)  # 8 MiB, nothing on disk
    r = cli("up", str(job(tmp_path, code, 29721)), timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for name, why in (("keys", f"a link to {secret.parent}, outside"),
                      ("dangling.py", "a dangling link (to nowhere.py)"),
                      ("pkg/loop", "a link to a directory that holds it (a loop)"),
                      ("pipe", "a FIFO: only regular files are sent")):
        assert f"not sent: {code / name}: {why}" in r.stderr, out
    assert f"note: {code / 'sparse.img'} is sparse: it is sent whole and arrives dense" in \
        r.stderr, out
    model = sha(code / "pkg" / "model.py")
    for host in ("node1", "node2"):
        seen = {w[1]: w[2:] for line in r.stdout.splitlines()
                if line.startswith(f"{host} ") and " | seen " in line
                for w in [line.split(" | ", 1)[1].split()]}
        assert seen["model_link.py"] == ["file", "13", model], seen  # content, not a link
        assert seen["pkg_link/model.py"] == ["file", "13", model], seen
        assert seen["sparse.img"][:2] == ["file", str(8 << 20)], seen
        assert not any(p.startswith(("keys", "dangling", "pipe", "pkg/loop")) for p in seen), seen
    shown = json.loads(cli("show", "--json", run_id_of(r.stderr)).stdout)
    assert shown["files"]["model_link.py"] == shown["files"]["pkg/model.py"] == model
    assert shown["files"]["sparse.img"] == sha(code / "sparse.img")  # every file hashed
    assert "keys/id_ed25519" not in shown["files"] and "pipe" not in shown["files"]


def test_an_unreadable_file_is_refused_before_any_host_is_touched(cli: CLI, tb2: Testbed,
                                                                 tmp_path: Path) -> None:
    """As a user without root's right to read everything (root with CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH dropped, so a mode-000 file is unreadable to it too)."""
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "list.py").write_text(LIST)
    (code / "weights.bin").write_bytes(b"x" * 100)
    (code / "weights.bin").chmod(0)
    def runs() -> list[list[Path]]:
        return [sorted((h.home / "fleet" / "runs").glob("*")) for h in tb2.hosts]

    before = runs()
    r = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                        sys.executable, "-m", "fleet", "up", str(job(tmp_path, code, 29722))],
                       cwd=cli.cwd, env=cli.env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)  # timeout: a hang guard
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{code}: cannot read weights.bin (permission denied); make them readable, or " \
           "leave them out with `exclude = [...]`" in r.stderr, r.stderr
    # refused before any host: no connection said, no run directory made (below)
    assert "nothing was started" in r.stderr and "connected" not in r.stderr, r.stderr
    assert_no_strays(tb2)
    assert runs() == before  # no run directory made anywhere


def test_manifest_records_the_bytes_sent_not_a_later_edit(cli: CLI, tb2: Testbed,
                                                         tmp_path: Path) -> None:
    """The local file is edited while the nodes run the job's setup: the manifest still holds
    the hash of what the nodes received (the old manifest hashed the local files after setup,
    recording code that never ran)."""
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "list.py").write_text(LIST)
    (code / "train_cfg.py").write_text("LR = 0.1\n")
    sent = sha(code / "train_cfg.py")
    resume = tmp_path / "resume"
    cli.env.update(FLEET_FAULT="setup:pause", FLEET_FAULT_RESUME=str(resume))
    proc = cli.popen("up", str(job(tmp_path, code, 29723, 'setup = "echo setting up"\n')))
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            if "fault point setup reached" in line or time.monotonic() > deadline:
                break
        (code / "train_cfg.py").write_text("LR = 0.5  # edited during the setup\n")
        resume.touch()
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
        del cli.env["FLEET_FAULT"], cli.env["FLEET_FAULT_RESUME"]
    assert proc.returncode == 0, out + err
    run_id = next((cli.cwd / ".fleet" / "runs").iterdir()).name
    shown = json.loads(cli("show", "--json", run_id).stdout)
    node = [line for line in out.splitlines() if line.startswith("node1 ") and
            " seen train_cfg.py " in line]
    assert node and node[0].split()[-1] == sent, out  # what the node ran
    assert shown["files"]["train_cfg.py"] == sent != sha(code / "train_cfg.py")


def test_fifo_workdir_interrupted_and_killed_before_any_start(cli: CLI, tb2: Testbed,
                                                              tmp_path: Path) -> None:
    """A FIFO in the workdir no longer blocks a thread (it is skipped), so Ctrl-C ends the
    launch at once; a fleet killed before it started any node leaves a run that says so
    (`never started`, exit 1), and its claim on the hosts went with its connection."""
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "list.py").write_text(LIST)
    os.mkfifo(code / "pipe")
    path = job(tmp_path, code, 29724)
    cli.env["FLEET_FAULT"] = "upload:int"
    r = cli("up", str(path), timeout=60)  # a hang guard: a FIFO read would block for good
    assert r.returncode == 130, r.stdout + r.stderr
    assert "nothing had been started on any node" in r.stderr, r.stderr
    assert_no_strays(tb2)
    cli.env["FLEET_FAULT"] = "upload:kill"
    killed = cli("up", str(path), timeout=120)
    del cli.env["FLEET_FAULT"]
    assert killed.returncode == -9, killed.stdout + killed.stderr
    run_id = run_id_of(killed.stderr)
    st = cli("status", run_id)
    assert st.returncode == 1, st.stdout + st.stderr
    assert f"run {run_id} " in st.stdout and ": never started" in st.stdout, st.stdout
    assert "ended (it was killed, or its machine stopped) before it started any node" in st.stdout
    assert re.search(rf"^{run_id}\s+never started", cli("ps").stdout, re.M)
    again = cli("up", str(path), timeout=180)  # the killed launch's claim is gone
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_partition_during_the_upload_is_named_within_the_deadline(cli: CLI,
                                                                    tmp_path: Path) -> None:
    """node2's link is cut while its data is on the way (TCP alone would wait ~15 min): the
    write stops moving, fleet names node2 after its stall limit, and nothing is left."""
    from tests.conftest import _need_testbed

    _need_testbed()
    with Testbed(2) as tb:
        tb.inventory(tmp_path / "inv.toml")
        code = tmp_path / "code"
        code.mkdir()
        (code / "list.py").write_text(LIST)
        (code / "weights.bin").write_bytes(os.urandom(64 << 20))  # more than the pipes hold
        resume = tmp_path / "resume"
        cli.env.update(FLEET_FAULT="upload-listed:pause", FLEET_FAULT_RESUME=str(resume))
        proc = cli.popen("up", str(job(tmp_path, code, 29725)))
        node2 = tb.host("node2")
        try:
            assert proc.stderr is not None
            seen, head = 0, []
            deadline = time.monotonic() + 120
            for line in proc.stderr:
                head.append(line)
                seen += "fault point upload-listed reached" in line
                if seen == 2 or time.monotonic() > deadline:
                    break
            t0 = time.monotonic()
            resume.touch()
            # Cut once node2's copy has begun to arrive (streamed, 64 MiB): mid-write.
            partial = node2.home / "fleet"
            while not any(p.stat().st_size > 0 for p in partial.rglob("*.fleet-part")):
                assert time.monotonic() - t0 < 120 and proc.poll() is None, "no write began"
                time.sleep(0.05)
            subprocess.run(["ip", "link", "set", node2.veth, "down"], check=True)
            out, err = proc.communicate(timeout=120)  # a hang guard: TCP alone waits ~15 min
        finally:
            if proc.poll() is None:
                proc.kill()
            subprocess.run(["ip", "link", "set", node2.veth, "master", tb.bridge, "up"],
                           check=True)
            del cli.env["FLEET_FAULT"], cli.env["FLEET_FAULT_RESUME"]
        assert proc.returncode == 3, out + err
        # named by fleet's own 25 s stall limit, not by TCP's timeout
        assert re.search(r"node2: no progress for 25s while data was sent: it stopped answering",
                         err), err
        assert "nothing was started" in err and "started master" not in err, err
        assert_no_strays(tb, timeout=30)
        run_id = run_id_of("".join(head))
        assert not (tb.hosts[0].home / "fleet" / "runs" / run_id).exists()
