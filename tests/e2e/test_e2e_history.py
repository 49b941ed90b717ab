"""What fleet saw is history, end to end through the real CLI on real sshd hosts: a job that
fails, but leaves behind a process (out of the run's environment) that later writes `0` into its
run directory's exit_code, stays failed in `status`, `ps` and `show`, whether fleet watched its
end or a later `status` was the first to see it; and `fleet usage` counts a run's GPU-hours
from its record alone."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# The job fails (exit 1), but first leaves a process of its own session, outside the run's
# environment, that waits for the test's word (the file `forge` in the run directory, a minute
# at most) and then writes the success the job never had.
FORGER = '''d=$FLEET_RUN_DIR
case $d in "~/"*) d="$HOME/${d#"~/"}" ;; esac
setsid env -u FLEET_RUN_ID -u FLEET_ATTEMPT_ID sh -c '
  i=0
  while [ ! -e "$1/forge" ] && [ "$i" -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
  echo 0 > "$1/exit_code"
  echo forged > "$1/forged"' forger "$d" < /dev/null > /dev/null 2>&1 &
echo "failing, with a forger left behind"
exit 1
'''


def forger_job(tmp_path: Path, tb: Testbed, port: int) -> Path:
    tb.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "forge.sh").write_text(FORGER)
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
                   'command = ["sh", "forge.sh"]\nnproc_per_node = 1\n'
                   f"[rendezvous]\nport = {port}\n")
    return job


def run_dir(tb: Testbed, host: str, run_id: str) -> Path:
    return tb.host(host).home / "fleet" / "runs" / run_id / host


def forge(tb: Testbed, run_id: str) -> None:
    """The forgers' cue; then wait until each has written its `0`."""
    for h in tb.hosts:
        (run_dir(tb, h.name, run_id) / "forge").touch()
    for h in tb.hosts:
        wait_for(lambda h=h: (run_dir(tb, h.name, run_id) / "forged").exists(), 60,
                 f"the forger on {h.name}")
        assert (run_dir(tb, h.name, run_id) / "exit_code").read_text().strip() == "0"


def assert_failed(cli: CLI, run_id: str) -> None:
    st = cli("status", run_id, timeout=60)
    assert st.returncode == 1, st.stdout + st.stderr
    assert st.stdout.splitlines()[0].endswith(": failed"), st.stdout
    assert len(re.findall(r"^  node\d +node rank \d+  failed \(exit 1\)", st.stdout, re.M)) == 2, \
        st.stdout
    assert "succeeded" not in st.stdout, st.stdout
    ps = cli("ps", timeout=60)
    assert re.search(rf"^{run_id} +failed ", ps.stdout, re.M), ps.stdout


def test_a_failed_node_stays_failed_whatever_it_writes_later(cli: CLI, tb2: Testbed,
                                                             tmp_path: Path) -> None:
    """fleet up watched both nodes fail: that is kept on the laptop and wins over the `0`
    their leftover processes write afterwards."""
    job = forger_job(tmp_path, tb2, 29941)
    r = cli("up", str(job), timeout=120)
    run_id = run_id_of(r.stderr)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"run {run_id} failed" in r.stderr, r.stderr
    forge(tb2, run_id)
    assert_failed(cli, run_id)
    show = cli("show", run_id, "--json")
    assert show.returncode == 0, show.stderr
    seen = json.loads(show.stdout)["outcomes"]
    assert {n: (o["status"], o["code"], o["by"]) for n, o in seen.items()} == {
        "node1": ("failed", 1, "fleet up"), "node2": ("failed", 1, "fleet up")}, seen
    text = cli("show", run_id).stdout
    assert re.search(r"^  node2 +failed \(exit 1\) \(seen by fleet up at [\d :-]+\)$", text,
                     re.M), text


