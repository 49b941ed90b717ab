"""Which processes are a run's: run_tree.py's parsers and descent (pure), and run_pids.sh under a
real `sh` against a /proc of the test's own making, every pid check included."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from fleet import nodeside
from fleet.nodeside.run_tree import descendants, parse_stat, parse_uid, subtree

SH = shutil.which("dash") or "sh"
ME = os.getuid()
OTHER = ME + 1


def stat(pid: int, ppid: int, sid: int, start: int, comm: str = "sh", state: str = "S") -> str:
    """/proc/PID/stat's text: 52 fields, as Linux writes them."""
    rest = [state, ppid, sid, sid, 0, -1, 4194304, *[0] * 10, 1, 0, start, *[0] * 30]
    return f"{pid} ({comm}) " + " ".join(map(str, rest)) + "\n"


def test_stat_fields_after_the_last_parenthesis() -> None:
    assert parse_stat(stat(42, 7, 42, 1234)) == (42, 7, 1234)
    # A command name may hold spaces, `) ` and newlines: the fields are those after its end.
    assert parse_stat(stat(42, 7, 42, 1234, comm="a) S 1 2 (b")) == (42, 7, 1234)
    assert parse_stat(stat(42, 7, 42, 1234, comm="x\n9 (y")) == (42, 7, 1234)
    assert parse_stat("") is None
    assert parse_stat("42 (sh) S 7 42") is None  # cut short
    assert parse_stat("x (sh) " + stat(1, 1, 1, 1).split(") ", 1)[1]) is None
    assert parse_stat(stat(42, 7, 42, 1234).replace(" 1234 ", " -5 ")) is None


def test_uid_is_the_real_one() -> None:
    assert parse_uid("Name:\tsh\nUid:\t1000\t0\t0\t0\nGid:\t5\n") == 1000
    assert parse_uid("Name:\tsh\n") is None
    assert parse_uid("Uid:\tx\n") is None


def test_descent_keeps_an_orphan_and_its_children_once_recorded() -> None:
    table = {10: (1, 100),    # the wrapper
             11: (10, 101),   # its child
             12: (1, 102),    # recorded before, re-parented to PID 1 since
             13: (12, 103),   # started by the orphan
             14: (13, 104),   # another user's (set-uid): not signalled by this user
             15: (1, 105),    # a stranger re-parented to PID 1, never recorded
             16: (15, 106)}
    asked: list[int] = []

    def owner(pid: int) -> int:
        asked.append(pid)
        return OTHER if pid == 14 else ME

    assert descendants(table, {10: 100, 12: 102}, ME, owner) == {11: 101, 13: 103}
    assert sorted(asked) == [11, 13, 14]  # only the candidates are read
    # A recorded pid now owned by another process (its start differs) leads nowhere.
    assert descendants(table, {10: 100, 12: 99}, ME, owner) == {11: 101}
    assert descendants(table, {10: 99}, ME, owner) == {}


class Proc:
    """A /proc of the test's own: one directory per process with stat, status and environ."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, ppid: int, sid: int, start: int, uid: int = ME,
            env: tuple[str, ...] = (), comm: str = "sh", state: str = "S") -> None:
        d = self.root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(stat(pid, ppid, sid, start, comm, state))
        (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "environ").write_bytes(b"".join(e.encode() + b"\0" for e in env))


def run_pids(proc: Path, run_dir: Path, run_id: str = "r1", wrapper: str = "") -> set[int]:
    script = (f"{nodeside.text('run_pids.sh')}\nprocfs={proc}\n"
              f"run_pids {run_id} {run_dir} {wrapper}\n")
    r = subprocess.run([SH, "-s"], input=script, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return {int(p) for p in r.stdout.split()}


def a_run(tmp_path: Path, wrapper_alive: bool = True) -> tuple[Proc, Path]:
    """A node where run r1's wrapper (pid 100, started at tick 5000) runs, or ran."""
    proc, run_dir = Proc(tmp_path / "proc"), tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "pid").write_text("100\n")
    (run_dir / "procs").write_text("100 5000\n")
    proc.add(1, 0, 1, 1, uid=0, env=("FLEET_RUN_ID=r1",))     # init: never
    proc.add(50, 1, 50, 4000)                                # the login shell, before the run
    proc.add(60, 1, 60, 6000)                                # the user's, after the run
    proc.add(61, 60, 60, 6001)
    if wrapper_alive:
        proc.add(100, 1, 100, 5000, env=("FLEET_RUN_ID=r1",))
    return proc, run_dir


def test_the_environment_names_a_run_process_of_this_user(tmp_path: Path) -> None:
    proc, run_dir = a_run(tmp_path)
    proc.add(101, 100, 101, 5001, env=("A=1", "FLEET_RUN_ID=r1"))
    proc.add(102, 1, 102, 5002, env=("FLEET_RUN_ID=r10",))   # another run's
    proc.add(103, 1, 103, 5003, uid=OTHER, env=("FLEET_RUN_ID=r1",))
    proc.add(104, 100, 100, 5004, env=("FLEET_RUN_ID=r1",), state="Z")  # ended
    assert run_pids(proc.root, run_dir) == {100, 101}


