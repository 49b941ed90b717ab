"""Runs that heal, without hosts: `[restart]` and `spare = true` as read from the files, which
endings restart and which need a person, the spares put in the places of the hosts they
replace, and what `fleet status` says of the attempts."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleet import backends
from fleet.backends.base import Final, Options
from fleet.backends.hosts.run import with_spares
from fleet.config.inventory import load_inventory
from fleet.config.job import load_job
from fleet.config.restart import BACKOFF_MAX_S, Ending, Restart, Tracker
from fleet.console import Console
from fleet.errors import ConfigError, TransportError
from fleet.lifecycle import attempts
from fleet.lifecycle import left as left_mod
from fleet.lifecycle.monitor import RunState
from fleet.run.logs import progress
from fleet.states import NodeOutcome, NodeStatus, RunStatus

S = NodeStatus
INV = ('[[hosts]]\nname = "n1"\naddress = "10.0.0.1"\n[[hosts]]\nname = "n2"\n'
       'address = "10.0.0.2"\n[[hosts]]\nname = "s1"\naddress = "10.0.0.3"\nspare = true\n'
       '[[hosts]]\nname = "s2"\naddress = "10.0.0.4"\nspare = true\n')


def job_file(tmp: Path, body: str) -> Path:
    (tmp / "train.py").write_text("print('hi')\n")
    (tmp / "inv.toml").write_text(INV)
    path = tmp / "job.toml"
    path.write_text('inventory = "inv.toml"\nscript = "train.py"\n' + body)
    return path


# ---- the files ----------------------------------------------------------------------------------
def test_restart_defaults_to_none_and_reads_its_keys(tmp_path: Path) -> None:
    assert load_job(job_file(tmp_path, "")).restart == Restart()
    job = load_job(job_file(tmp_path, '[restart]\nmax = 3\non = ["lost", "fail"]\nbackoff = 2\n'))
    assert job.restart == Restart(3, (Ending.LOST, Ending.FAIL), 2.0)
    assert [job.restart.wait(n) for n in (2, 3, 4)] == [2.0, 4.0, 8.0]
    assert Restart(max=50, backoff=200).wait(40) == BACKOFF_MAX_S
    assert job.restart.tracker is None
    for word in ("wandb", "mlflow"):
        tracked = load_job(job_file(tmp_path, f'[restart]\nmax = 1\ntracker = "{word}"\n'))
        assert tracked.restart.tracker is Tracker(word)


@pytest.mark.parametrize(("body", "key", "words"), [
    ("[restart]\nmax = -1\n", "restart.max", "from 0 to 100"),
    ('[restart]\nmax = "3"\n', "restart.max", "integer"),
    ('[restart]\nmax = 1\non = ["crash"]\n', "restart.on[0]", 'must be one of "fail"'),
    ('[restart]\nmax = 1\non = ["hang"]\n', "restart.on", "needs [watchdog] hang_timeout"),
    ("[restart]\nbackoff = -1\n", "restart.backoff", "from 0 to 300"),
    ("[restart]\nmaxx = 1\n", "restart.maxx", "unknown key"),
    ('[restart]\ntracker = "tensorboard"\n', "restart.tracker", 'must be one of "wandb"'),
    ("[restart]\ntracker = 1\n", "restart.tracker", "string"),
])
def test_a_bad_restart_table_names_its_key(tmp_path: Path, body: str, key: str,
                                           words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(job_file(tmp_path, body))
    assert e.value.key == key and words in str(e.value), str(e.value)


def test_hang_is_a_restart_ending_with_a_watchdog(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, '[watchdog]\nhang_timeout = 30\n[restart]\nmax = 1\n'
                                      'on = ["hang"]\n'))
    assert job.restart.on == (Ending.HANG,)


def test_spares_are_kept_apart_and_take_a_hosts_place_with_its_rank(tmp_path: Path) -> None:
    job_file(tmp_path, "")
    inv = load_inventory(tmp_path / "inv.toml")
    assert [h.name for h in inv.hosts] == ["n1", "n2"]
    assert [h.name for h in inv.spares] == ["s1", "s2"]
    swapped = with_spares(inv, {"n1": "s2"})
    assert [h.name for h in swapped.hosts] == ["s2", "n2"]  # node rank 0, as n1 had
    assert [h.name for h in swapped.spares] == ["s1"]
    assert with_spares(inv, {}) is inv


def test_an_inventory_of_spares_alone_is_refused(tmp_path: Path) -> None:
    (tmp_path / "inv.toml").write_text('[[hosts]]\nname = "s1"\naddress = "x"\nspare = true\n')
    with pytest.raises(ConfigError, match="at least one must run the job"):
        load_inventory(tmp_path / "inv.toml")


# ---- which endings restart ----------------------------------------------------------------------
def outcome(name: str, status: NodeStatus, code: int | None = None) -> NodeOutcome:
    return NodeOutcome(name, int(name[-1]) - 1, status, code)


@pytest.mark.parametrize(("final", "outcomes", "hang", "kind", "why"), [
    (RunStatus.SUCCEEDED, [("n1", S.SUCCEEDED), ("n2", S.SUCCEEDED)], None, None, ""),
    (RunStatus.STOPPED, [("n1", S.STOPPED), ("n2", S.STOPPED)], None, None, ""),
    (RunStatus.FAILED, [("n1", S.STOPPED), ("n2", S.FAILED)], None, Ending.FAIL,
     "n2 failed (exit 1)"),
    (RunStatus.UNKNOWN, [("n1", S.STOPPED), ("n2", S.UNREACHABLE)], None, Ending.LOST,
     "n2 was lost"),
    (RunStatus.FAILED, [("n1", S.STOPPED), ("n2", S.STOPPED)], "rank 3 is stuck", Ending.HANG,
     "a hang"),
])
def test_the_ending_of_an_attempt(final: RunStatus, outcomes: list[tuple[str, NodeStatus]],
                                  hang: str | None, kind: Ending | None, why: str) -> None:
    state = RunState({n: outcome(n, s, 1 if s is S.FAILED else None) for n, s in outcomes},
                     True, hang, first="n2")
    assert attempts.ending(Final(final), state, hang) == (kind, why)


class FakeRun:
    def __init__(self, run_id: str, progressed: float | None = 5.0) -> None:
        self.run_id, self._progressed = run_id, progressed

    def progressed(self) -> float | None:
        return self._progressed


def book(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> attempts.Book:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    job = load_job(job_file(tmp_path, body))
    return attempts.Book(job, job.restart, Console(out=io.StringIO(), err=io.StringIO()),
                         backends.for_inventory(job.inventory))


def said(b: attempts.Book) -> str:
    return b.console.err.getvalue()  # type: ignore[attr-defined, no-any-return]


def failed_state(first: str = "n2", status: NodeStatus = S.FAILED) -> RunState:
    return RunState({"n1": outcome("n1", S.STOPPED), first: outcome(first, status, 1)}, True,
                    None, first=first, stopped_at=100.0)


def test_a_failure_restarts_until_max_then_the_run_is_over(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, "[restart]\nmax = 2\nbackoff = 0\n", monkeypatch)
    first = b.options(Options())
    assert (first.run_id, first.parent, first.attempt) == (b.run_id, "", 1)
    assert b.job_for(2).env["FLEET_ATTEMPT"] == "2"
    failed = Final(RunStatus.FAILED)
    assert b.record(FakeRun(b.run_id), failed, failed_state(), None, 1.0, 2.0) == 2  # type: ignore[arg-type]
    second = b.options(first)
    assert (second.run_id, second.parent, second.attempt) == (f"{b.run_id}-a2", b.run_id, 2)
    assert b.record(FakeRun(second.run_id or ""), failed, failed_state(), None, 3.0,  # type: ignore[arg-type]
                    4.0) == 3
    assert b.record(FakeRun("x"), failed, failed_state(), None, 5.0, 6.0) is None  # type: ignore[arg-type]
    assert "no attempt left ([restart] max = 2)" in said(b)
    assert b.summary() == ("attempts: 1/3 failed (n2 failed (exit 1)), 2/3 failed (n2 failed "
                           "(exit 1)), 3/3 failed (n2 failed (exit 1))")


def test_a_failure_before_any_line_of_the_jobs_own_needs_a_person(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, "[restart]\nmax = 2\n", monkeypatch)
    assert b.record(FakeRun(b.run_id, progressed=None), Final(RunStatus.FAILED),  # type: ignore[arg-type]
                    failed_state(), None, 1.0, 2.0) is None
    assert "not restarted: n2 failed (exit 1) before any rank printed a line" in said(b)


def test_an_ending_not_in_on_is_not_restarted(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, '[restart]\nmax = 2\non = ["lost"]\n', monkeypatch)
    assert b.record(FakeRun(b.run_id), Final(RunStatus.FAILED), failed_state(), None, 1.0,  # type: ignore[arg-type]
                    2.0) is None
    assert "not restarted: n2 failed (exit 1), and [restart] on is lost" in said(b)


def test_a_lost_node_is_replaced_by_the_first_free_spare_each_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, "[restart]\nmax = 3\n", monkeypatch)
    lost = Final(RunStatus.UNKNOWN)
    assert b.record(FakeRun(b.run_id), lost, failed_state("n2", S.UNREACHABLE), None, 1.0,  # type: ignore[arg-type]
                    2.0) == 2
    assert b.replace == {"n2": "s1"}
    # Said and recorded only once attempt 2's checks passed (its prepare).
    assert "replaced" not in said(b) and b.attempts[-1].replaced == {}
    b.confirm()
    assert "n2 replaced by spare s1 (n2 was lost)" in said(b)
    assert b.attempts[-1].replaced == {"n2": "s1"}
    # s1, now in n2's place, is lost too: s2 takes the same place (n2's rank).
    assert b.record(FakeRun("a2"), lost, failed_state("s1", S.UNREACHABLE), None, 3.0,  # type: ignore[arg-type]
                    4.0) == 3
    assert b.replace == {"n2": "s2"}
    assert b.record(FakeRun("a3"), lost, failed_state("s2", S.UNREACHABLE), None, 5.0,  # type: ignore[arg-type]
                    6.0) == 4
    assert b.replace == {"n2": "s2"} and "no spare left for s2" in said(b)


def test_status_words_for_the_attempts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = [attempts.Attempt(1, "r", ["n1", "n2"], 1.0, 2.0, RunStatus.FAILED, "n2 was lost",
                              stopped_at=100.0, progressed_at=50.0, replaced={"n2": "s1"}),
             attempts.Attempt(2, "r-a2", ["n1", "s1"], 3.0, 4.0, RunStatus.SUCCEEDED,
                              progressed_at=109.5)]
    lines = attempts.lines(2, items)
    assert lines[0].startswith("  attempt 1/3 (r): failed, n2 was lost at ")
    assert lines[0].endswith("; n2 replaced by s1; the job's first line again 9.5s later")
    assert lines[1] == "  attempt 2/3 (r-a2): succeeded"
    assert attempts.headline(2, items, 2).startswith("attempt 2/3, n2 replaced by s1 after "
                                                     "n2 was lost at ")
    assert attempts.headline(2, items[:1], 1) == "attempt 1/3"


@pytest.mark.parametrize(("line", "counts"), [
    ("epoch 1 loss 0.3", True),
    ("resumed from checkpoints/mnist.pt (epoch 0 done)", True),
    ("Traceback (most recent call last):", False),
    ('  File "train.py", line 3, in <module>', False),
    ("RuntimeError: boom", False),
    ("[rank0]: RuntimeError: boom", False),
    ("ModuleNotFoundError: No module named 'x'", False),
    ("torch.distributed.DistBackendError: NCCL error", False),
    ("", False),
])
def test_what_counts_as_the_jobs_own_first_line(line: str, counts: bool) -> None:
    assert progress(line) is counts


def test_a_spare_not_fit_for_the_job_gives_its_place_to_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, "[restart]\nmax = 3\n", monkeypatch)
    lost = Final(RunStatus.UNKNOWN)
    assert b.record(FakeRun(b.run_id), lost, failed_state("n2", S.UNREACHABLE), None, 1.0,  # type: ignore[arg-type]
                    2.0) == 2
    assert b.unfit({"n1": "python 3.10 here"}) is False  # not a spare's: for a person
    assert b.unfit({"s1": "unreachable"}) is True and b.replace == {"n2": "s2"}
    assert b.unfit({"s2": "torch 2.1 here"}) is True and b.replace == {}
    assert "restart: spare s1 is not fit for the job (unreachable); s2 is checked in its " \
           "place" in said(b)
    assert "no spare left: n2 is tried again" in said(b)
    b.confirm()  # n2 itself: no spare took its place, none is said to have
    assert "replaced" not in said(b) and b.attempts[-1].replaced == {}


def test_slurm_refuses_restart_naming_the_key(tmp_path: Path) -> None:
    """Before anything connects: the job file and its key, and what to use there instead."""
    from fleet.backends.base import Options
    from fleet.backends.slurm.backend import SlurmBackend

    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "cluster.toml").write_text('[slurm]\nlogin = "localhost"\nnodes = 2\n'
                                           f'workdir = "{tmp_path}/fleet"\n')
    path = tmp_path / "job.toml"
    path.write_text('inventory = "cluster.toml"\nscript = "train.py"\n[restart]\nmax = 1\n')
    console = Console(out=io.StringIO(), err=io.StringIO())
    with pytest.raises(ConfigError) as e:
        SlurmBackend().prepare(load_job(path), console, Options())
    assert e.value.key == "restart" and str(e.value).startswith(f"{path}: restart: ")
    assert "--requeue" in str(e.value)
    assert not (tmp_path / "fleet").exists()


class Stopper:
    """A backend whose nodes answer a stop from their n-th try on."""

    name = "fake"

    def __init__(self, answers_from: dict[str, int], gone: set[str] | None = None) -> None:
        self.answers_from = answers_from
        self.gone = gone or set()  # nodes where stop.sh finds nothing of the run (rebooted)
        self.tries: dict[str, int] = {}
        self.by: list[str] = []

    def stop_part(self, rec: object, node: str, by: str) -> bool:
        self.tries[node] = self.tries.get(node, 0) + 1
        self.by.append(by)
        if self.tries[node] < self.answers_from[node]:
            raise TransportError(f"cannot connect to {node}: refused")
        return node not in self.gone


def test_what_an_attempt_left_on_a_lost_node_is_stopped_once_it_answers_else_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(left_mod, "LEFT_POLL_S", 3600.0)  # the test tries itself, not the thread
    monkeypatch.setattr(attempts.state, "load", lambda run_id: SimpleNamespace(
        dir=tmp_path / run_id))
    c = Console(out=io.StringIO(), err=io.StringIO())
    backend = Stopper({"n2": 2, "n3": 99})
    left = attempts.Left(backend, c, "r")  # type: ignore[arg-type]
    left.add(attempts.Attempt(1, "r", ["n1", "n2", "n3"], 0.0, 1.0, RunStatus.UNKNOWN,
                              lost=["n2", "n3"]))
    left.add(attempts.Attempt(2, "r-a2", ["n1", "n4", "n5"], 2.0, 3.0, RunStatus.SUCCEEDED))
    left.sweep()  # neither answers yet
    assert set(left.parts) == {("r", "n2"), ("r", "n3")}
    left.sweep()
    assert set(left.parts) == {("r", "n3")}
    err = c.err.getvalue()  # type: ignore[attr-defined]
    assert "n2 answered again: attempt 1's part there was stopped\n" in err, err
    assert "fleet up, once n2 answered again (attempt 1 had lost it)" in backend.by
    left.end()  # one last try, then named
    err = c.err.getvalue()  # type: ignore[attr-defined]
    assert backend.tries == {"n2": 2, "n3": 3}
    assert "n3 still does not answer: attempt 1's part there may still run; `fleet stop r` " \
           "ends it once it answers\n" in err, err
    assert left.thread is not None
    left.thread.join(5)
    assert not left.thread.is_alive()


def test_a_lost_part_that_had_ended_by_itself_is_not_called_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node answers again after a reboot: stop.sh finds nothing of the part to stop, and
    fleet says it had already ended, not that it stopped it."""
    monkeypatch.setattr(left_mod, "LEFT_POLL_S", 3600.0)
    monkeypatch.setattr(attempts.state, "load", lambda run_id: SimpleNamespace(
        dir=tmp_path / run_id))
    c = Console(out=io.StringIO(), err=io.StringIO())
    left = attempts.Left(Stopper({"n2": 1}, gone={"n2"}), c, "r")  # type: ignore[arg-type]
    left.add(attempts.Attempt(1, "r", ["n1", "n2"], 0.0, 1.0, RunStatus.UNKNOWN, lost=["n2"]))
    left.end()
    err = c.err.getvalue()  # type: ignore[attr-defined]
    assert "n2 answered again: attempt 1's part there had already ended\n" in err, err
    assert "stopped" not in err, err


