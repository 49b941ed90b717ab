"""Spares you can trust, end to end through the real CLI on real sshd hosts: `fleet check` names
a spare with an unknown host key; at the restart the next fit spare is used and no false
"replaced by" is said or recorded; a rank that fails once is retried in place, the spare left
free (`[restart] replace`'s default)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_heal import HHMMSS, assert_clean, attempt_ids, no_traceback
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Every node says which attempt runs where; on attempt 1 the node named FAIL_ON fails at once,
# the others hold on until the fail-fast stops them; attempt 2 ends well everywhere.
ONCE = '''import os, socket, sys, time
attempt, host = int(os.environ["FLEET_ATTEMPT"]), socket.gethostname()
print(f"attempt {attempt} on {host}", flush=True)
if attempt == 1:
    if host == os.environ["FAIL_ON"]:
        time.sleep(0.5)
        sys.exit(3)
    time.sleep(60)
'''


@pytest.fixture(scope="module")
def tb3() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3) as t:
        yield t


def once_job(d: Path, port: int, restart: str, fail_on: str) -> Path:
    (d / "once.py").write_text(ONCE)
    job = d / "once.toml"
    job.write_text('inventory = "inv.toml"\nlauncher = "command"\n'
                   'command = ["{python}", "once.py"]\n'
                   f"[rendezvous]\nport = {port}\n[restart]\n{restart}\n"
                   f'[env]\nFAIL_ON = "{fail_on}"\n')
    return job


def recorded(cli: CLI, run_id: str) -> list[dict[str, object]]:
    data = json.loads((cli.cwd / ".fleet" / "runs" / run_id / "attempts.json").read_text())
    return data["attempts"]  # type: ignore[no-any-return]


def test_an_unfit_spare_is_reported_by_check_and_passed_over_at_restart(
        cli: CLI, tb3: Testbed, tmp_path: Path) -> None:
    """node2, a spare, has a host key fleet does not know (an empty known_hosts of its own):
    `check` names it as a spare; node1 fails once (`replace = "fail"`), node2 is not fit, node3
    takes node1's place, and only node3 is said and recorded to have."""
    unknown = tmp_path / "empty_known_hosts"
    unknown.write_text("")
    tb3.inventory(tmp_path / "inv.toml", ["node1", "node2", "node3"], per_host={
        "node2": {"spare": True, "known_hosts": str(unknown)}, "node3": {"spare": True}})
    job = once_job(tmp_path, 29931, 'max = 1\nbackoff = 0\nreplace = "fail"', "node1")

    check = cli("check", str(job), timeout=120)
    assert check.returncode == 1, check.stdout + check.stderr
    assert re.search(r"^ *node2 \(spare\) +ssh +FAIL +unknown host key for ", check.stdout,
                     re.M), check.stdout
    assert re.search(r"^ *node3 \(spare\) +\d+ passed +PASS ", check.stdout, re.M), check.stdout

    plan = cli("plan", str(job), "--probe", timeout=120)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    spare2 = plan.stdout[plan.stdout.index("\n[node2] spare (not used at the start"):]
    assert spare2.splitlines()[2].startswith("  probe:     unknown host key for "), spare2
    assert "\n[node3] spare (not used at the start" in plan.stdout, plan.stdout
    assert "  probe:     answers\n" in plan.stdout, plan.stdout

    r = cli("up", str(job), timeout=240)
    run_id = run_id_of(r.stderr)
    ids = attempt_ids(cli, run_id)
    try:
        err = r.stderr
        assert r.returncode == 0, r.stdout + err
        no_traceback(err)
        assert ids == [run_id, f"{run_id}-a2"], ids
        assert "node1 | attempt 2 on node3" not in r.stdout  # the tag is node3's own
        assert "node3 | attempt 2 on node3" in r.stdout, r.stdout
        unfit = err.index("fleet: restart: spare node2 is not fit for the job (")
        assert "(unknown host key for " in err[unfit:].splitlines()[0], err
        assert err[unfit:].splitlines()[0].endswith("; node3 is checked in its place"), err
        said = err.index("fleet: restart: node1 replaced by spare node3 (node1 failed (exit 3))")
        # Said once node3 passed its checks (prepared), before it started; node2 never was.
        assert unfit < err.rindex(f"run {run_id}-a2: once on 1 host(s)") < said < \
            err.index("fleet: node3  started"), err
        assert "replaced by spare node2" not in err and "by node2" not in err, err
        assert [a["replaced"] for a in recorded(cli, run_id)] == [{"node1": "node3"}, {}]
        st = cli("status", run_id, timeout=60)
        assert st.returncode == 0, st.stdout + st.stderr
        assert "node2" not in st.stdout, st.stdout
        assert re.search(rf"^  attempt 1/2 \({run_id}\): failed, node1 failed \(exit 3\) at "
                         rf"{HHMMSS}; node1 replaced by node3;", st.stdout, re.M), st.stdout
    finally:
        assert_clean(tb3, ids)


def test_a_rank_that_fails_once_is_retried_in_place_and_the_spare_stays_free(
        cli: CLI, tb3: Testbed, tmp_path: Path) -> None:
    """node2's part fails on attempt 1: attempt 2 runs on node1 and node2 again (the default
    `replace = "lost"`), and node3, the spare, is never touched."""
    tb3.inventory(tmp_path / "inv.toml", per_host={"node3": {"spare": True}})
    job = once_job(tmp_path, 29932, "max = 2\nbackoff = 0", "node2")
    spare_runs = tb3.host("node3").home / "fleet" / "runs"
    before = set(spare_runs.glob("*")) if spare_runs.is_dir() else set()
    r = cli("up", str(job), timeout=240)
    run_id = run_id_of(r.stderr)
    ids = attempt_ids(cli, run_id)
    try:
        err = r.stderr
        assert r.returncode == 0, r.stdout + err
        no_traceback(err)
        assert ids == [run_id, f"{run_id}-a2"], ids
        assert ('fleet: restart: node2 is retried in place (its first failure; [restart] '
                'replace = "lost")\n') in err, err
        assert "replaced" not in err, err
        assert "node2 | attempt 2 on node2" in r.stdout and "node3" not in r.stdout, r.stdout
        tried = recorded(cli, run_id)
        assert [(sorted(a["hosts"]), a["replaced"]) for a in tried] == [  # type: ignore[arg-type]
            (["node1", "node2"], {}), (["node1", "node2"], {})]
        assert (set(spare_runs.glob("*")) if spare_runs.is_dir() else set()) == before
        st = cli("status", run_id, timeout=60)
        assert "replaced" not in st.stdout and "node3" not in st.stdout, st.stdout
    finally:
        assert_clean(tb3, ids)