def test_each_attempt_is_found_by_its_own_id_though_all_share_the_runs(tmp_path: Path) -> None:
    """Every attempt of a run with [restart] has the run's FLEET_RUN_ID (r1, the first
    attempt's id); each is found by its FLEET_ATTEMPT_ID, so stopping what attempt 1 left on a
    node never reaches attempt 2 there."""
    proc, run_dir = a_run(tmp_path)
    proc.add(130, 100, 130, 5030, env=("FLEET_RUN_ID=r1", "FLEET_ATTEMPT_ID=r1"))
    proc.add(131, 1, 131, 5031, env=("FLEET_RUN_ID=r1", "FLEET_ATTEMPT_ID=r1-a2"))
    proc.add(132, 1, 132, 5032, env=("FLEET_ATTEMPT_ID=r1-a2", "FLEET_RUN_ID=r1"))
    proc.add(133, 1, 133, 5033, env=("FLEET_RUN_ID=r1-a3",))  # before fleet set the attempt's
    assert run_pids(proc.root, run_dir) == {100, 130}
    other = tmp_path / "later"  # the later attempts' run directory: no record of theirs
    other.mkdir()
    assert run_pids(proc.root, other, "r1-a2") == {131, 132}
    assert run_pids(proc.root, other, "r1-a3") == {133}


def test_a_process_that_shed_environment_and_session_is_found_by_the_record(
        tmp_path: Path) -> None:
    proc, run_dir = a_run(tmp_path)
    proc.add(110, 1, 110, 5010)                # escaped: setsid env -u FLEET_RUN_ID
    proc.add(111, 110, 110, 5011)              # what it started after
    proc.add(112, 1, 112, 5012)                # a pid recorded once, reused since
    proc.add(113, 1, 113, 5013, uid=OTHER)     # recorded, another user's now
    (run_dir / "procs").write_text("100 5000\n110 5010\n112 4999\n113 5013\nbad line\n")
    assert run_pids(proc.root, run_dir) == {100, 110, 111}


def test_the_session_counts_while_it_is_the_runs(tmp_path: Path) -> None:
    proc, run_dir = a_run(tmp_path, wrapper_alive=False)
    proc.add(120, 1, 100, 5020)  # shed the environment, kept the session; the wrapper ended
    assert run_pids(proc.root, run_dir) == {120}
    # Pid 100 belongs to a newer process now: a session of that number may be its own.
    proc.add(100, 60, 100, 7000)
    proc.add(121, 100, 100, 7001)
    assert run_pids(proc.root, run_dir) == set()


def test_without_the_record_only_the_environment_and_descent_count(tmp_path: Path) -> None:
    proc, run_dir = a_run(tmp_path)
    proc.add(130, 100, 130, 5030)              # a child without the variable
    proc.add(131, 1, 100, 5031)                # in the session only
    (run_dir / "procs").unlink()
    assert run_pids(proc.root, run_dir) == {100, 130}
    # A record whose first line is not the wrapper names no start: the same.
    (run_dir / "procs").write_text("131 5031\n100 5000\n")
    assert run_pids(proc.root, run_dir) == {100, 130}


def test_never_before_the_run_nor_pid_1_nor_a_forged_line(tmp_path: Path) -> None:
    proc, run_dir = a_run(tmp_path)
    # The login shell and the user's later shell written into the record by the job: the first
    # began before the run, the second's start differs from what the line says.
    (run_dir / "procs").write_text("100 5000\n50 4000\n60 5999\n1 1\n")
    # A command name with a newline that would read as another process's stat line.
    proc.add(140, 100, 140, 5040, comm="x\n61 (y")
    assert run_pids(proc.root, run_dir) == {100, 140}


def test_fleets_word_on_the_wrapper_stands_whatever_the_job_writes(tmp_path: Path) -> None:
    proc, run_dir = a_run(tmp_path)
    proc.add(150, 1, 150, 5050)                # escaped: setsid env -u FLEET_RUN_ID
    proc.add(151, 1, 100, 5051)                # shed the environment, kept the session
    # The job emptied the record before it escaped: run_tree.py's next line comes first.
    (run_dir / "procs").write_text("150 5050\n")
    assert run_pids(proc.root, run_dir) == {100}  # without fleet's word: the record named no start
    assert run_pids(proc.root, run_dir, wrapper="100 5000") == {100, 150, 151}
    # Rewritten to move the start back, with the pid file naming another process: the start
    # and the session stay fleet's, and every line is checked against that start.
    (run_dir / "procs").write_text("60 1\n50 4000\n61 6001\n150 5050\n")
    (run_dir / "pid").write_text("60\n")
    assert run_pids(proc.root, run_dir, wrapper="100 5000") == {100, 150, 151, 61}
    # Gone altogether: the session and the environment still count.
    (run_dir / "procs").unlink()
    assert run_pids(proc.root, run_dir, wrapper="100 5000") == {100, 151}


def test_the_subtree_follows_children_files_only_down_from_its_roots(tmp_path: Path) -> None:
    proc = Proc(tmp_path / "proc")
    for pid, ppid, start in ((10, 1, 100), (11, 10, 101), (12, 11, 102), (20, 1, 200)):
        proc.add(pid, ppid, pid, start)
    kids = {10: "11 ", 11: "12 99 ", 12: "", 20: "21 "}  # 99 ended meanwhile: no stat
    for pid, text in kids.items():
        (proc.root / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (proc.root / str(pid) / "task" / str(pid) / "children").write_text(text)
    assert subtree([10], str(proc.root)) == {10: (1, 100), 11: (10, 101), 12: (11, 102)}
    assert subtree([30], str(proc.root)) == {}
