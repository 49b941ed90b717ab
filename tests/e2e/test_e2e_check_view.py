"""`fleet check` as a person and a script see it, end to end: problems first with the advice
that matches the real cause (a key fleet does not know, a key that changed), passing checks
folded per host, every row with -v, and a spinner on a terminal that counts the hosts done."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_labs import allreduce_job
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


def rows(stdout: str) -> list[tuple[str, str, str, str]]:
    """The table's rows (host, check, status, detail), fix lines left out."""
    found = re.findall(r"^((?:\S+, )*\S+)\s+(.+?)\s+(PASS|WARN|FAIL)\s+(.*)$", stdout, re.M)
    return [(h, c, s, d) for h, c, s, d in found if h != "HOST"]


def known_hosts_without(tb: Testbed, path: Path, name: str, instead: str = "") -> Path:
    """The testbed's known_hosts without `name`'s key (or with `instead` in its place)."""
    addr = tb.host(name).addr
    kept = [line for line in tb.known_hosts.read_text().splitlines()
            if line.split()[0] != addr]
    path.write_text("\n".join(kept + ([f"{addr} {instead}"] if instead else [])) + "\n")
    return path


def test_unknown_key_advises_trust_with_the_users_own_file(cli: CLI, tb2: Testbed,
                                                           tmp_path: Path) -> None:
    """node1's sshd runs fine; only its key is unknown. The advice is `fleet trust` with the
    job file the user passed (as the user wrote it), never "check that sshd runs"."""
    known = known_hosts_without(tb2, tmp_path / "known_hosts", "node1")
    tb2.inventory(tmp_path / "inv.toml", known_hosts=str(known))
    allreduce_job(tmp_path, 29581)
    r = cli("check", "ar.toml")  # relative to the CLI's working directory, tmp_path
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert re.match(r"^node1\s+ssh\s+FAIL\s+unknown host key for \S+ \(ssh-ed25519 SHA256:",
                    lines[1]), r.stdout
    assert re.match(r"^\s+fix: sshd answered, but fleet does not know its key yet: "
                    r"`fleet trust ar\.toml` shows the fingerprint; if it is the host's, "
                    r"record it with `fleet trust ar\.toml --accept`$", lines[2]), r.stdout
    assert "sshd runs" not in r.stdout and "INVENTORY" not in r.stdout
    # node2 connected (its checks end there: the master is unknown): folded into one line.
    assert re.search(r"^node2\s+2 passed\s+PASS\s+ssh, sftp$", r.stdout, re.M), r.stdout
    assert re.search(r"^1 failed, 0 warning\(s\), 2 passed$", r.stdout, re.M), r.stdout


def test_changed_key_names_the_known_hosts_line(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    other = tb2.host("node2").host_key_pub
    known = known_hosts_without(tb2, tmp_path / "known_hosts", "node1",
                                instead=f"ssh-ed25519 {other}")
    tb2.inventory(tmp_path / "inv.toml", known_hosts=str(known))
    job = allreduce_job(tmp_path, 29582)
    r = cli("check", str(job))
    assert r.returncode == 1, r.stdout + r.stderr
    number = len(known.read_text().splitlines())  # node1's line is the last
    addr = tb2.host("node1").addr
    assert re.search(r"^node1\s+ssh\s+FAIL\s+HOST KEY CHANGED for \S+: got ssh-ed25519",
                     r.stdout, re.M), r.stdout
    assert (f"remove line {number} of {known} (`ssh-keygen -R '{addr}' -f {known}`) and record "
            f"the new one with `fleet trust {job} --accept`") in r.stdout, r.stdout
    assert "sshd runs" not in r.stdout


def test_folded_by_default_every_row_with_verbose_and_a_spinner_on_a_terminal(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = allreduce_job(tmp_path, 29583)
    # stderr a terminal (the spinner's), stdout a pipe (the table, plain for scripts).
    parent, child = pty.openpty()
    env = {**cli.env, "TERM": "xterm", "COLUMNS": "80"}
    env.pop("FLEET_PLAIN", None)
    p = subprocess.Popen([sys.executable, "-m", "fleet", "check", str(job)], cwd=cli.cwd,
                         env=env, stdout=subprocess.PIPE, stderr=child, text=True,
                         stdin=subprocess.DEVNULL)
    os.close(child)
    said = b""
    while True:
        try:
            chunk = os.read(parent, 4096)
        except OSError:  # the terminal's other end closed: the command ended
            break
        if not chunk:
            break
        said += chunk
    folded = p.communicate(timeout=300)[0]
    os.close(parent)
    assert p.returncode == 0, folded + said.decode(errors="replace")
    spinner = said.decode(errors="replace")
    for n in range(3):  # the count, drawn as each host is done
        assert f"waiting: check {n}/2 hosts done" in spinner, spinner
    assert "checking port 29583 between the hosts" in spinner
    assert spinner.endswith("\r\x1b[K"), spinner[-80:]  # erased at the end: nothing left over
    assert "\x1b" not in folded and "checking" not in folded  # stdout: plain, no spinner

    full = cli("check", "-v", str(job))
    assert full.returncode == 0, full.stdout + full.stderr
    every = rows(full.stdout)
    for host in ("node1", "node2"):
        passed = [c for h, c, s, _ in every if h == host and s == "PASS"]
        assert passed[:2] == ["ssh", "sftp"], every
        names = re.escape(", ".join(passed))
        assert re.search(rf"^{host}\s+{len(passed)} passed\s+PASS\s+{names}$", folded, re.M), \
            folded
    problems = [(h, c, s) for h, c, s, _ in every if s != "PASS"]
    shown = [(h, c, s) for hs, c, s, _ in rows(folded) if s != "PASS" for h in hs.split(", ")]
    # problems first, all of them (the same words on both hosts: one row naming both)
    assert sorted(shown) == sorted(problems)
    statuses = [s for _, _, s in problems]
    assert [s for _, _, s in shown] == sorted(statuses, key=lambda s: s != "FAIL")
    grouped = {(c, s, d) for _, c, s, d in every if s != "PASS"}
    assert len(rows(folded)) == len(grouped) + 2  # and one line per host for the rest
    tally = re.search(r"^0 failed, (\d+) warning\(s\), (\d+) passed$", folded, re.M)
    assert tally and folded.count("\n0 failed") == 1
    assert int(tally[2]) == sum(s == "PASS" for _, _, s, _ in every), folded


def test_slurm_login_node_with_an_unknown_key_gets_the_same_advice(cli: CLI, tb2: Testbed,
                                                                   tmp_path: Path) -> None:
    """A Slurm cluster's check goes through the same view and advice: the login node's key is
    unknown; the command names the job and the inventory the user gave on the command line."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'[slurm]\nlogin = "{tb2.hosts[0].addr}"\nuser = "{tb2.user}"\n'
                       f'identity = "{tb2.key}"\nknown_hosts = "{known}"\nnodes = 2\n')
    job = allreduce_job(tmp_path, 29584)
    r = cli("check", str(job), "-i", "cluster.toml")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"^login\s+ssh\s+FAIL\s+unknown host key for ", r.stdout, re.M), r.stdout
    assert f"record it with `fleet trust {job} --inventory cluster.toml --accept`" in r.stdout
    assert re.search(r"^1 failed, 0 warning\(s\), 0 passed$", r.stdout, re.M), r.stdout
