"""Hangs, the pure parts: faulthandler's and py-spy's dumps parsed, stacks grouped with the rank
that is different named, a startup hang told apart, and the sitecustomize's dump for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleet import nodeside
from fleet.facts.stacks import (
    FlightRecord,
    Frame,
    RankStack,
    dump_script,
    group,
    is_launcher,
    main_thread,
    parse_dump,
    parse_threads,
    report,
    verdict,
)

C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"


def fh_all_reduce(line: int = 12) -> str:
    return (f'Current thread 0x00007f2af9024b80 (most recent call first):\n'
            f'  File "{C10D}", line 3913 in all_reduce\n'
            f'  File "{LOGGER}", line 83 in wrapper\n'
            f'  File "/code/train.py", line {line} in <module>\n')


FH_STUCK = ('Thread 0x00007f0000000001 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 331 in wait\n'
            '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
            'Current thread 0x00007f2f597d9b80 (most recent call first):\n'
            '  File "/code/train.py", line 6 in stuck_here\n'
            '  File "/code/train.py", line 10 in <module>\n')

SPY = '''Process 4242: python -m something
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    sleep_forever (/code/worker.py:3)
    <module> (/code/worker.py:9)
'''


def node_out(*sections: tuple[str, str]) -> str:
    """As dump_script frames it: a header, then each line of the section's text after `|`."""
    return "".join(f"=== {head}\n" + "".join(f"|{line}\n" for line in body.splitlines())
                   for head, body in sections)


def test_faulthandler_and_py_spy_dumps_parse_to_the_main_thread() -> None:
    threads = parse_threads(FH_STUCK)
    assert len(threads) == 2
    main = main_thread(threads)
    assert [f.func for f in main] == ["stuck_here", "<module>"]
    spy = main_thread(parse_threads(SPY))
    assert spy[0] == Frame("/code/worker.py", 3, "sleep_forever")


def test_a_node_dump_parses_ranks_processes_and_flight_records() -> None:
    out = node_out(("stack 101 rank=2 local=0 ", fh_all_reduce()),
                   ("stack 102 rank=3 local=1 ", FH_STUCK),
                   ("proc 99 sh ./run.sh", ""),
                   ("proc 100 /venv/bin/python -m torch.distributed.run --nnodes 2", ""),
                   (f"fr {b'nccl_trace_rank_3'.hex()} 2048", ""),
                   (f"fr {b'nccl_trace_rank_4'.hex()} - link", ""))
    d = parse_dump("node2", out)
    assert [(s.pid, s.rank, s.local_rank, s.frames[0].func) for s in d.stacks] == [
        (101, 2, 0, "all_reduce"), (102, 3, 1, "stuck_here")]
    assert d.stacks[1].threads == 2
    assert d.others == ((99, "sh ./run.sh"), (100, "/venv/bin/python -m torch.distributed.run "
                                                   "--nnodes 2"))
    assert d.flight_records == (FlightRecord("nccl_trace_rank_3", 2048),
                                FlightRecord("nccl_trace_rank_4", None))
    assert parse_dump("node3", "missing\n").missing


def four_ranks() -> list[RankStack]:
    reduce = main_thread(parse_threads(fh_all_reduce()))
    stuck = main_thread(parse_threads(FH_STUCK))
    return [RankStack("node1", 10, 0, 0, reduce), RankStack("node1", 11, 1, 1, reduce),
            RankStack("node2", 20, 2, 0, reduce), RankStack("node2", 21, 3, 1, stuck)]


def test_identical_stacks_collapse_and_the_odd_rank_is_named() -> None:
    groups = group(four_ranks())
    assert [len(g.members) for g in groups] == [3, 1]
    assert groups[0].who() == "ranks 0-1 on node1, rank 2 on node2"
    assert verdict(groups, hung=True) == (
        "rank 3 on node2 is in stuck_here() (train.py:6); the other 3 rank(s) wait in "
        "all_reduce() (distributed_c10d.py:3913)")
    # A dump of a run nobody called hung is a snapshot: no rank "waits".
    assert verdict(groups) == ("rank 3 on node2 is in stuck_here() (train.py:6); the other 3 "
                               "rank(s) are in all_reduce() (distributed_c10d.py:3913)")


def test_same_place_everywhere_and_an_even_split() -> None:
    ranks = four_ranks()
    same = [RankStack(r.host, r.pid, r.rank, r.local_rank, ranks[0].frames) for r in ranks]
    assert verdict(group(same)) == "all 4 rank(s) are in all_reduce() (distributed_c10d.py:3913)"
    half = ranks[:1] + ranks[3:]
    assert verdict(group(half)) == ("rank 0 on node1: all_reduce() (distributed_c10d.py:3913); "
                                    "rank 3 on node2: stuck_here() (train.py:6)")


def test_stacks_from_other_directories_are_the_same_stack() -> None:
    """Each node has its own code directory (and maybe its venv elsewhere)."""
    ranks = four_ranks()
    elsewhere = tuple(Frame(f.file.replace("/code/", "/home2/fleet/code/j-1/"), f.line, f.func)
                      for f in ranks[0].frames)
    ranks[2] = RankStack("node2", 20, 2, 0, elsewhere)
    assert [len(g.members) for g in group(ranks)] == [3, 1]


def test_a_different_line_is_a_different_stack() -> None:
    ranks = four_ranks()[:2]
    moved = main_thread(parse_threads(fh_all_reduce(line=14)))
    ranks[1] = RankStack("node1", 11, 1, 1, moved)
    assert len(group(ranks)) == 2