def test_a_detached_runs_end_is_kept_once_status_sees_it(cli: CLI, tb2: Testbed,
                                                         tmp_path: Path) -> None:
    """fleet did not watch a detached run: the first `status` after its end sees it fail and
    keeps that; the `0` written afterwards does not turn it into a success."""
    job = forger_job(tmp_path, tb2, 29942)
    r = cli("up", "--detach", str(job), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    for h in tb2.hosts:
        wait_for(lambda h=h: (run_dir(tb2, h.name, run_id) / "exit_code").exists(), 60,
                 f"the job's end on {h.name}")
    assert_failed(cli, run_id)  # seen now, by fleet status
    forge(tb2, run_id)
    assert_failed(cli, run_id)
    seen = json.loads(cli("show", run_id, "--json").stdout)["outcomes"]
    assert {o["by"] for o in seen.values()} == {"fleet status"}, seen


# The job fails, but first blocks the wrapper's way of writing its code (a directory where
# run.sh writes its temporary file) and writes its own `0`; with a cue file in the run
# directory, it first waits (a minute at most) for the test's `status` during the run.
SELF_FORGER = '''d=$FLEET_RUN_DIR
case $d in "~/"*) d="$HOME/${d#"~/"}" ;; esac
mkdir "$d/exit_code.tmp"
echo 0 > "$d/exit_code"
i=0
while [ -e "$d/hold" ] && [ "$i" -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
exit 1
'''


def test_a_job_cannot_write_its_own_success(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    """The job writes `0` into exit_code and blocks run.sh's own write, then fails: fleet up,
    and a `status` while the job still runs, take nothing from that file while its wrapper
    lives; the run fails."""
    tb2.inventory(tmp_path / "inv.toml")
    code = tmp_path / "code"
    code.mkdir()
    (code / "forge.sh").write_text(SELF_FORGER)
    (tmp_path / "job.toml").write_text(
        'inventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
        'command = ["sh", "forge.sh"]\nnproc_per_node = 1\n[rendezvous]\nport = 29943\n')
    r = cli("up", str(tmp_path / "job.toml"), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    assert f"run {run_id} failed" in r.stderr, r.stderr
    assert_failed(cli, run_id)

    # Detached, held until the test's word: a `status` during the run sees the forged `0`.
    d = tmp_path / "held"
    d.mkdir()
    (code / "forge.sh").write_text(SELF_FORGER.replace('i=0\n', 'touch "$d/hold"\ni=0\n', 1)
                                   .replace('-e "$d/hold"', '-e "$d/hold" ] && [ ! -e "$d/go"'))
    r = cli("up", "--detach", str(tmp_path / "job.toml"), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    for h in tb2.hosts:
        wait_for(lambda h=h: (run_dir(tb2, h.name, run_id) / "hold").exists(), 60,
                 f"the job on {h.name}")
    st = cli("status", run_id, timeout=60)
    assert len(re.findall(r"^  node\d +node rank \d+  running", st.stdout, re.M)) == 2, \
        st.stdout + st.stderr
    assert json.loads(cli("show", run_id, "--json").stdout).get("outcomes", {}) == {}
    for h in tb2.hosts:
        (run_dir(tb2, h.name, run_id) / "go").touch()
    for h in tb2.hosts:
        wait_for(lambda h=h: (run_dir(tb2, h.name, run_id) / "exit_code").is_file() and
                 (run_dir(tb2, h.name, run_id) / "exit_code").read_text() == "1\n", 60,
                 f"the job's end on {h.name}")
    assert_failed(cli, run_id)


def test_usage_counts_a_runs_gpu_hours_from_its_record(cli: CLI, tb2: Testbed,
                                                       tmp_path: Path) -> None:
    """`fleet usage` after a real run on two hosts that each chose 2 (stand-in) GPUs: each
    host's 2 GPUs times its part as the record keeps it (the run's start to the end fleet saw
    there), under the inventory's user, each host and the job's name; no host asked."""
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0}
    for h in tb2.hosts:
        tb2.fake_gpus(h.name, {"gpus": [gpu, gpu], "apps": []})
    tb2.inventory(tmp_path / "inv.toml", per_host={h.name: {"gpus": [0, 1]} for h in tb2.hosts})
    (tmp_path / "code").mkdir()
    (tmp_path / "job.toml").write_text(
        'name = "gpuhours"\ninventory = "inv.toml"\nworkdir = "code"\nlauncher = "command"\n'
        'command = ["sleep", "2"]\n[rendezvous]\nport = 29944\n')
    r = cli("up", str(tmp_path / "job.toml"), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    record = tmp_path / ".fleet" / "runs" / run_id
    started = json.loads((record / "run.json").read_text())["started"]
    ends = {name: seen["at"] for name, seen in
            json.loads((record / "outcomes.json").read_text()).items()}
    assert set(ends) == {h.name for h in tb2.hosts}, ends
    want = {name: 2 * (at - started) / 3600 for name, at in ends.items()}
    assert all(h >= 2 * 2 / 3600 for h in want.values()), want  # the job slept 2 s on each
    for h in tb2.hosts:  # what a later look would say cannot change the history
        tb2.fake_gpus(h.name, {"gpus": [], "apps": []})
    u = cli("usage", "--since", "1h", "--json", timeout=60)
    assert u.returncode == 0, u.stdout + u.stderr
    got = json.loads(u.stdout)
    total = sum(want.values())
    assert got["total"]["gpu_hours"] == pytest.approx(total, abs=1e-5), got
    assert (got["total"]["runs"], got["total"]["running"], got["total"]["unknown_gpus"]) == \
        (1, 0, 0), got
    assert [(x["user"], x["runs"]) for x in got["by_user"]] == [(tb2.user, 1)], got
    assert got["by_user"][0]["gpu_hours"] == pytest.approx(total, abs=1e-5), got
    assert {x["host"]: x["gpu_hours"] for x in got["by_host"]} == {
        name: pytest.approx(h, abs=1e-5) for name, h in want.items()}, got
    assert [(x["job"], x["runs"]) for x in got["by_job"]] == [("gpuhours", 1)], got
    text = cli("usage", timeout=60).stdout
    assert re.search(rf"^{re.escape(tb2.user)} +{total:.2f} +1$", text, re.M), text
