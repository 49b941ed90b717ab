"""Trust and robustness end to end: host keys, ssh_config and a bastion, hostile input, faults."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, JOBS, _need_testbed
from tests.e2e.test_e2e_lifetime import long_job, wait_for
from tests.e2e.test_e2e_up import assert_no_strays, assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e


def plain_inventory(tb: Testbed, path: Path, extra: str = "", hosts: list[str] | None = None,
                    address: dict[str, str] | None = None) -> Path:
    """An inventory that says nothing about keys: ssh_config and known_hosts must do it."""
    lines = [f'[defaults]\npython = "{__import__("sys").executable}"\nconnect_timeout = 5.0\n'
             + extra]
    for name in hosts or [h.name for h in tb.hosts]:
        addr = (address or {}).get(name, tb.host(name).addr)
        lines.append(f'[[hosts]]\nname = "{name}"\naddress = "{addr}"\n')
    path.write_text("\n".join(lines))
    return path


def home_with_ssh_config(cli: CLI, tb: Testbed, tmp_path: Path, extra: str = "") -> Path:
    home = tmp_path / "home"
    cfg = tb.ssh_config(home / ".ssh" / "config")
    if extra:
        cfg.write_text(extra + cfg.read_text())
    cli.env["HOME"] = str(home)
    return home


def test_trust_shows_fingerprints_and_records_accepted_keys(cli: CLI, tb2: Testbed,
                                                            tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    inv = tb2.inventory(tmp_path / "inv.toml", known_hosts=str(known))
    up = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert up.returncode == 3 and "unknown host key" in up.stderr
    assert "fleet trust" in up.stderr  # the message says how to trust it
    shown = cli("trust", str(inv))
    assert shown.returncode == 1, shown.stdout + shown.stderr
    for h in tb2.hosts:
        assert re.search(rf"^{h.name}\s+NEW\s+ssh-ed25519 SHA256:\S+", shown.stdout, re.M)
    assert known.read_text() == ""  # showing records nothing
    accepted = cli("trust", str(inv), "--accept")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert len(known.read_text().splitlines()) == 2
    again = cli("trust", str(inv))
    assert again.returncode == 0 and again.stdout.count("KNOWN") == 2, again.stdout
    assert cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv)).returncode == 0


def test_trust_a_slurm_clusters_login_node(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    """A [slurm] inventory's login node over SSH: the unknown key stops `fleet up` with the
    command that trusts it, and that command takes the cluster's inventory: recorded in
    known_hosts, or pinned under [slurm]."""
    from fleet.backends.slurm.cluster import load_cluster

    login = tb2.hosts[0]
    known = tmp_path / "known_hosts"
    known.write_text("")
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'[slurm]  # the lab cluster\nlogin = "{login.addr}"\n'
                       f'user = "{tb2.user}"\nidentity = "{tb2.key}"\n'
                       f'known_hosts = "{known}"\nnodes = 2\n')
    up = cli("up", str(JOBS / "allreduce.toml"), "-i", str(cluster))
    assert up.returncode == 3 and "unknown host key" in up.stderr, up.stdout + up.stderr
    assert f"fleet trust {cluster} --accept" in up.stderr  # the file the user gave
    shown = cli("trust", str(cluster))
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert re.search(r"^login\s+NEW\s+ssh-ed25519 SHA256:\S+", shown.stdout, re.M), shown.stdout
    accepted = cli("trust", str(cluster), "--accept")
    assert accepted.returncode == 0 and f"recorded 1 key(s) in {known}" in accepted.stdout
    again = cli("trust", str(cluster))
    assert again.returncode == 0 and re.search(r"^login\s+KNOWN", again.stdout, re.M)
    # Pinned in the inventory instead: under its [slurm] line, where fleet reads it.
    known.write_text("")
    pinned = cli("trust", str(cluster), "--accept", "--to", "inventory")
    assert pinned.returncode == 0 and "pinned 1 key(s)" in pinned.stdout, pinned.stdout
    c = load_cluster(cluster)
    assert c.login is not None and c.login.host_key == f"ssh-ed25519 {login.host_key_pub}"
    assert re.search(r"^login\s+KNOWN", cli("trust", str(cluster)).stdout, re.M)
    local = tmp_path / "local.toml"
    local.write_text('[slurm]\nlogin = "localhost"\n')
    here = cli("trust", str(local))
    assert here.returncode == 0 and "the login node is this machine" in here.stdout


def test_trust_records_where_ssh_config_says_fleet_reads(cli: CLI, tb2: Testbed,
                                                          tmp_path: Path) -> None:
    """ssh_config's UserKnownHostsFile replaces ~/.ssh/known_hosts: an accepted key goes there,
    where fleet (and ssh) will look for it, not to a file nobody reads."""
    home = home_with_ssh_config(cli, tb2, tmp_path)
    lab_known = tmp_path / "lab_known_hosts"
    lab_known.write_text("")
    cfg = home / ".ssh" / "config"
    cfg.write_text(cfg.read_text().replace(str(tb2.known_hosts), str(lab_known)))
    inv = plain_inventory(tb2, tmp_path / "inv.toml")
    accepted = cli("trust", str(inv), "--accept")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert f"recorded 2 key(s) in {lab_known}" in accepted.stdout, accepted.stdout
    assert not (home / ".ssh" / "known_hosts").exists()
    assert cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv)).returncode == 0


def test_keys_pinned_in_the_inventory(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    cli.env["HOME"] = str(tmp_path)  # no ~/.ssh/known_hosts at all
    inv = tb2.inventory(tmp_path / "inv.toml", known_hosts=str(tmp_path / "none"))
    r = cli("trust", str(inv), "--accept", "--to", "inventory")
    assert r.returncode == 0, r.stdout + r.stderr
    assert inv.read_text().count('host_key = "ssh-ed25519 ') == 2
    assert cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv)).returncode == 0
    # A pin that does not match is a changed key, refused loudly.
    wrong = inv.read_text().replace(tb2.hosts[0].host_key_pub, tb2.hosts[1].host_key_pub, 1)
    inv.write_text(wrong)
    bad = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert bad.returncode == 3
    assert f"node1: HOST KEY CHANGED for {tb2.hosts[0].addr}" in bad.stderr, bad.stderr
    shown = cli("trust", str(inv), "--accept")
    assert re.search(r"^node1\s+CHANGED", shown.stdout, re.M) and shown.returncode == 1


def test_ssh_config_alias_user_port_identity_and_accept_new(cli: CLI, tb2: Testbed,
                                                            tmp_path: Path) -> None:
    home = home_with_ssh_config(cli, tb2, tmp_path, extra=(
        f"Host n1\n  HostName {tb2.hosts[0].addr}\n  Port 22\n"
        f"Host n2\n  HostName {tb2.hosts[1].addr}\n"
        "  StrictHostKeyChecking accept-new\n  UserKnownHostsFile ~/.ssh/accepted\n"))
    inv = plain_inventory(tb2, tmp_path / "inv.toml", address={"node1": "n1", "node2": "n2"})
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("all_reduce = 10 ok") == 4
    # node2 was new to its known_hosts file and ssh_config says accept-new: recorded.
    assert tb2.hosts[1].host_key_pub in (home / ".ssh" / "accepted").read_text()


def test_ssh_config_no_checking_is_not_honoured(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    home_with_ssh_config(cli, tb2, tmp_path, extra=(
        "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"))
    inv = plain_inventory(tb2, tmp_path / "inv.toml", hosts=["node1"])
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 3 and "unknown host key" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def behind_bastion() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(2, bastion=True) as tb:
        yield tb


def test_proxyjump_through_a_bastion(cli: CLI, behind_bastion: Testbed, tmp_path: Path) -> None:
    tb = behind_bastion
    direct = subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/{tb.hosts[0].addr}/22"],
                            capture_output=True, timeout=10)
    assert direct.returncode != 0, "the hosts must be reachable only through the bastion"
    home_with_ssh_config(cli, tb, tmp_path)
    inv = plain_inventory(tb, tmp_path / "inv.toml")
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("all_reduce = 10 ok") == 4
    # The bastion's own key is checked too.
    (tmp_path / "home" / ".ssh" / "config").write_text(
        (tmp_path / "home" / ".ssh" / "config").read_text()
        .replace(str(tb.known_hosts), str(tmp_path / "empty_known_hosts")))
    (tmp_path / "empty_known_hosts").write_text("")
    bad = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert tb.bastion_host is not None
    assert bad.returncode == 3, bad.stderr
    assert f"unknown host key for {tb.bastion_host.addr}" in bad.stderr, bad.stderr


HOSTILE = ["it's", 'say "hi"', "$(touch PWNED)", "`touch PWNED2`", "a; touch PWNED3", "new\nline",
           "tab\there", "${HOME}", "*", "~", "--flag=1", "", "back\\slash", "ünï"]

ECHO = '''
import json, os, sys
print("ARGS " + json.dumps(sys.argv[1:]), flush=True)
print("ENV " + json.dumps({k: os.environ.get(k) for k in ("HOSTILE_1", "HOSTILE_2")}), flush=True)
'''


def test_hostile_strings_reach_the_script_literally(cli: CLI, tb2: Testbed,
                                                    tmp_path: Path) -> None:
    work = tmp_path / "work dir; $(touch PWNED4)"
    work.mkdir()
    (work / "echo me.py").write_text(ECHO)
    tb2.inventory(tmp_path / "inv.toml", workdir="~/fleet $(touch PWNED5) 'q'")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = ' + json.dumps(work.name) +
                   # args take {placeholders}: literal braces are doubled, as documented.
                   '\nscript = "echo me.py"\nargs = ' +
                   json.dumps([a.replace("{", "{{").replace("}", "}}") for a in HOSTILE]) +
                   '\n[env]\nHOSTILE_1 = ' + json.dumps(HOSTILE[2] + HOSTILE[5]) +
                   '\nHOSTILE_2 = ' + json.dumps(HOSTILE[1] + HOSTILE[4]) + "\n")
    r = cli("up", str(job), "--", "$(touch PWNED6)", "{x}")
    assert r.returncode == 0, r.stdout + r.stderr
    args = [json.loads(line.split("ARGS ", 1)[1]) for line in r.stdout.splitlines()
            if "ARGS " in line]
    assert args and all(a == HOSTILE + ["$(touch PWNED6)", "{x}"] for a in args), args
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in r.stdout.splitlines()
            if "ENV " in line]
    expected = {"HOSTILE_1": HOSTILE[2] + HOSTILE[5], "HOSTILE_2": HOSTILE[1] + HOSTILE[4]}
    assert envs == [expected] * 2
    for root in [tmp_path] + [h.home for h in tb2.hosts]:
        assert not list(root.rglob("PWNED*")), f"something ran under {root}"


def test_secret_env_is_never_printed(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    secret = "sk-live-0123456789abcdef"
    (tmp_path / "s.py").write_text("import os\nassert os.environ['WANDB_API_KEY'] == "
                                   f"{secret!r}\nassert os.environ['MY_TOKEN'] == 'tok-42'\n"
                                   "print('secret reached the script', flush=True)\n")
    tb2.inventory(tmp_path / "inv.toml")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nscript = "s.py"\nsecret_env = ["MY_TOKEN"]\n'
                   f'[env]\nWANDB_API_KEY = "{secret}"\nMY_TOKEN = "tok-42"\nOTHER = "shown"\n')
    plan = cli("plan", str(job))
    as_json = cli("plan", "--json", str(job))
    up = cli("up", str(job))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "secret reached the script" in up.stdout
    for out in (plan.stdout, as_json.stdout, up.stdout, up.stderr):
        assert secret not in out and "tok-42" not in out
    assert "WANDB_API_KEY=***" in plan.stdout and "OTHER=shown" in plan.stdout
    run_dir = tb2.hosts[1].home / "fleet" / "runs" / run_id_of(up.stderr) / "node2"
    env_file = run_dir / "env.sh"
    assert secret in env_file.read_text() and env_file.stat().st_mode & 0o777 == 0o600


def test_second_run_on_held_hosts_is_refused_unless_forced(cli: CLI, tb2: Testbed,
                                                           tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    first = cli("up", "--detach", str(long_job(tmp_path, 29541)))
    assert first.returncode == 0, first.stderr
    held = run_id_of(first.stderr)
    try:
        other = tmp_path / "other"
        other.mkdir()
        tb2.inventory(other / "inv.toml")
        job2 = long_job(other, 29542, TICKS=1)
        second = cli("up", str(job2))
        assert second.returncode == 6, second.stdout + second.stderr  # hosts busy
        # the same words for both hosts: said once, naming both
        assert re.search(rf"node1, node2: held by run {held} \(still running\)", second.stderr), \
            second.stderr
        clash = tmp_path / "clash"
        clash.mkdir()
        tb2.inventory(clash / "inv.toml")
        same_port = cli("up", str(long_job(clash, 29541, TICKS=1)), "--force")
        assert same_port.returncode == 5 and "port 29541 is taken" in same_port.stderr
        forced = cli("up", str(job2), "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
    finally:
        cli("stop", held)
    assert_nothing_left(tb2, held)


def test_auth_refused_and_python_missing_fail_before_anything_starts(cli: CLI, tb2: Testbed,
                                                                     tmp_path: Path) -> None:
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)],
                   check=True)
    inv = tb2.inventory(tmp_path / "inv.toml")
    inv.write_text(inv.read_text() + f'identity = "{other_key}"\n')  # node2's key is wrong
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 3
    assert re.search(r"node2: authentication refused for root@\S+", r.stderr), r.stderr
    inv = tb2.inventory(tmp_path / "inv.toml")
    inv.write_text(inv.read_text() + 'python = "/nonexistent/python3"\n')
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 5
    assert "node2: python '/nonexistent/python3' not found" in r.stderr, r.stderr
    assert not (tb2.hosts[0].home / "fleet" / "runs" / run_id_of(r.stderr)).exists()
    bare = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter under the venv: no torch
    inv = tb2.inventory(tmp_path / "inv.toml")
    inv.write_text(inv.read_text() + f'python = "{bare}"\n')
    r = cli("up", str(JOBS / "allreduce.toml"), "-i", str(inv))
    assert r.returncode == 5
    assert f"node2: {bare} has no torch" in r.stderr, r.stderr


def test_full_disk_in_the_run_directory(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    node2 = tb2.hosts[1]
    small = str(node2.home / "tiny")
    tb2.mount_tmpfs("node2", small, "64k")  # a 64 KiB filesystem, seen by node2 only
    try:
        inv = tb2.inventory(tmp_path / "inv.toml")
        inv.write_text(inv.read_text() + f'workdir = "{small}"\n')
        # The port checks beside the upload hold a listener on the master when it fails.
        cli.env.update(FLEET_FAULT="preflight-listening:pause",
                       FLEET_FAULT_RESUME=str(tmp_path / "never"))
        r = cli("up", str(JOBS / "mnist.toml"), "-i", str(inv))
        del cli.env["FLEET_FAULT"], cli.env["FLEET_FAULT_RESUME"]
        assert r.returncode == 5, r.stdout + r.stderr
        assert re.search(r"node2: .*(No space left on device|disk)", r.stderr), r.stderr
        assert "started master" not in r.stderr
        runs = tb2.hosts[0].home / "fleet" / "runs" / run_id_of(r.stderr)
        assert not runs.exists(), "node1 kept a half-prepared run"
        assert "fault point preflight-listening reached" in r.stderr, r.stderr
        assert_no_strays(tb2)  # the port checks ran beside the upload: their listeners too
    finally:
        tb2.umount("node2", small)


def test_node_whose_sshd_and_processes_die_mid_run(cli: CLI, tmp_path: Path) -> None:
    _need_testbed()
    with Testbed(2) as tb:
        tb.inventory(tmp_path / "inv.toml")
        up = cli.popen("up", str(long_job(tmp_path, 29543)))
        runs = cli.cwd / ".fleet" / "runs"
        try:
            wait_for(lambda: any("tick 2" in p.read_text() for p in runs.glob("*/node2.log")),
                     120, "the job to run")
            run_id = next(runs.iterdir()).name
            tb.kill_host("node2")  # node2 dies: sshd and every process, as in a power cut
            out, err = up.communicate(timeout=120)
        finally:
            if up.poll() is None:
                up.kill()
        # fleet cannot know that node2's job died with it: "unknown", and it says so.
        assert up.returncode == 3, out + err
        assert re.search(r"node2 \(node rank 1\) is unreachable", err), err
        assert "node2 could not be reached: its part of the run may still be running" in err, err
        assert_nothing_left(tb, run_id)
        st = cli("status", run_id)
        assert re.search(r"node2 .*unreachable", st.stdout), st.stdout
