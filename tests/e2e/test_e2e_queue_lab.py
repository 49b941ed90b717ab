"""The queue in a lab's life, through the real CLI on three real sshd hosts with two stand-in
GPUs each and a colleague, alice, who queues runs of her own: two submitters at once never
share a GPU; her lease and her process are never run over (and `fleet queue` says what waits
for them); a sweep stopped leaves nothing behind (and a run stopped alone is stopped, not
failed); a failing run does not stop the others; a host lost mid-sweep has its runs said lost
and started again elsewhere under [restart]; an agent that died is followed by one that
adopts its runs. Every test ends with nothing of fleet's left on any host (the runner and the
agents end by themselves once nothing is queued)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_queue import H100, SLEEPER, state, wait_until
from tests.e2e.test_e2e_up import assert_no_strays
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

QUIET_S = 60  # the runner ends 15 s after its last run, its agents when it says goodbye


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    with Testbed(3, colleagues=("alice",)) as bed:
        for h in bed.hosts:
            bed.fake_gpus(h.name, {"gpus": [H100] * 2, "apps": []})
        yield bed


def job(where: Path, extra: str = "") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "sleeper.py").write_text(SLEEPER)
    path = where / "job.toml"
    path.write_text('inventory = "inv.toml"\nscript = "sleeper.py"\ngpus_per_node = 1\n'
                    '[metrics]\nloss = "loss (?P<v>[0-9.]+)"\n' + extra)
    return path


def spans(runs: dict[str, dict]) -> dict[tuple[str, int], list[tuple[float, float]]]:  # type: ignore[type-arg]
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for x in runs.values():
        if x["started"] is not None:
            for g in x["gpus"]:
                out.setdefault((x["host"], g), []).append((x["started"], x["ended"] or 1e12))
    return out


def assert_no_overlap(every: dict[tuple[str, int], list[tuple[float, float]]]) -> None:
    for gpu, s in every.items():
        s.sort()
        for (_, end), (start, _) in zip(s, s[1:], strict=False):
            assert start >= end, f"{gpu} ran two runs at once: {s}"


def runs_of(tb: Testbed, sweep: str, home: Path | None = None) -> dict[str, dict]:  # type: ignore[type-arg]
    """The sweep's runs in the runner's state (earlier sweeps' stay there a while)."""
    runs = (state_of(tb, "node1", home) or {}).get("runs", {})
    return {k: x for k, x in runs.items() if x.get("sweep") == sweep}


def sweep_id(out: str) -> str:
    """`sweep <id>: N runs queued; ...`"""
    return out.split()[1].rstrip(":")


def ended(tb: Testbed, sweep: str, n: int, home: Path | None = None) -> bool:
    runs = runs_of(tb, sweep, home)
    return len(runs) == n and all(x["state"] in ("succeeded", "failed", "lost", "stopped")
                                  for x in runs.values())


def state_of(tb: Testbed, host: str, home: Path | None) -> dict:  # type: ignore[type-arg]
    if home is None:
        return state(tb, host)
    r = tb.exec(host, "sh", "-c", f"cat {home}/fleet/queue/state.json 2>/dev/null || echo '{{}}'")
    return json.loads(r.stdout or "{}")  # type: ignore[no-any-return]


def alice_home(tb: Testbed, host: str) -> Path:
    r = tb.exec(host, "sh", "-c", "getent passwd alice | cut -d: -f6")
    return Path(r.stdout.strip())


def test_two_submitters_at_once_never_share_a_gpu(tb: Testbed, tmp_path: Path) -> None:
    mine, hers = CLI(tmp_path / "me"), CLI(tmp_path / "alice")
    for cli, user in ((mine, {}), (hers, {"user": "alice"})):
        tb.inventory(job(cli.cwd).parent / "inv.toml", hosts=["node1", "node2"], **user)
    results: dict[str, object] = {}

    def sweep(name: str, cli: CLI) -> None:
        results[name] = cli("sweep", str(cli.cwd / "job.toml"), "--grid", "secs=6,7,8,9",
                            "--detach", timeout=240)

    threads = [threading.Thread(target=sweep, args=a) for a in (("me", mine), ("alice", hers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for name, r in results.items():
        assert r.returncode == 0, (name, r.stdout + r.stderr)  # type: ignore[attr-defined]
    home = alice_home(tb, "node1")
    ids = {name: sweep_id(r.stdout) for name, r in results.items()}  # type: ignore[attr-defined]
    wait_until("both sweeps ended", lambda: ended(tb, ids["me"], 4) and ended(
        tb, ids["alice"], 4, home), 240)
    mine_runs, her_runs = runs_of(tb, ids["me"]), runs_of(tb, ids["alice"], home)
    assert all(x["state"] == "succeeded" for x in [*mine_runs.values(), *her_runs.values()])
    every = spans(mine_runs)
    for gpu, s in spans(her_runs).items():
        every.setdefault(gpu, []).extend(s)
    assert_no_overlap(every)
    assert_no_strays(tb, QUIET_S)


def test_a_colleagues_lease_and_process_are_never_run_over(tb: Testbed, tmp_path: Path) -> None:
    cli = CLI(tmp_path)
    tb.inventory(job(tmp_path).parent / "inv.toml", hosts=["node1", "node2"])
    hers = CLI(tmp_path / "alice")
    (tmp_path / "alice").mkdir()
    tb.inventory(tmp_path / "alice" / "inv.toml", hosts=["node1", "node2"], user="alice")
    took = hers("reserve", "-i", str(tmp_path / "alice" / "inv.toml"), "node1:0", "--for", "30m",
                "--note", "my eval")
    assert took.returncode == 0, took.stdout + took.stderr
    pid = tb.start_as("node2", "alice", "sleep", "600")
    tb.fake_gpus("node2", {"gpus": [H100] * 2, "apps": [{"gpu": 1, "pid": pid, "used_mib": 9000}]})
    try:
        r = cli("sweep", str(tmp_path / "job.toml"), "--grid", "secs=5,6,7,8", "--detach")
        assert r.returncode == 0, r.stdout + r.stderr
        seen = ""
        deadline = time.monotonic() + 60
        while "alice" not in seen and time.monotonic() < deadline:
            q = cli("queue")
            assert q.returncode == 0, q.stdout + q.stderr
            seen = q.stdout
            time.sleep(1)
        assert "alice" in seen and "waits for 1 free GPU" in seen, seen
        wait_until("the sweep ended", lambda: ended(tb, sweep_id(r.stdout), 4), 240)
        runs = runs_of(tb, sweep_id(r.stdout))
        assert all(x["state"] == "succeeded" for x in runs.values()), runs
        used = {(x["host"], g) for x in runs.values() for g in x["gpus"]}
        assert used == {("node1", 1), ("node2", 0)}, used
        assert tb.alive("node2", pid)  # her process untouched
    finally:
        tb.kill_in("node2", pid)
        tb.fake_gpus("node2", {"gpus": [H100] * 2, "apps": []})
        hers("release", "-i", str(tmp_path / "alice" / "inv.toml"), "node1:0")
    assert_no_strays(tb, QUIET_S)


def test_a_sweep_stopped_leaves_nothing_behind(tb: Testbed, tmp_path: Path) -> None:
    cli = CLI(tmp_path)
    tb.inventory(job(tmp_path).parent / "inv.toml")
    r = cli("sweep", str(tmp_path / "job.toml"), "--grid", "secs=300,301,302,303,304,305,306,307",
            "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    sid = sweep_id(r.stdout)
    try:  # the sweep stopped whatever fails on the way: the next tests need the GPUs
        wait_until("six running", lambda: sum(
            x["state"] == "running" and x["started"] is not None
            for x in runs_of(tb, sid).values()) == 6, 90)
        # One run stopped on its own (`fleet stop RUN`, its record made by a look): it is
        # stopped, not failed, though it ended non-zero (torchrun's 1, or a TERM's 143).
        assert cli("sweep", "status").returncode == 0
        one = next(k for k, x in runs_of(tb, sid).items() if x["state"] == "running")
        alone = cli("stop", one, timeout=120)
        wait_until("its end heard", lambda: runs_of(tb, sid)[one]["state"] != "running", 60)
        runs = runs_of(tb, sid)
    finally:
        stop = cli("sweep", "stop", sid, timeout=150)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert runs[one]["state"] == "stopped" and runs[one]["code"] != 0, runs[one]
    assert sum(x["state"] == "running" for x in runs.values()) >= 5, runs  # the others ran on
    assert stop.returncode == 0, stop.stdout + stop.stderr
    status = json.loads(cli("sweep", "status", "--json").stdout)
    assert [x["state"] for x in status["runs"]] == ["stopped"] * 8, status
    for x in status["runs"]:
        for h in tb.hosts:
            assert tb.run_processes(h.name, x["run_id"]) == [], x
    assert_no_strays(tb, QUIET_S)


def test_a_failing_run_does_not_stop_the_others(tb: Testbed, tmp_path: Path) -> None:
    cli = CLI(tmp_path)
    tb.inventory(job(tmp_path).parent / "inv.toml")
    r = cli("sweep", str(tmp_path / "job.toml"), "--grid", "secs=4,5", "--grid", "fail=no,yes",
            timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr  # followed to the end: one failed
    status = json.loads(cli("sweep", "status", "--json").stdout)
    states = {(x["params"]["secs"], x["params"]["fail"]): x for x in status["runs"]}
    for secs in ("4", "5"):
        assert states[(secs, "no")]["state"] == "succeeded", states
        assert states[(secs, "yes")]["state"] == "failed", states
        assert states[(secs, "yes")]["exit_code"] == 1, states
    assert "failed after" in r.stdout and "exit code 1" in r.stdout, r.stdout
    assert_no_strays(tb, QUIET_S)


def test_submit_queues_one_run_with_its_arguments(tb: Testbed, tmp_path: Path) -> None:
    cli = CLI(tmp_path)
    tb.inventory(job(tmp_path).parent / "inv.toml")
    r = cli("submit", str(tmp_path / "job.toml"), "--priority", "5", "--", "--secs", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    run = r.stdout.split()[1].rstrip(":")
    sid = run.rsplit("-", 1)[0]
    wait_until("it ended", lambda: ended(tb, sid, 1), 120)
    status = json.loads(cli("sweep", "status", sid, "--json").stdout)
    assert [x["state"] for x in status["runs"]] == ["succeeded"], status
    assert status["kind"] == "submit" and status["runs"][0]["priority"] == 5, status
    assert status["runs"][0]["metrics"] == {"loss": 33.3333}, status
    logs = cli("logs", run)
    assert "loss 33.3333" in logs.stdout, logs.stdout + logs.stderr
    assert_no_strays(tb, QUIET_S)


def test_an_agent_that_died_is_followed_by_one_that_adopts_its_runs(
        tb: Testbed, tmp_path: Path) -> None:
    """The agent dies (not its host, nor its runs): the next submit starts a new one, which
    waits on the runs the old one left, gives their leases back and says their ends."""
    cli = CLI(tmp_path)
    tb.inventory(job(tmp_path).parent / "inv.toml")
    r = cli("sweep", str(tmp_path / "job.toml"), "--grid", "secs=30,31", "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    sid = sweep_id(r.stdout)
    wait_until("both running", lambda: sum(
        x["started"] is not None for x in runs_of(tb, sid).values()) == 2, 90)
    host = next(iter(runs_of(tb, sid).values()))["host"]
    agents = tb.exec(host, "pgrep", "-f", "queue_agent.py").stdout.split()
    assert len(agents) == 1, agents
    tb.kill_in(host, int(agents[0]))
    more = cli("submit", str(tmp_path / "job.toml"), "--", "--secs", "1")
    assert more.returncode == 0, more.stdout + more.stderr
    wait_until("the sweep ended", lambda: ended(tb, sid, 2), 120)
    runs = runs_of(tb, sid)
    for k, x in runs.items():
        assert (x["state"], x["attempt"], x.get("lost", [])) == ("succeeded", 1, []), (k, x)
    assert sorted(x["metrics"]["loss"] for x in runs.values()) == [3.2258, 3.3333], runs
    leases = tb.dir / f"vartmp-{host}" / "fleet-leases"
    wait_until("their run leases given back", lambda: not [
        p for p in leases.glob("*.lease") if json.loads(p.read_text()).get("run") in runs], 30)
    assert_no_strays(tb, QUIET_S)


def test_a_host_lost_mid_sweep_has_its_runs_started_again(tb: Testbed, tmp_path: Path) -> None:
    """Last in this file: node3 does not come back."""
    cli = CLI(tmp_path)
    tb.inventory(job(tmp_path, "[restart]\nmax = 1\nbackoff = 1\n").parent / "inv.toml")
    r = cli("sweep", str(tmp_path / "job.toml"), "--grid", "secs=25,26,27,28,29,30",
            "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    sid = sweep_id(r.stdout)
    wait_until("node3 runs two", lambda: sum(
        x["host"] == "node3" and x["started"] is not None
        for x in runs_of(tb, sid).values()) == 2, 90)
    lost = {k for k, x in runs_of(tb, sid).items() if x["host"] == "node3"}
    tb.kill_host("node3")
    wait_until("the sweep ended", lambda: ended(tb, sid, 6), 300)
    runs = runs_of(tb, sid)
    for k, x in runs.items():
        assert x["state"] == "succeeded", (k, x)
        assert x["attempt"] == (2 if k in lost else 1), (k, x)
        if k in lost:
            assert x["lost"] == ["node3"] and x["host"] != "node3", x
    text = cli("sweep", "status").stdout
    assert text.count("(attempt 2)") == 2, text
    deadline = time.monotonic() + QUIET_S
    while any(tb.stray_processes(h) for h in ("node1", "node2")):
        assert time.monotonic() < deadline, {h: tb.stray_processes(h) for h in ("node1", "node2")}
        time.sleep(0.5)