def test_report_prints_each_stack_once_with_its_ranks() -> None:
    out = node_out(("stack 10 rank=0 local=0 ", fh_all_reduce()),
                   ("stack 11 rank=1 local=1 ", FH_STUCK))
    lines = report([parse_dump("node1", out)])
    assert lines[0].startswith("rank 0 on node1: all_reduce()")
    assert "rank 1 on node1 (1 process(es)), most recent call first:" in lines
    assert "    /code/train.py:6 in stuck_here" in lines
    assert sum(line.endswith("in <module>") for line in lines) == 2


def test_startup_hang_names_the_node_that_has_not_joined() -> None:
    node1 = parse_dump("node1", node_out(
        ("proc 7 sh ./run.sh", ""),
        ("proc 8 /venv/bin/python -m torch.distributed.run --nnodes 2 --node-rank 0", "")))
    node2 = parse_dump("node2", node_out(
        ("proc 5 sh ./run.sh", ""),
        ("proc 6 /bin/sh /home/lab/python -m torch.distributed.run --nnodes 2", ""),
        ("proc 9 sleep 600", "")))
    lines = report([node1, node2])
    assert lines[0] == "no rank has started on any node: the rendezvous is incomplete"
    assert lines[1].startswith("node1 waits at the rendezvous (its launcher runs: /venv/bin/")
    assert lines[2] == ("node2 has not joined the rendezvous: it is running /bin/sh "
                        "/home/lab/python -m torch.distributed.run --nnodes 2; sleep 600")
    assert is_launcher("/usr/bin/python3 /venv/bin/torchrun --nnodes 2")
    assert not is_launcher("/bin/sh wrapper -m torch.distributed.run")


def test_a_run_that_ended_has_no_stack_to_take() -> None:
    done = [parse_dump("node1", "=== ended 0\n=== proc 5 sleep 1\n"),
            parse_dump("node2", "missing\n")]
    assert done[0].ended == 0
    assert report(done) == ["the run is not running on any node (it has ended): no stack to "
                            "take"]
    half = [done[0], parse_dump("node2", "=== proc 6 sleep 600\n")]
    assert report(half)[1:] == ["node1: its part has ended (exit 0)",
                                "node2 has not joined the rendezvous: it is running sleep 600"]


def start_worker(tmp_path: Path, rank: str, local: str,
                 **env: str) -> subprocess.Popen[bytes]:
    """A python process as a launcher starts a worker, with fleet's sitecustomize (run dir
    tmp_path/run), stuck in stuck_here(); returned once it has registered for dumps."""
    site, run = tmp_path / "site", tmp_path / "run"
    site.mkdir()
    run.mkdir()
    (site / "sitecustomize.py").write_text(nodeside.text("sitecustomize.py") + "\n")
    script = tmp_path / "w.py"
    script.write_text("import time\ndef stuck_here():\n    time.sleep(30)\nstuck_here()\n")
    p = subprocess.Popen([sys.executable, str(script)], env={
        **os.environ, "PYTHONPATH": str(site), "FLEET_RUN_DIR": str(run), "RANK": rank,
        "LOCAL_RANK": local, **env})
    deadline = time.monotonic() + 20
    while not (run / "stacks" / f"{p.pid}.who").exists():
        if time.monotonic() > deadline or p.poll() is not None:
            p.kill()
            raise AssertionError("the worker never registered for dumps")
        time.sleep(0.05)
    return p


def test_dump_script_signals_only_the_runs_own_processes(tmp_path: Path) -> None:
    """Through a real sh: the worker's stack comes back; a pid in a stale .who file that is no
    longer the run's (reused by another process) is never signalled."""
    run = tmp_path / "run"
    worker = start_worker(tmp_path, "0", "0", FLEET_RUN_ID="r-test-1")
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        (run / "stacks" / f"{stranger.pid}.who").write_text(
            f"rank=1 local=1\nsig={int(signal.SIGRTMIN) + 7}\n")
        out = subprocess.run(["sh", "-s"], input=dump_script(str(run), "r-test-1"),
                             capture_output=True, text=True, timeout=30).stdout
        d = parse_dump("node1", out)
        assert [(s.pid, s.rank, s.frames[0].func) for s in d.stacks] == [
            (worker.pid, 0, "stuck_here")], out
        assert stranger.poll() is None and worker.poll() is None
    finally:
        for p in (worker, stranger):
            p.kill()
            p.wait()


def test_sitecustomize_dumps_a_workers_stack_on_its_signal_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    p = start_worker(tmp_path, "3", "1")
    try:
        who = run / "stacks" / f"{p.pid}.who"
        deadline = time.monotonic() + 20
        fields = who.read_text().split()
        assert fields[:2] == ["rank=3", "local=1"]
        sig = int(fields[2].split("=")[1])
        assert sig == int(signal.SIGRTMIN) + 7
        dump = run / "stacks" / str(p.pid)
        # Registered before its script runs: a loaded machine may dump it still in its start-up,
        # so the signal is sent again until the dump shows the script's own frame.
        while "stuck_here" not in dump.read_text():
            assert time.monotonic() < deadline
            os.kill(p.pid, sig)
            time.sleep(0.2)
        assert p.poll() is None  # the signal only dumped: the process goes on
        frames = main_thread(parse_threads(dump.read_text()))
        assert frames[0].func == "stuck_here"
    finally:
        p.kill()
        p.wait()
