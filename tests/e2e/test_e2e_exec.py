"""`fleet exec` end to end through the real CLI on three real sshd hosts (node2's rc files print
on both streams): identical output grouped once, differing output apart, a failing host's status
and exit 1, a host whose sshd is gone named with exit 3, and with a job file the job's
directory (absent before its `fleet up`, there after) and env."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_lifetime import wait_for
from tests.testbed import NOISE_STDERR, NOISE_STDOUT, Testbed

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3, noisy=[False, True, False]) as bed:
        yield bed


def clean(r: object) -> None:
    """Nothing that the noisy host's rc files print reaches fleet's output."""
    text = getattr(r, "stdout", "") + getattr(r, "stderr", "")
    assert NOISE_STDOUT not in text and NOISE_STDERR not in text and "lab:" not in text, text
    assert "\r" not in text and "\x1b" not in text, text  # plain lines: no spinner, no colour


def test_identical_output_once_differing_apart(cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    inv = tb.inventory(tmp_path / "inv.toml")
    same = cli("exec", str(inv), "--", "echo", "same  words", "*")
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.stdout == "---- node1,node2,node3 (3) ----\nsame  words *\n", same.stdout
    assert "fleet: 3 of 3 host(s) exited 0" in same.stderr
    clean(same)
    names = cli("exec", str(inv), "--", "hostname")
    assert names.returncode == 0, names.stdout + names.stderr
    assert names.stdout == ("---- node1 (1) ----\nnode1\n---- node2 (1) ----\nnode2\n"
                            "---- node3 (1) ----\nnode3\n"), names.stdout
    clean(names)
    shown = cli("exec", str(inv), "--node", "node1", "--", "printf", "a\\033[2Jb\\n")
    assert shown.stdout == "---- node1 (1) ----\na^[[2Jb\n", shown.stdout  # shown, not obeyed


def test_a_failing_host_shows_its_status_and_exits_1(cli: CLI, tb: Testbed,
                                                      tmp_path: Path) -> None:
    inv = tb.inventory(tmp_path / "inv.toml")
    r = cli("exec", str(inv), "--", "sh", "-c", 'echo checked; test "$(hostname)" != node2')
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout == ("---- node1,node3 (2) ----\nchecked\n"
                        "---- node2 (1): exit status 1 ----\nchecked\n"), r.stdout
    assert "fleet: node2: exit status 1\n" in r.stderr
    assert "fleet: 2 of 3 host(s) exited 0" in r.stderr
    clean(r)
    only = cli("exec", str(inv), "--node", "node3", "--node", "node1", "--", "hostname")
    assert only.returncode == 0 and "node2" not in only.stdout, only.stdout + only.stderr
    assert only.stdout == "---- node1 (1) ----\nnode1\n---- node3 (1) ----\nnode3\n"
    unknown = cli("exec", str(inv), "--node", "node9", "--", "hostname")
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert f"no host named node9 in {inv}; its hosts: node1, node2, node3" in unknown.stderr


def test_an_unreachable_host_is_named_with_the_reason_and_exits_3(cli: CLI, tb: Testbed,
                                                                   tmp_path: Path) -> None:
    inv = tb.inventory(tmp_path / "inv.toml")
    tb.kill_sshd("node3")
    try:
        r = cli("exec", str(inv), "--", "echo", "here")
    finally:
        tb.start_sshd("node3")
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout == "---- node1,node2 (2) ----\nhere\n", r.stdout
    assert re.search(rf"^fleet: node3: unreachable: cannot connect to {tb.host('node3').addr}"
                     r":22: .*refused", r.stderr, re.M), r.stderr
    assert "fleet: 2 of 3 host(s) exited 0" in r.stderr


def test_with_a_job_it_runs_in_the_jobs_directory_with_its_env(cli: CLI, tb: Testbed,
                                                                tmp_path: Path) -> None:
    inv = tb.inventory(tmp_path / "inv.toml")
    inv.write_text(inv.read_text().replace('name = "node2"',
                                           'name = "node2"\nenv = { WHERE = "host two" }'))
    code = tmp_path / "code"
    code.mkdir()
    (code / "marker.txt").write_text("shipped\n")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
                   'command = ["true"]\nnproc_per_node = 1\n'
                   '[env]\nGREETING = "it\'s $HOME"\nWHERE = "job"\n')
    # Each host has a home of its own: the directory is said relative to it.
    show = ["sh", "-c", 'echo "~${PWD#"$HOME"}"; cat marker.txt; '
                        'echo "$GREETING|$WHERE|${MASTER_ADDR:-}"']
    before = cli("exec", str(job), "--", *show)
    assert before.returncode == 1 and before.stdout == "", before.stdout + before.stderr
    # the same words on the three hosts: said once, naming them
    assert re.search(r"^fleet: node1, node2, node3: not run: ~/fleet/code/job-[0-9a-f]{8} is "
                     r"not there \(`fleet up` of this job puts it there\)$", before.stderr,
                     re.M), before.stderr
    up = cli("up", str(job))
    assert up.returncode == 0, up.stdout + up.stderr
    after = cli("exec", str(job), "--", *show)
    assert after.returncode == 0, after.stdout + after.stderr
    slot = re.search(r"code/(job-[0-9a-f]{8})", before.stderr)
    assert slot is not None
    where = f"~/fleet/code/{slot[1]}"
    assert after.stdout == (f"---- node1,node3 (2) ----\n{where}\nshipped\nit's $HOME|job|\n"
                            f"---- node2 (1) ----\n{where}\nshipped\nit's $HOME|host two|\n"), \
        after.stdout
    clean(after)
    home = cli("exec", str(inv), "--", "sh", "-c", 'echo "~${PWD#"$HOME"}|${WHERE:-}"')
    assert home.stdout == "---- node1,node2,node3 (3) ----\n~|\n", home.stdout


def test_ctrl_c_says_that_a_started_command_goes_on(cli: CLI, tb: Testbed, tmp_path: Path) -> None:
    """Without a terminal on the node nothing ends the command with its connection (as with
    `ssh host cmd`): fleet says so rather than let it be thought stopped."""
    inv = tb.inventory(tmp_path / "inv.toml")

    def sleepers() -> list[str]:
        rows = tb.exec("node1", "ps", "-eo", "pid=,args=").stdout.splitlines()
        return [row.split()[0] for row in rows if row.split()[1:] == ["sleep", "37"]]

    def sleeping() -> bool:
        return bool(sleepers())

    p = cli.popen("exec", str(inv), "--node", "node1", "--", "sleep", "37")
    try:
        wait_for(sleeping, 30, "the command to start on node1")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 130 and out == "", out + err
        assert err == ("fleet: interrupted (SIGINT): a command that had started on a host goes "
                       "on there (fleet exec stops nothing)\n"), err
        assert sleeping()
    finally:
        p.kill()
        for pid in sleepers():  # by its pid, inside node1's own PID namespace
            tb.exec("node1", "kill", pid)
