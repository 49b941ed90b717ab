"""The straggler watch of `fleet up` end to end through the real CLI: a job of compute plus a
Gloo all_reduce in which rank 1 sleeps a little in every step (slow by itself, nothing
throttled) is named, once, as the straggler with its host: a `straggler` event in `up --json`,
one warning line in the text form, and `fleet status` of the run says it afterwards from the
laptop's record. The job ends itself, every rank at the same step, once the test has seen the
name (rank 0 reads a file the test writes in its home, and the all_reduce carries its word)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

SLOW = '''import os, sys, time
import torch, torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, stop, began = dist.get_rank(), sys.argv[1], time.monotonic()
x = torch.randn(32, 32)
step = 0
while True:
    x = torch.tanh(x @ x)
    if rank == 1:
        time.sleep(0.3)  # the straggler: slow by itself
    done = rank == 0 and (os.path.exists(stop) or time.monotonic() - began > 90)
    flag = torch.tensor([1.0 if done else 0.0])
    dist.all_reduce(flag)  # every rank ends at the same step
    step += 1
    if step % 5 == 0:
        print(f"rank {rank} step {step}", flush=True)
    if flag.item() > 0:
        break
dist.destroy_process_group()
print(f"rank {rank} done after {step} steps", flush=True)
'''


def slow_job(tmp_path: Path, tb: Testbed, port: int, stop: Path) -> Path:
    tmp_path.mkdir(exist_ok=True)
    tb.inventory(tmp_path / "inv.toml")
    (tmp_path / "slow.py").write_text(SLOW)
    job = tmp_path / "job.toml"
    job.write_text(f'inventory = "inv.toml"\nscript = "slow.py"\nargs = ["{stop}"]\n'
                   f"nproc_per_node = 1\n[rendezvous]\nport = {port}\n"
                   "[watchdog]\nstraggler = 1.3\n")
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


def test_up_names_the_slow_rank_once_and_status_keeps_it(cli: CLI, tb2: Testbed,
                                                         tmp_path: Path) -> None:
    home = tb2.host("node1").home
    stops = (home / f"stop-{tmp_path.name}-json", home / f"stop-{tmp_path.name}-text")
    # Two runs of the job side by side on the two hosts (--force: the first holds them), to
    # keep the test short: one with --json, one with the terminal's words.
    as_json = Followed(cli.popen("up", "--json", str(slow_job(tmp_path / "j", tb2, 29571,
                                                              stops[0]))),
                       lambda line: '"event": "straggler"' in line, stops[0])
    as_text = Followed(cli.popen("up", "--force", str(slow_job(tmp_path / "t", tb2, 29572,
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
    assert "rank 0 done after" in text_out and "rank 1 done after" in text_out
    assert_nothing_left(tb2, run_id)
    assert_nothing_left(tb2, run_id_of(text_err))

    # `fleet status` of the finished run, from the laptop's record alone.
    st = cli("status", run_id)
    assert st.returncode == 0, st.stdout + st.stderr
    assert f"  straggler: {s['line']} (named at " in st.stdout, st.stdout
    js = json.loads(cli("status", run_id, "--json").stdout)
    assert {k: js["straggler"][k] for k in ("rank", "host", "line")} == \
        {"rank": 1, "host": "node2", "line": s["line"]}
