"""Stragglers and `fleet top`, end to end through the real CLI on four real sshd hosts of this
module's own testbed, one rank a host, running tests/e2e/straggler_job.py (compute, then a Gloo
all_reduce, step after step) under `fleet up` with `[watchdog] straggler = 1.3`:
- once the job steps, each host a machine of 0.15 of a CPU of its own (Testbed.cpu_machine) for
  as long as the test looks for the straggler, so that the hosts keep one speed whatever the
  rest of the suite runs beside them (where they shared this machine's CPUs by weight, a load
  that came after the measure slowed every host alike, and the throttled one was no longer the
  slowest);
- node3's every process held by a CPU quota (Testbed.cpu_quota: the quota of the host's own
  cgroup of the cgroup v1 cpu controller) to two thirds of the CPU it used unthrottled, so that
  every step is about 1.5x slower: its rank is named by `fleet top --once` (its last line) and
  its `--json`, with the throttling as evidence, and by `fleet up` (a warning, said once; the
  event kept in the run's record, which `status --json` and `status` say);
- a clean run (`fleet up --json`) names none: not `top --once` once the ranks' window has
  filled, not one straggler event in up's stream, nothing in the record;
- `fleet top --once --json` parses, and its states are those `fleet status` says.
After each the run is stopped and nothing of it is left on any host."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_heal import assert_clean, no_traceback
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed, cpu_quota_available

pytestmark = pytest.mark.e2e

JOB = Path(__file__).with_name("straggler_job.py")
HOST_CPUS = 0.15  # each host's own CPU while the test looks (four: under a third of 2 CPUs)
SLOWER = 1.5  # the throttled host gets 1/SLOWER of the CPU it used unthrottled
NAMED_WITHIN_S = 90  # `top --once` is asked again until it names a rank, this long at most
FILLED_S = 25  # the ranks' sampling window (20 s) filled, and a little more
STEPPING_S = 180  # the job started and stepping on every host (torch imported on a busy machine)
VERDICT = re.compile(r"^straggler: (?:none(?: \(.+\))?|rank (\d+) \((\S+)\) is the straggler: "
                     r"the others wait for it in .+)$")
STEP = re.compile(r"rank (\d+) on (\S+) step (\d+) step_s ([\d.]+) cpu_s [\d.]+$")
ROW = re.compile(r"^\s+(\S+)\s+node rank (\d+) \(ranks? [\d-]+\)\s+(\S+)")


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    """Four hosts, each in its own cpu cgroup from the start (as each machine's job is in a
    container's or Slurm's), where limits are then set and lifted in place."""
    _need_testbed()
    why = cpu_quota_available()
    if why is not None:
        pytest.fail(f"the straggler tests cannot slow a host: {why}")
    with Testbed(4) as bed:
        for h in bed.hosts:
            bed.cpu_cgroup(h.name)
        yield bed


def job(tb: Testbed, tmp_path: Path, port: int) -> Path:
    """The straggler job on the four hosts, long enough for any test here (each stops it)."""
    d = tmp_path / "job"
    d.mkdir()
    tb.inventory(d / "inv.toml")
    (d / "steps.py").write_text(JOB.read_text())
    path = d / "steps.toml"  # no "straggler" in the run's id, nor in what status says of it
    path.write_text('inventory = "inv.toml"\nscript = "steps.py"\nnproc_per_node = 1\n'
                    'args = ["--seconds", "600"]\n'
                    f"[rendezvous]\nport = {port}\n[watchdog]\nstraggler = 1.3\n")
    return path


class Up:
    """`fleet up JOB` (`--json`: its events) in the background, its stdout and stderr in
    files."""

    def __init__(self, cli: CLI, job: Path, tmp_path: Path, as_json: bool = False) -> None:
        self.out, self.err, self.as_json = tmp_path / "up.out", tmp_path / "up.err", as_json
        with self.out.open("wb") as o, self.err.open("wb") as e:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleet", "up", *(["--json"] if as_json else []),
                 str(job)], cwd=cli.cwd, env=cli.env, stdout=o, stderr=e,
                stdin=subprocess.DEVNULL)

    def _whole(self) -> list[str]:
        text = self.out.read_text()
        return text[:text.rfind("\n") + 1].splitlines()

    def events(self) -> list[dict[str, Any]]:
        """Every whole line of stdout so far, each one JSON object (--json)."""
        assert self.as_json
        return [json.loads(x) for x in self._whole()]

    def lines(self) -> list[str]:
        """The job's lines so far, as fleet passed them on (tagged, unless --json)."""
        if not self.as_json:
            return self._whole()
        return [e.get("text", "") for e in self.events() if e["event"] == "line"]

    def said(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def run_id(self) -> str:
        if not self.as_json:
            return run_id_of(self.err.read_text())
        return next(e["run_id"] for e in self.events() if e.get("run_id"))

    def stepping(self) -> dict[str, int]:
        """host -> global rank, once every rank of the four hosts printed its 10th step."""
        deadline = time.monotonic() + STEPPING_S
        while True:
            seen = {}
            for line in self.lines():
                m = STEP.search(line)
                if m and int(m.group(3)) >= 10:
                    seen[m.group(2)] = int(m.group(1))
            if len(seen) == 4:
                return seen
            assert self.proc.poll() is None and time.monotonic() < deadline, self.said()
            time.sleep(0.5)

    def step_times(self, host: str, since: int = 0) -> list[float]:
        """The job's step times on `host`, from its lines after the first `since` of them."""
        times = [float(m.group(4)) for line in self.lines()
                 if (m := STEP.search(line)) and m.group(2) == host]
        return times[since:]

    def abandon(self, cli: CLI, run_id: str) -> None:
        """On a test's way out, failed or not: a run still going is stopped, `up` ended."""
        if self.proc.poll() is None:
            if run_id:
                cli("stop", run_id, timeout=120)
            self.proc.kill()
            self.proc.wait()

    def stop(self, cli: CLI, tb: Testbed, run_id: str) -> None:
        """`fleet stop` of the run, `up` ended by it, nothing of the run left on any host."""
        try:
            r = cli("stop", run_id, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.returncode == 4, self.said()  # stopped by fleet stop
        assert_clean(tb, [run_id])
        no_traceback(self.err.read_text())


def top_once(cli: CLI, run_id: str) -> tuple[str, re.Match[str]]:
    """`fleet top RUN --once`: its output, and its verdict (its last line)."""
    r = cli("top", run_id, "--once", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.rstrip("\n").rsplit("\n", 1)[-1]
    m = VERDICT.match(last)
    assert m, r.stdout + r.stderr
    return r.stdout, m


def named_in_text(cli: CLI, run_id: str, rank: int, deadline: float,
                  why: Callable[[], str]) -> str:
    """`fleet top --once` asked again until its verdict names a rank (then it must be `rank`,
    as no other may be named meanwhile, while the window fills); its output."""
    while True:
        shown, verdict = top_once(cli, run_id)
        assert verdict.group(1) in (None, str(rank)), shown
        if verdict.group(1):
            return shown
        assert time.monotonic() < deadline, f"{shown}\n{why()}"
        time.sleep(2)


def named_in_json(cli: CLI, run_id: str, rank: int, deadline: float,
                  why: Callable[[], str]) -> dict[str, Any]:
    """`fleet top --once --json` asked again until it names a rank (`rank`, as above): a rank
    named once may fall back under the factor at the next look while the window fills."""
    while True:
        r = cli("top", run_id, "--once", "--json", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        top: dict[str, Any] = json.loads(r.stdout)
        named = top["straggler"]
        assert named is None or named["rank"] == rank, top
        if named:
            return top
        assert time.monotonic() < deadline, f"{top}\n{why()}"
        time.sleep(2)


def status_rows(cli: CLI, run_id: str) -> tuple[dict[str, Any], dict[str, tuple[int, str]]]:
    """`fleet status --json`, and per node (node rank, state word) from its rows."""
    r = cli("status", run_id, "--json", timeout=120)
    out = json.loads(r.stdout)
    rows = {m.group(1): (int(m.group(2)), m.group(3))
            for line in out["lines"] if (m := ROW.match(line))}
    return out, rows


def stragglers(up: Up) -> list[dict[str, Any]]:
    return [e for e in up.events() if e["event"] == "straggler"]


def test_the_throttled_hosts_rank_is_named(tb: Testbed, cli: CLI, tmp_path: Path) -> None:
    up = Up(cli, job(tb, tmp_path, 29941), tmp_path)
    run_id = ""
    try:
        rank_of = up.stepping()
        run_id = up.run_id()
        rank = rank_of["node3"]
        with tb.cpu_machine([h.name for h in tb.hosts], HOST_CPUS):
            time.sleep(2)  # the hosts at their speed
            t0, c0 = time.monotonic(), tb.cpu_seconds("node3")
            time.sleep(5)
            used = (tb.cpu_seconds("node3") - c0) / (time.monotonic() - t0)
            clean = len(up.step_times("node3"))
            held = min(used, HOST_CPUS) / SLOWER
            with tb.cpu_quota("node3", held) as cg:
                deadline = time.monotonic() + NAMED_WITHIN_S

                def why() -> str:
                    return (f"node3 ({used:.2f} CPU unthrottled, held to {held:.2f}): step "
                            f"times {up.step_times('node3', since=clean)} after "
                            f"{up.step_times('node3')[:clean]}; {(cg / 'cpu.stat').read_text()}")

                shown = named_in_text(cli, run_id, rank, deadline, why)
                assert f"rank {rank} (node3) is the straggler: " in shown, shown
                # JSON's own bound: the text look may have taken most of the first (the window, and
                # so the score, moves between two looks on a loaded machine).
                top = named_in_json(cli, run_id, rank, time.monotonic() + NAMED_WITHIN_S, why)
                named = top["straggler"]
                assert (named["rank"], named["host"]) == (rank, "node3"), top
                assert named["score"] >= 1.3 and 0 < named["others_wait"] < 1, top
                assert named["line"].startswith(f"rank {rank} (node3) is the straggler: "), top
                assert named["line"].endswith("; node3 CPU throttled " + f"{named['throttled']:.0%}"
                                              " of the time") and named["throttled"] > 0.05, top
                # fleet up reads the ranks every 5 s and names one seen 3 looks in a row: a warning.
                warning = f"fleet: straggler: rank {rank} (node3) is the straggler: "
                deadline = time.monotonic() + 60
                while warning not in up.err.read_text():
                    assert up.proc.poll() is None and time.monotonic() < deadline, up.said()
                    time.sleep(1)
        up.stop(cli, tb, run_id)
    finally:
        up.abandon(cli, run_id)
    said = up.err.read_text()
    assert said.count(warning) == 1, said  # said once
    # The event, as the run's record keeps it (with when, and in which attempt).
    kept = json.loads(cli("status", run_id, "--json", timeout=120).stdout)["straggler"]
    assert (kept["rank"], kept["host"], kept["run_id"]) == (rank, "node3", run_id), kept
    assert kept["score"] >= 1.3 and kept["line"].startswith(
        f"rank {rank} (node3) is the straggler: "), kept
    status = cli("status", run_id, timeout=120).stdout
    assert re.search(rf"^\s*straggler: rank {rank} \(node3\) is the straggler: ", status,
                     re.M), status


def test_a_clean_run_names_none_and_top_json_is_what_status_says(
        tb: Testbed, cli: CLI, tmp_path: Path) -> None:
    up = Up(cli, job(tb, tmp_path, 29942), tmp_path, as_json=True)
    run_id = ""
    try:
        rank_of = up.stepping()
        run_id = up.run_id()
        time.sleep(FILLED_S)
        shown, verdict = top_once(cli, run_id)
        assert verdict.group(0) == "straggler: none", shown
        r = cli("top", run_id, "--once", "--json", timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        top = json.loads(r.stdout)
        status, rows = status_rows(cli, run_id)
        up.stop(cli, tb, run_id)
    finally:
        up.abandon(cli, run_id)
    assert top["run_id"] == run_id and top["straggler"] is None, top
    assert top["status"] == status["status"] == "running", (top, status)
    # Every node as status says it, in node rank order; every rank on its host, its state its
    # node's.
    assert [(n["host"], n["node_rank"], n["status"]) for n in top["nodes"]] == [
        (h, rank, word) for h, (rank, word) in sorted(rows.items(), key=lambda x: x[1][0])]
    assert [n["host"] for n in top["nodes"]] == [n["host"] for n in status["nodes"]]
    words = {n["host"]: n["status"] for n in top["nodes"]}
    assert sorted((x["rank"], x["host"]) for x in top["ranks"]) == sorted(
        (rank, host) for host, rank in rank_of.items()), top["ranks"]
    for x in top["ranks"]:
        assert x["status"] == words[x["host"]] == "running" and x["alive"] is True, x
        assert isinstance(x["pid"], int) and x["samples"] > 0, x
        assert 0 <= x["wait_share"] <= 1 and isinstance(x["score"], float) and x["where"], x
        assert x["cpu_pct"] is not None and x["rss"] > 0, x
    for n in top["nodes"]:
        assert n["log"]["lines_per_s"] is not None, n
    assert stragglers(up) == [], up.said()
    assert status["straggler"] is None, status
    status_text = cli("status", run_id, timeout=120).stdout
    assert "straggler" not in status_text, status_text