class Asker:
    """A backend that says which nodes of which attempt `ps` asks (their part still runs)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, set[str]]] = []

    def parts_left(self, rec: SimpleNamespace, nodes: set[str]) -> list[str]:
        self.asked.append((rec.run_id, nodes))
        return [f"  {n}  running" for n in sorted(nodes)]


def test_ps_asks_only_the_lost_nodes_whose_end_fleet_has_not_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `ps` and `status` asks of an earlier attempt only the nodes it lost that fleet has
    not seen end since (its record says which); never the nodes it stopped or saw end, nor any
    node of an attempt that lost none: a host gone from the lab costs nothing after."""
    from fleet.lifecycle.answers import not_over as _not_over
    backend = Asker()
    monkeypatch.setattr("fleet.backends.for_record", lambda rec: backend)
    every = [SimpleNamespace(run_id=r, dir=tmp_path / r) for r in ("r", "r-a2", "r-a3", "r-a4")]
    for rec in every:
        rec.dir.mkdir()
    items = [attempts.Attempt(1, "r", ["n1", "n2", "n3"], 0.0, 1.0, RunStatus.UNKNOWN,
                              lost=["n2", "n3"]),
             attempts.Attempt(2, "r-a2", ["n1", "n4", "n3"], 2.0, 3.0, RunStatus.FAILED),
             attempts.Attempt(3, "r-a3", ["n1", "n4", "n5"], 4.0, 5.0, RunStatus.UNKNOWN,
                              lost=["n5"]),
             attempts.Attempt(4, "r-a4", ["n1", "n4", "n6"], 6.0, 7.0, RunStatus.SUCCEEDED)]
    # n5's part was stopped once it answered again: its end is kept.
    left_mod.outcomes.note(every[2].dir, NodeOutcome("n5", 2, NodeStatus.STOPPED, 143), "fleet up")
    assert _not_over(every, items) == [(1, ["  n2  running", "  n3  running"])]  # type: ignore[arg-type]
    assert backend.asked == [("r", {"n2", "n3"})]
