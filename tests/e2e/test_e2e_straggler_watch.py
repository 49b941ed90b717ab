"""The straggler watch of `fleet up` end to end through the real CLI: a job of compute plus a
Gloo all_reduce in which the rank on one host sleeps a little in every step (slow by itself,
nothing throttled) is named, once, as the straggler with its host: a `straggler` event in `up
--json`, one warning line in the text form, and `fleet status` of the run says it afterwards
from the laptop's record. With `straggler_action = "replace"` the attempt is stopped and the
next one runs with the spare in that host's place."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# The rank on the host named by the second argument sleeps in every step. Rank 0 ends every
# rank at the same step (its word carried by the all_reduce): once the file named by the first
# argument exists (the test writes it once it has seen the name), after `LAST` seconds from
# the second attempt on, or after 90 s.
SLOW = '''import os, socket, sys, time
import torch, torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, stop, began = dist.get_rank(), sys.argv[1], time.monotonic()
slow = socket.gethostname() == sys.argv[2]
last = float(os.environ["LAST"]) if os.environ.get("FLEET_ATTEMPT", "1") != "1" else 90
x = torch.randn(32, 32)
step = 0
while True:
    x = torch.tanh(x @ x)
    if slow:
        time.sleep(0.3)  # the straggler: slow by itself
    done = rank == 0 and (os.path.exists(stop) or time.monotonic() - began > last)
    flag = torch.tensor([1.0 if done else 0.0])
    dist.all_reduce(flag)  # every rank ends at the same step
    step += 1
    if step % 5 == 0:
        print(f"rank {rank} step {step}", flush=True)
    if flag.item() > 0:
        break
dist.destroy_process_group()
print(f"rank {rank} on {socket.gethostname()} done after {step} steps", flush=True)
'''


def slow_job(d: Path, tb: Testbed, port: int, stop: Path, more: str = "",
             hosts: tuple[str, ...] = ("node1", "node2"),
             spares: tuple[str, ...] = ()) -> Path:
    """The job on `hosts` (one rank each), the rank on node2 the slow one."""
    d.mkdir(exist_ok=True)
    tb.inventory(d / "inv.toml", [*hosts, *spares], per_host={s: {"spare": True}
                                                            for s in spares})
    (d / "slow.py").write_text(SLOW)
    job = d / "job.toml"
    job.write_text(f'inventory = "inv.toml"\nscript = "slow.py"\nargs = ["{stop}", "node2"]\n'
                   f'nproc_per_node = 1\nenv = {{ LAST = "8" }}\n[rendezvous]\nport = {port}\n'
                   f"[watchdog]\nstraggler = 1.3\n{more}")
    return job


class Followed:
    """`fleet up` run in the background, both its streams kept whole; the job told to end
    (the stop file) at the first line `named` finds on stdout or stderr."""

    def __init__(self, p: subprocess.Popen[str], named: Callable[[str], bool],
                 stop: Path) -> None:
        self.p, self.named, self.stop = p, named, stop
        self.lines: dict[str, list[str]] = {"out": [], "err": []}
        self.readers = [threading.Thread(target=self.read, args=(n, s), daemon=True)
                        for n, s in (("out", p.stdout), ("err", p.stderr))]
        for r in self.readers:
            r.start()

    def read(self, name: str, stream: Iterable[str]) -> None:
        for line in stream:
            self.lines[name].append(line)
            if self.named(line) and not self.stop.exists():
                self.stop.write_text("named\n")

    def end(self) -> tuple[str, str]:
        try:
            self.p.wait(timeout=180)
        finally:
            if self.p.poll() is None:
                self.p.kill()
        for r in self.readers:
            r.join(10)
        return "".join(self.lines["out"]), "".join(self.lines["err"])


def test_up_names_the_slow_rank_once_and_status_keeps_it(cli: CLI, tb3: Testbed,
                                                         tmp_path: Path) -> None:
    home = tb3.host("node1").home
    stops = (home / f"stop-{tmp_path.name}-json", home / f"stop-{tmp_path.name}-text")
    # Two runs of the job side by side on the two hosts (--force on both: the second starts
    # beside the first), to keep the test short: one with --json, one with the words. The
    # second is started once the first runs: two launches preparing a host at the same moment
    # refuse each other (fleet's claim), --force or not.
    as_json = Followed(cli.popen("up", "--json", "--force", str(slow_job(tmp_path / "j", tb3, 29571,
                                                              stops[0]))),
                       lambda line: '"event": "straggler"' in line, stops[0])
    deadline = time.monotonic() + 120
    while not any('"step": "running"' in line for line in list(as_json.lines["out"])):
        assert as_json.p.poll() is None and time.monotonic() < deadline, as_json.lines
        time.sleep(0.5)
    as_text = Followed(cli.popen("up", "--force", str(slow_job(tmp_path / "t", tb3, 29572,
                                                               stops[1]))),
                       lambda line: line.startswith("fleet: straggler: "), stops[1])
    out, err = as_json.end()
    text_out, text_err = as_text.end()

    # --json: the straggler event, with rank 1 and its host.
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    verdict = events[-1]
    assert verdict["event"] == "verdict" and verdict["status"] == "succeeded", out + err
    named = [e for e in events if e["event"] == "straggler"]
    assert len(named) == 1, out
    s = named[0]
    assert (s["rank"], s["host"]) == (1, "node2") and s["score"] >= 1.3, s
    assert s["place"] == "all_reduce()" and 0 < s["others_wait"] <= 1
    assert s["line"].startswith("rank 1 (node2) is the straggler: the others wait for it in "
                                "all_reduce() ")
    # Said while the run went on: the job ended because the test saw it.
    kinds = [e["event"] for e in events]
    assert kinds.index("straggler") < kinds.index("node_ended")
    run_id = verdict["run_id"]

    # The text form: one warning line.
    said = [line for line in text_err.splitlines() if "straggler" in line]
    assert len(said) == 1, text_err
    assert said[0].startswith("fleet: straggler: rank 1 (node2) is the straggler: the others "
                              "wait for it in all_reduce() "), text_err
    assert "rank 0 on node1 done after" in text_out and "rank 1 on node2 done after" in text_out
    assert_nothing_left(tb3, run_id)
    assert_nothing_left(tb3, run_id_of(text_err))

    # `fleet status` of the finished run, from the laptop's record alone.
    st = cli("status", run_id)
    assert st.returncode == 0, st.stdout + st.stderr
    assert f"  straggler: {s['line']} (named at " in st.stdout, st.stdout
    js = json.loads(cli("status", run_id, "--json").stdout)
    assert {k: js["straggler"][k] for k in ("rank", "host", "line")} == \
        {"rank": 1, "host": "node2", "line": s["line"]}
    # and `fleet top` of it: ended, said from the record with what the watch named
    top = cli("top", run_id, "--once")
    assert top.returncode == 0, top.stdout + top.stderr
    assert f"straggler: {s['line']} (named at " in top.stdout, top.stdout
    assert top.stdout.rstrip().endswith("(the run has ended)"), top.stdout


def test_replace_stops_the_attempt_and_the_spare_takes_the_slow_hosts_place(
        cli: CLI, tb3: Testbed, tmp_path: Path) -> None:
    job = slow_job(tmp_path, tb3, 29573, tmp_path / "never", spares=("node3",),
                   more='straggler_action = "replace"\n[restart]\nmax = 1\nbackoff = 0\n')
    r = cli("up", "--json", str(job), timeout=240)
    events = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert r.returncode == 0 and events[-1]["event"] == "verdict", r.stdout + r.stderr
    assert events[-1]["status"] == "succeeded"
    named = [e for e in events if e["event"] == "straggler"]
    assert [(e["rank"], e["host"]) for e in named] == [(1, "node2")], r.stdout  # once
    notes = [e["words"] for e in events if e["event"] == "note"]
    assert "straggler: stopping this attempt; node2 gives way to spare node3 in the next " \
           "one" in notes, notes
    kinds = [e["event"] for e in events]
    first_end = kinds.index("node_ended")
    assert kinds.index("straggler") < first_end
    stopped = [e for e in events[first_end:first_end + 2] if e["event"] == "node_ended"]
    assert stopped and all(e["status"] == "stopped" and e["detail"] ==
                           "straggler watch: rank 1 (node2) is the straggler" for e in stopped)
    attempt = next(e for e in events if e["event"] == "attempt")
    assert (attempt["number"], attempt["why"]) == (2, "rank 1 (node2) was the straggler")
    assert "restart: node2 replaced by spare node3 (rank 1 (node2) was the straggler)" in notes
    # Attempt 2: node3 in node2's place, with its rank; nobody is slow there.
    started = [(e["host"], e["ranks"]) for e in events[kinds.index("attempt"):]
               if e["event"] == "node_started"]
    assert sorted(started) == [("node1", [0]), ("node3", [1])], started
    lines = [e["text"] for e in events if e["event"] == "line"]
    assert "rank 1 on node3 done after" in "\n".join(lines)
    run_id = events[-1]["run_id"]
    st = cli("status", run_id)
    assert re.search(r"attempt 1/2 \(\S+\): stopped, rank 1 \(node2\) was the straggler at "
                     r"\d\d:\d\d:\d\d; node2 replaced by node3", st.stdout), st.stdout
    assert f"  straggler: {named[0]['line']} (named at " in st.stdout, st.stdout
    assert re.search(r"\(named at \d\d:\d\d:\d\d in attempt 1\)", st.stdout), st.stdout
    for one in (run_id, f"{run_id}-a2"):
        assert_nothing_left(tb3, one)
