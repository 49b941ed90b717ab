"""`fleet logs` through the real CLI on testbed hosts: -f ends with the run's state and exits
with its code (a run stopped by `fleet stop` from another process, one that succeeded, one that
failed), --merge puts two hosts' lines in the order they were written, --tail and --since."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_stream import command_job
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Node rank argv[1] says it waits, then waits for ~/interleaved.go (the test writes START there
# once both wait: however long a loaded machine's `fleet up` took), then prints "m<k>" for its
# k (even k on node rank 0, odd on 1) at START + k*GAP (this machine's clock: the testbed's
# hosts share it).
INTERLEAVED = '''import os, sys, time
gap, rank = float(os.environ["GAP"]), int(sys.argv[1])
print(f"waiting on node rank {rank}", flush=True)
go = os.path.expanduser("~/interleaved.go")
while not os.path.exists(go) or not open(go).read().endswith("\\n"):
    time.sleep(0.02)
start = float(open(go).read())
for k in range(rank, 10, 2):
    time.sleep(max(0.0, start + k * gap - time.time()))
    print(f"m{k} from node rank {rank}", flush=True)
'''

# Ticks every 0.3 s, forever, or fails once it ticked argv[2] times on node rank argv[1].
TICKER = '''import sys, time
rank, fail_at, ticks = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for i in range(ticks):
    print(f"tick {i} of node rank {rank}", flush=True)
    if rank == 1 and i == fail_at:
        sys.exit(1)
    time.sleep(0.3)
print(f"node rank {rank} done", flush=True)
'''


def ticker(tmp_path: Path, name: str, port: int, fail_at: int = -1, ticks: int = 100000) -> Path:
    return command_job(tmp_path, name, TICKER, port, f', "{{node_rank}}", "{fail_at}", "{ticks}"')


def detached(cli: CLI, job: Path) -> str:
    r = cli("up", "--detach", str(job), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    return run_id_of(r.stderr)


def follower(cli: CLI, out: Path, *args: str) -> subprocess.Popen[str]:
    """`fleet logs -f` in its own process, its stdout in a file (read while it runs)."""
    with open(out, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "fleet", "logs", "-f", *args],
                                cwd=cli.cwd, env=cli.env, stdout=f, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)


def last_line(err: str) -> str:
    return err.rstrip("\n").rsplit("\n", 1)[-1]


def test_follow_a_run_stopped_from_another_process_says_so_and_exits_4(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    run_id = detached(cli, ticker(tmp_path, "forever", 29601))
    plain = follower(cli, tmp_path / "plain.out", run_id)
    viewed = plain
    stop = None
    try:
        wait_for(lambda: "tick 5 of node rank 1" in (tmp_path / "plain.out").read_text(), 60,
                 "the ticks through logs -f")
        # Once 6 ticks of each node were written: the last 2 of them, then what follows.
        viewed = follower(cli, tmp_path / "viewed.out", run_id, "--merge", "--tail", "2")
        wait_for(lambda: (tmp_path / "viewed.out").read_text().count(" | tick ") >= 6, 60,
                 "the ticks through logs -f --merge --tail 2")
        stop = cli("stop", run_id)
        assert stop.returncode == 0, stop.stderr
        _, err = plain.communicate(timeout=60)
        _, viewed_err = viewed.communicate(timeout=60)
    finally:
        for p in (plain, viewed):
            if p.poll() is None:
                p.kill()
        if stop is None:  # the test failed before: the run must not tick on for the next ones
            cli("stop", run_id)
    for p, e in ((plain, err), (viewed, viewed_err)):
        assert p.returncode == 4, e
        line = last_line(e)
        assert line.startswith(f"fleet: run {run_id} stopped: node1 "), e
        assert len(re.findall(r"stopped \(exit \d+\) by fleet stop", line)) == 2, line
    out = (tmp_path / "plain.out").read_text()
    assert "tick 0 of node rank 0" in out and "tick 5 of node rank 1" in out
    # From the last 2 lines when it began (not the first), then every line on, each once.
    shown = re.findall(r"^(node\d) +\| tick (\d+) of", (tmp_path / "viewed.out").read_text(),
                       re.M)
    assert len(shown) >= 6 and ("node1", "0") not in shown, shown
    first = min(int(k) for _, k in shown)
    assert first >= 4, shown
    for host in ("node1", "node2"):
        ticks = [int(k) for h, k in shown if h == host]
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks))), shown
    assert_nothing_left(tb2, run_id)


def test_follow_a_run_to_success_exits_0_and_to_failure_1(cli: CLI, tb2: Testbed,
                                                           tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    run_id = detached(cli, ticker(tmp_path, "short", 29602, ticks=6))
    ok = cli("logs", "-f", run_id, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "node rank 0 done" in ok.stdout and "node rank 1 done" in ok.stdout, ok.stdout
    line = last_line(ok.stderr)
    assert line.startswith(f"fleet: run {run_id} succeeded: node1 "), ok.stderr
    assert line.count("succeeded (exit 0)") == 2, line
    # Without -f: the logs as before, and no state line.
    again = cli("logs", run_id)
    assert again.returncode == 0, again.stderr
    assert sorted(again.stdout.splitlines()) == sorted(ok.stdout.splitlines()), again.stdout
    assert "succeeded" not in again.stderr, again.stderr

    run_id = detached(cli, ticker(tmp_path, "failing", 29603, fail_at=3, ticks=10))
    bad = cli("logs", "-f", run_id, timeout=120)
    assert bad.returncode == 1, bad.stderr
    line = last_line(bad.stderr)
    assert line.startswith(f"fleet: run {run_id} failed: node1 "), bad.stderr
    assert "node2 node rank 1 failed (exit 1)" in line, line


@pytest.fixture(scope="module")
def interleaved(tb2: Testbed, tmp_path_factory: pytest.TempPathFactory) -> tuple[CLI, str, float]:
    """A finished run whose two hosts printed m0..m9 by turns, GAP apart from START."""
    tmp_path = tmp_path_factory.mktemp("interleaved")
    cli = CLI(tmp_path)
    tb2.inventory(tmp_path / "inv.toml")
    job = command_job(tmp_path, "turns", INTERLEAVED, 29604, ', "{node_rank}"',
                      '[env]\nGAP = "0.4"\n')
    run_id = detached(cli, job)
    wait_for(lambda: cli("logs", run_id).stdout.count("waiting on node rank") == 2, 120,
             "both hosts waiting for the start")
    start = time.time() + 1  # both poll every 0.02 s: the first line is 1 s off, the turns 0.4
    for h in tb2.hosts:
        (h.home / "interleaved.go").write_text(f"{start}\n")
    done = cli("logs", "-f", run_id, timeout=120)
    assert done.returncode == 0, done.stderr
    return cli, run_id, start


def job_lines(stdout: str) -> list[tuple[str, int]]:
    """(tag, k) of each m<k> line, in the order shown."""
    return [(tag, int(k)) for tag, k in re.findall(r"^(node\d) +\| m(\d+) from", stdout, re.M)]


def test_merge_orders_two_hosts_lines_by_when_they_were_written(
        interleaved: tuple[CLI, str, float]) -> None:
    cli, run_id, _ = interleaved
    r = cli("logs", "--merge", run_id)
    assert r.returncode == 0, r.stderr
    assert job_lines(r.stdout) == [("node1" if k % 2 == 0 else "node2", k) for k in range(10)], \
        r.stdout
    plain = cli("logs", run_id)  # node by node, as ever
    assert sorted(job_lines(plain.stdout)) == sorted(job_lines(r.stdout)), plain.stdout
    assert [k for tag, k in job_lines(plain.stdout) if tag == "node2"] == [1, 3, 5, 7, 9]
    tail = cli("logs", "--merge", "--tail", "3", run_id)
    assert [k for _, k in job_lines(tail.stdout)] == [7, 8, 9], tail.stdout


def test_tail_is_each_hosts_last_lines(interleaved: tuple[CLI, str, float]) -> None:
    cli, run_id, _ = interleaved
    r = cli("logs", "--tail", "2", run_id)
    assert r.returncode == 0, r.stderr
    assert sorted(job_lines(r.stdout)) == [("node1", 6), ("node1", 8), ("node2", 7),
                                           ("node2", 9)], r.stdout
    assert cli("logs", "--tail", "0", run_id).stdout == ""
    one = cli("logs", "--tail", "1", "--node", "node2", run_id)
    assert job_lines(one.stdout) == [("node2", 9)], one.stdout


def test_since_shows_only_lines_written_at_or_after_it(
        interleaved: tuple[CLI, str, float]) -> None:
    cli, run_id, start = interleaved
    at = datetime.fromtimestamp(start + 1.8).isoformat()  # m5 (at 2.0) on, m4 (at 1.6) not
    r = cli("logs", "--since", at, "--merge", run_id)
    assert r.returncode == 0, r.stderr
    assert [k for _, k in job_lines(r.stdout)] == [5, 6, 7, 8, 9], r.stdout
    by_node = cli("logs", "--since", at, run_id)
    assert sorted(k for _, k in job_lines(by_node.stdout)) == [5, 6, 7, 8, 9], by_node.stdout
    assert sorted(k for _, k in job_lines(cli("logs", "--since", "1h", run_id).stdout)) == \
        list(range(10))
    time.sleep(max(0.0, start + 4.0 + 2 - time.time()))
    assert job_lines(cli("logs", "--since", "1s", run_id).stdout) == []
    bad = cli("logs", "--since", "soon", run_id)
    assert bad.returncode == 2 and "--since 'soon': neither a duration" in bad.stderr, bad.stderr


# Node rank 1 writes a NaN into its own log's time index, between two lines of its own.
NAN_INDEX = '''import os, sys
rank = sys.argv[1]
print(f"first of node rank {rank}", flush=True)
if rank == "1":
    with open(os.path.join(os.environ["FLEET_RUN_DIR"], "node.times"), "a") as f:
        f.write("99999999 nan\\n")
print(f"last of node rank {rank}", flush=True)
'''


def test_merge_sets_a_job_written_nan_index_aside(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    """A bug once: a NaN the job wrote into node.times made `logs --merge` call the
    node unreachable (exit 3). The index is data to distrust: set aside, with a note naming the
    host, and every line shown."""
    tb2.inventory(tmp_path / "inv.toml")
    job = command_job(tmp_path, "nan", NAN_INDEX, 29605, ', "{node_rank}"')
    up = cli("up", str(job), timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    run_id = run_id_of(up.stderr)
    for args in (["--merge"], ["--merge", "--since", "1h"]):
        r = cli("logs", *args, run_id)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "unreachable" not in r.stderr, r.stderr
        assert re.search(r"node2\b.*its log's time index \(node\.times, which the job can write "
                         r"too\) is set aside: a time that is not one: 'nan'", r.stderr), r.stderr
        for rank in (0, 1):
            for which in ("first", "last"):
                assert f"{which} of node rank {rank}" in r.stdout, r.stdout
