"""Stragglers: what a rank's sampler says of its stack (fleet/nodeside/shared/sampling.py), the
node's answer read as the untrusted text it is (fleet.facts.ranktop), the verdict
(fleet.run.straggler), and the sampler itself in a real Python process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import nodeside
from fleet.facts.ranktop import NodeTop, RankSample, parse_top
from fleet.nodeside.shared.sampling import (
    COLLECTIVE,
    COMPUTE,
    DATA_WAIT,
    MAGIC,
    Window,
    cgroup_cpu_stat,
    classify,
    throttling,
)
from fleet.run.straggler import FACTOR, MIN_SAMPLES, Watch, judge, ranks_of

C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


def test_a_stack_is_a_collective_a_data_wait_or_its_innermost_function() -> None:
    user = ("/w/train.py", "step", 12)
    assert classify([(C10D, "all_reduce", 2050), ("/w/x.py", "wrapper", 3), user]) == \
        (COLLECTIVE, "all_reduce()")
    loader = "/x/torch/utils/data/dataloader.py"
    assert classify([("/x/torch/utils/data/_utils/fetch.py", "fetch", 1), (loader, "__next__", 7),
                     user]) == (DATA_WAIT, "DataLoader.__next__()")
    assert classify([("/x/torch/nn/modules/linear.py", "forward", 116), user]) == \
        (COMPUTE, "forward() (linear.py)")
    # a function of the job's own named all_reduce is the job's compute, not a collective
    assert classify([("/w/mine.py", "all_reduce", 1)]) == (COMPUTE, "all_reduce() (mine.py)")
    assert classify([]) == (COMPUTE, "?")
    fsdp = "/x/torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py"
    assert classify([(fsdp, "wait_for_unshard", 3), user]) == \
        (COLLECTIVE, "wait_for_unshard()")
    assert classify([(fsdp, "unshard", 3), user]) == (COMPUTE, "unshard() (_fsdp_param_group.py)")


def summary(rank: int, n: int, coll: int, *, pid: int = 100, at: float = 1000.0,
            throttled: str = "-", dist: int = 1) -> str:
    return "\n".join([
        MAGIC, f"rank {rank} local 0 pid {pid} dist {dist}",
        f"time {at:.3f} window 20.0 samples {n} collective {coll}",
        f"cpu 95.0 rss 1048576 throttled {throttled}",
        "now collective all_reduce()",
        f"place {coll} collective all_reduce()",
        f"place {n - coll} compute forward() (model.py)"])


def answer(*summaries: tuple[int, str], now: float = 1001.0, extra: str = "") -> str:
    out = [f"=== now {now}", "=== stamps 100 990.0 600 1000.5", "=== lines 50", extra]
    for pid, text in summaries:
        out += [f"=== sample {pid}", *("|" + line for line in text.splitlines()), ""]
    return "\n".join(out)


def test_the_window_summary_reads_back_whole() -> None:
    w = Window(20)
    for i in range(100):
        w.add(1000.0 + i * 0.2, *((COLLECTIVE, "all_reduce()") if i % 4 == 0
                                  else (COMPUTE, "forward() (m.py)")))
    w.mark(1000.0, 10.0, 100, 0)
    w.mark(1019.8, 29.0, 300, 100)
    text = w.summary(5, 1, 4242, True, 1019.8, 2048)
    top = parse_top(answer((4242, text), now=1020.0))
    (s,) = top.samples
    assert (s.rank, s.local_rank, s.pid, s.joined, s.samples, s.collective) == \
        (5, 1, 4242, True, 100, 25)
    assert s.cpu_pct == pytest.approx(19 / 19.8 * 100, abs=0.1)
    assert s.throttled == pytest.approx(0.5)
    assert s.rss == 2048 and s.alive and s.age_s == pytest.approx(0.2, abs=1e-6)
    assert s.places[0].where == "forward() (m.py)" and s.places[0].count == 75
    # the log's 50 last lines came since the stamp at 990.0, 30 s before the node's now
    assert top.lines == 50 and top.lines_per_s == pytest.approx(50 / 30.0)
    assert top.last_line_age_s == pytest.approx(19.5)


def test_old_samples_leave_the_window() -> None:
    w = Window(20)
    w.add(1000.0, COMPUTE, "a() (x.py)")
    w.add(1030.0, COLLECTIVE, "barrier()")
    assert "samples 1 collective 1" in w.summary(0, 0, 1, True, 1030.5, None)


@pytest.mark.parametrize("bad", [
    summary(1, 10, 2).replace("pid 100", "pid 101"),  # not its file's pid
    summary(1, 10, 20),  # more in collectives than samples
    summary(1, 10, 2).replace(MAGIC, "fleet-samples 9"),
    summary(1, 10, 2).replace("rank 1 ", "rank -1 "),
    summary(1, 10, 2).replace("time 1000.000", "time nan"),
    summary(1, 10, 2).replace("samples 10", "samples 99999999999999999999"),
    summary(1, 10, 2).replace("dist 1", "dist yes"),
    summary(1, 10, 2).replace("local 0", "local 0 extra 1"),
])
def test_a_summary_that_is_not_fleets_is_left_out(bad: str) -> None:
    assert parse_top(answer((100, bad))).samples == ()


def test_what_the_job_writes_never_passes_for_the_programs_own_words() -> None:
    # a summary's lines all come framed with `|`: a "=== missing" in one is a place's words
    text = summary(1, 10, 2) + "\n=== missing\nplace 3 compute \x1b[31mred\x07 (x.py)"
    top = parse_top(answer((100, text)))
    assert not top.missing and len(top.samples) == 1
    assert all("\x1b" not in p.where and "\x07" not in p.where for p in top.samples[0].places)
    # numbers out of bounds are not believed
    odd = answer((100, summary(1, 10, 2).replace("cpu 95.0", "cpu inf").replace(
        "throttled -", "throttled 7")))
    (s,) = parse_top(odd).samples
    assert s.cpu_pct is None and s.throttled is None
    assert parse_top("=== missing\n").missing
    # a carriage return inside a file's line starts no line of the program's own
    sneaky = answer((100, summary(1, 10, 2) + "\nplace 1 compute x\r=== missing"))
    assert not parse_top(sneaky).missing and len(parse_top(sneaky).samples) == 1


def test_a_rank_is_its_process_in_the_group_and_two_nodes_claiming_it_say_nothing() -> None:
    worker = summary(3, 50, 0, pid=7, dist=0)  # a DataLoader worker carries the rank too
    top = parse_top(answer((100, summary(3, 50, 10)), (7, worker)))
    assert top.ranks()[3].pid == 100
    other = parse_top(answer((200, summary(3, 50, 10, pid=200))))
    assert 3 not in ranks_of({"node1": top, "node2": other})


def ranks(*shares: float, n: int = 100, throttled: str = "-") -> dict[int, tuple[str, RankSample]]:
    tops = {f"node{i + 1}": parse_top(answer((100 + i, summary(
        i, n, round(w * n), pid=100 + i, throttled=throttled if w == 0.02 else "-"))))
        for i, w in enumerate(shares)}
    return ranks_of(tops)


def test_the_rank_the_others_wait_for_is_named_with_its_evidence() -> None:
    got = judge(ranks(0.33, 0.35, 0.02, 0.31, throttled="0.410"))
    s = got.straggler
    assert s is not None and (s.rank, s.host) == (2, "node3")
    assert s.score == pytest.approx(0.98 / 0.67, abs=0.01) and s.place == "all_reduce()"
    assert got.verdict() == (
        "straggler: rank 2 (node3) is the straggler: the others wait for it in all_reduce() "
        "33% of the time (it waits 2%: 1.46x their compute per step); node3 CPU throttled "
        "41% of the time")
    assert max(got.scores, key=lambda r: got.scores[r]) == 2


def test_a_clean_run_names_none_and_says_why_when_it_cannot_tell() -> None:
    assert judge(ranks(0.10, 0.12, 0.08, 0.11)).verdict() == "straggler: none"
    # steps that are mostly communication on a loaded machine (seen on a clean run here): a
    # compute share of 16% against 9% is a ratio of 1.8, but the others lose 7% to it
    noisy = judge(ranks(0.91, 0.91, 0.93, 0.84))
    assert noisy.straggler is None and max(noisy.scores.values()) > FACTOR
    assert judge(ranks(0.3, 0.0, n=MIN_SAMPLES - 1)).verdict() == \
        "straggler: none (too few samples yet)"
    assert judge(ranks(0.3)).verdict() == \
        "straggler: none (fewer than two ranks in a process group)"
    assert judge({}).verdict() == "straggler: none (no rank sampled)"
    ended = ranks_of({"node1": parse_top(answer((100, summary(0, 100, 30, at=900.0)))),
                      "node2": parse_top(answer((101, summary(1, 100, 0, pid=101, at=900.0))))})
    assert judge(ended).verdict() == "straggler: none (no rank runs)"
    # two ranks: the one that hardly waits is named
    s = judge(ranks(0.4, 0.02)).straggler
    assert s is not None and s.rank == 1 and s.score >= FACTOR


def test_a_watch_names_a_rank_seen_in_a_row_and_once() -> None:
    slow, clean = judge(ranks(0.33, 0.35, 0.02, 0.31)), judge(ranks(0.1, 0.1, 0.1, 0.1))
    w = Watch(3)
    assert [w.look(x) for x in (slow, slow, clean, slow, slow)] == [None] * 5
    named = w.look(slow)
    assert named is not None and named.rank == 2
    assert w.look(slow) is None and w.look(slow) is None  # said once


def test_cgroup_paths_and_throttling_counters() -> None:
    text = "12:cpu,cpuacct:/fleet-tb/node3\n0::/user.slice\n4:memory:/x\n3:cpu:/../../etc\n"
    paths = cgroup_cpu_stat(text)
    assert paths[0] == "/sys/fs/cgroup/cpu/fleet-tb/node3/cpu.stat"
    assert "/sys/fs/cgroup/user.slice/cpu.stat" in paths
    assert not any("etc" in p for p in paths)
    assert throttling("nr_periods 10\nnr_throttled 4\nthrottled_time 99\n") == (10, 4)
    assert throttling("usage_usec 5\n") is None


def test_the_node_program_counts_the_last_lines_and_frames_what_it_reads(tmp_path: Path
                                                                         ) -> None:
    from fleet.facts.ranktop import top_script

    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    now = time.time()
    (run / "node.log").write_text("old\n" * 10 + "new\n" * 5)
    (run / "node.times").write_text(f"40 {now - 60:.3f}\n60 {now - 1:.3f}\n")
    (run / "samples" / "123").write_text(summary(0, 50, 5, pid=123, at=now))
    (run / "samples" / "bad name").write_text("x")
    os.symlink("/etc/passwd", run / "samples" / "77")
    out = subprocess.run(["sh", "-c", top_script(str(run))], capture_output=True, text=True,
                         timeout=30).stdout
    top = parse_top(out)
    assert top.lines == 5 and top.last_line_age_s is not None and top.last_line_age_s < 30
    assert [s.pid for s in top.samples] == [123]
    assert "root:" not in out
    assert parse_top(subprocess.run(["sh", "-c", top_script(str(tmp_path / "gone"))],
                                    capture_output=True, text=True, timeout=30).stdout).missing


FAKE_C10D = '''
import time
def all_reduce(t):
    time.sleep(t)
'''


@pytest.mark.parametrize("sampling", ["1", "0"])
def test_the_sampler_in_a_real_process_sees_where_it_waits(tmp_path: Path, sampling: str
                                                           ) -> None:
    site, run = tmp_path / "site", tmp_path / "run"
    site.mkdir()
    run.mkdir()
    (site / "sitecustomize.py").write_text(nodeside.text("sitecustomize.py") + "\n")
    dist = tmp_path / "lib" / "torch" / "distributed"
    dist.mkdir(parents=True)
    (dist / "distributed_c10d.py").write_text(FAKE_C10D)
    job = ("import sys, time; sys.path.insert(0, sys.argv[1]); "
           "import importlib.util as u; s = u.spec_from_file_location('c10d', sys.argv[2]); "
           "m = u.module_from_spec(s); s.loader.exec_module(m)\n"
           "end = time.time() + 3.5\n"
           "while time.time() < end:\n"
           "    m.all_reduce(0.06)\n"
           "    x = time.time() + 0.02\n"
           "    while time.time() < x: pass\n")
    env = {**os.environ, "PYTHONPATH": str(site), "FLEET_RUN_DIR": str(run), "RANK": "4",
           "LOCAL_RANK": "0", "FLEET_SAMPLING": sampling}
    p = subprocess.run([sys.executable, "-c", job, str(tmp_path / "lib"),
                        str(dist / "distributed_c10d.py")], env=env, timeout=60,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    files = list((run / "samples").glob("*")) if (run / "samples").exists() else []
    if sampling == "0":
        assert files == []
        return
    (f,) = [f for f in files if f.name.isdigit()]
    top = parse_top(answer((int(f.name), f.read_text()), now=time.time()))
    (s,) = top.samples
    assert s.rank == 4 and not s.joined and s.samples >= 8
    assert s.wait_share is not None and s.wait_share > 0.4, s
    assert s.places[0].where == "all_reduce()", s.places
    assert isinstance(top, NodeTop)


def test_top_as_rows_and_json_from_one_look() -> None:
    from fleet.backends import NodeLook
    from fleet.cli import topview
    from fleet.errors import CommandTimedOut
    from fleet.facts.gpus import Gpu, GpuApp, GpuFacts
    from fleet.states import NodeOutcome, NodeStatus, RunStatus

    gpus = GpuFacts(True, (Gpu(0, "GPU-a", 1024, 81559, "H100", 87),),
                    (GpuApp("GPU-a", 100, 1024, "ann"),))
    looks: dict[str, NodeLook | Exception] = {
        "node1": NodeLook(parse_top(answer((100, summary(0, 100, 33)))), gpus),
        "node2": NodeLook(parse_top(answer((101, summary(1, 100, 2, pid=101))))),
        "node3": CommandTimedOut("node3", "the ranks' sampling", 10)}
    running = NodeStatus.RUNNING
    states: dict[str, NodeOutcome | Exception] = {
        "node1": NodeOutcome("node1", 0, running), "node2": NodeOutcome("node2", 1, running),
        "node3": CommandTimedOut("node3", "the run's state", 10)}
    top = topview.make("r-1", states, looks, {"node1": 0, "node2": 1, "node3": 2})
    assert top.status is RunStatus.UNKNOWN  # as `fleet status` says a run a node can't answer
    assert set(top.unasked) == {"node3"}
    rows = topview.rows(top)
    assert [r[0][:3] for r in rows] == [["node1", "0", "running"], ["node2", "1", "running"],
                                        ["node3", "-", "unreachable"]]
    assert rows[0][0][5] == "0: 87% 1 GiB" and rows[1][1] and not rows[0][1]
    out = topview.as_json(top)
    assert [n["status"] for n in out["nodes"]] == ["running", "running", "unreachable"]
    assert out["nodes"][2]["error"] and out["nodes"][0]["gpus"][0]["util_pct"] == 87
    assert [(r["rank"], r["host"], r["status"]) for r in out["ranks"]] == \
        [(0, "node1", "running"), (1, "node2", "running")]
    assert out["straggler"]["rank"] == 1 and out["verdict"].startswith("straggler: rank 1 ")
    assert out["ranks"][0]["gpu"] == {"index": 0, "memory_used": 1 << 30}


def test_old_summaries_never_crowd_out_a_live_rank_and_a_quiet_log_counts_zero(
        tmp_path: Path) -> None:
    from fleet.facts.ranktop import MOST, top_script

    run = tmp_path / "run"
    (run / "samples").mkdir(parents=True)
    now = time.time()
    for pid in range(1000, 1000 + MOST + 6):  # workers the job spawned long ago, all ended
        f = run / "samples" / str(pid)
        f.write_text(summary(0, 50, 5, pid=pid, at=now - 3600, dist=0))
        os.utime(f, (now - 3600, now - 3600))
    (run / "samples" / "4242").write_text(summary(0, 50, 5, pid=4242, at=now))
    (run / "node.log").write_text("old\n" * 3)
    (run / "node.times").write_text(f"12 {now - 60:.3f}\n")  # nothing printed lately
    top = parse_top(subprocess.run(["sh", "-c", top_script(str(run))], capture_output=True,
                                   text=True, timeout=30).stdout)
    assert top.cut and len(top.samples) == MOST
    assert top.ranks()[0].pid == 4242 and top.ranks()[0].alive
    assert top.lines == 0 and top.lines_per_s == 0.0


def test_an_ended_process_elsewhere_or_a_rank_outside_the_plan_is_no_rank() -> None:
    live = parse_top(answer((100, summary(1, 100, 2))))
    ended = parse_top(answer((200, summary(1, 100, 60, pid=200, at=900.0))))
    assert ranks_of({"node1": ended, "node2": live})[1][0] == "node2"
    # node2 was given ranks 2-3: a rank 1 it claims is not judged (nor named)
    claimed = ranks_of({"node1": parse_top(answer((100, summary(0, 100, 30)))),
                        "node2": parse_top(answer((101, summary(1, 100, 0, pid=101))))},
                       {"node1": range(0, 2), "node2": range(2, 4)})
    assert list(claimed) == [0]
