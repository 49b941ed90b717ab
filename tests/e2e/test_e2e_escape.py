"""A job's process that leaves the run's environment and session (`setsid env -u FLEET_RUN_ID
-u FLEET_ATTEMPT_ID`) is still the run's: fail-fast and `fleet stop` end it, and spare a process
of the same user that is not the run's; a job that empties the record of its processes first,
and kills the watcher that keeps it, moves neither the run's start nor its session (fleet
recorded them at the start)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_lifetime import wait_for
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Each node starts a process that sheds the run's variable and session, and says its pid (as
# the host sees it); node rank 0 then fails after FAIL_AFTER seconds (0: never).
SLEEP, BYSTANDER = b"sleep\x00987\x00", b"sleep\x00654\x00"
ESCAPE = """\
setsid env -u FLEET_RUN_ID -u FLEET_ATTEMPT_ID sleep 987 < /dev/null > /dev/null 2>&1 &
echo "escaped $!"
if [ "$FLEET_NODE_RANK" = 0 ] && [ "$1" != 0 ]; then sleep "$1"; exit 1; fi
sleep 300
"""

# The hostile shape: once the watcher (run_tree.py) has written the record, empty it, so that
# the escapee's line comes first; escape from a subshell that ends once that line is there (the
# escapee loses its parent: no descent from the job links it any more); then kill the watcher.
# Each wait is bounded (10 s).
HOSTILE = """\
d=$FLEET_RUN_DIR
i=0
while [ ! -s "$d/procs" ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
: > "$d/procs"
e=$(setsid env -u FLEET_RUN_ID -u FLEET_ATTEMPT_ID sleep 987 < /dev/null > /dev/null 2>&1 &
    i=0
    while ! grep -q "^$! " "$d/procs" && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
    echo "$!")
for p in /proc/[0-9]*; do
  case "$(tr '\\0' ' ' < "$p/cmdline" 2>/dev/null)" in
    *"run_tree.py $d "*) kill "${p#/proc/}" && echo "killed the watcher" ;;
  esac
done
echo "escaped $e"
sleep 300
"""


def escape_job(tmp_path: Path, port: int, fail_after: int, script: str = ESCAPE) -> Path:
    (tmp_path / "escape.sh").write_text(script)
    job = tmp_path / "escape.toml"
    job.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                   f'command = ["sh", "escape.sh", "{fail_after}"]\n'
                   f"[rendezvous]\nport = {port}\n")
    return job


def host_pids(tb: Testbed, name: str, argv: bytes) -> dict[int, int]:
    """Host `name`'s living processes with this command line: the pid it calls each by -> its
    global pid."""
    found = {}
    for g in tb.pids(tb.host(name).ns):
        try:
            status = Path(f"/proc/{g}/status").read_text()
            cmd = Path(f"/proc/{g}/cmdline").read_bytes()
        except OSError:
            continue
        inner = re.search(r"^NSpid:.*\s(\d+)$", status, re.M)
        if inner and cmd == argv and "\nState:\tZ" not in status:
            found[int(inner.group(1))] = g
    return found


def host_pid(tb: Testbed, name: str, pid: int) -> int | None:
    """The global pid of the escaped sleep that host `name` calls `pid`, if it is alive."""
    return host_pids(tb, name, SLEEP).get(pid)


def clean(tb: Testbed) -> None:
    for h in tb.hosts:
        for argv in (SLEEP, BYSTANDER):
            for g in host_pids(tb, h.name, argv).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(g, signal.SIGKILL)


def escaped(cli: CLI, tb: Testbed) -> dict[str, int]:
    """Each node's escaped pid, from the log fleet keeps of it."""
    found = {}
    for h in tb.hosts:
        for log in (cli.cwd / ".fleet" / "runs").glob(f"*/{h.name}.log"):
            if m := re.search(r"^(?:\S+ )*escaped (\d+)$", log.read_text(), re.M):
                found[h.name] = int(m.group(1))
    return found


def assert_gone(tb: Testbed, pids: dict[str, int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(host_pid(tb, name, pid) for name, pid in pids.items()):
        assert time.monotonic() < deadline, \
            f"escaped processes still alive: {pids} -> " \
            f"{ {n: host_pid(tb, n, p) for n, p in pids.items()} }"
        time.sleep(0.2)


def test_fail_fast_ends_a_process_that_left_the_run(cli: CLI, tb2: Testbed,
                                                    tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", str(escape_job(tmp_path, 29561, 2)), timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "stopping the job on every other node" in r.stderr, r.stderr
    pids = escaped(cli, tb2)
    try:
        assert sorted(pids) == ["node1", "node2"], (pids, r.stderr)
        assert_gone(tb2, pids)
    finally:
        clean(tb2)


def test_stop_ends_a_process_that_left_the_run_and_spares_others(cli: CLI, tb2: Testbed,
                                                                 tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    up = cli.popen("up", str(escape_job(tmp_path, 29562, 0)))
    bystander = None
    try:
        wait_for(lambda: len(escaped(cli, tb2)) == 2, 120, "both nodes to start the escape")
        pids = escaped(cli, tb2)
        # Inside node1, as root, started after the run, neither its descendant nor in its
        # session or environment: not the run's.
        bystander = subprocess.Popen(["nsenter", "-t", str(tb2.host("node1").init_pid), "-p",
                                      "-m", "-n", "setsid", "sleep", "654"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run_id = next((cli.cwd / ".fleet" / "runs").iterdir()).name
        r = cli("stop", run_id, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "nothing of the run left" in r.stderr, r.stderr
        assert_gone(tb2, pids, timeout=1)
        assert bystander.poll() is None, "fleet stop killed a process that was not the run's"
        up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        clean(tb2)
        if bystander is not None:
            bystander.wait()


def test_stop_ends_an_escapee_after_the_job_emptied_the_record_and_killed_its_watcher(
        cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    up = cli.popen("up", str(escape_job(tmp_path, 29563, 0, HOSTILE)))
    try:
        wait_for(lambda: len(escaped(cli, tb2)) == 2, 120, "both nodes to start the escape")
        pids = escaped(cli, tb2)
        for h in tb2.hosts:
            log = "".join(p.read_text() for p in (cli.cwd / ".fleet" / "runs").glob(
                f"*/{h.name}.log"))
            assert "killed the watcher" in log, log
        run_id = next((cli.cwd / ".fleet" / "runs").iterdir()).name
        r = cli("stop", run_id, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert_gone(tb2, pids, timeout=1)
        up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        clean(tb2)
