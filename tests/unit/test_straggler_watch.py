"""`fleet up`'s straggler watch over a fake run whose ranks() answers made looks: a rank named
after 3 looks in a row and said once (an event, a warning, the record, `status`, the end's
notice), a clean set never named, a node that raises left out of its look, the thread ending
with the run; and straggler_action = "replace" stopping the attempt for a free spare."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import time
from collections.abc import Callable, Generator
from pathlib import Path

import pytest

from fleet import events as ev
from fleet.backends.answers import NodeLook
from fleet.backends.base import Event, NodeEnded, Options, Quiet
from fleet.config.job import Job
from fleet.config.restart import Restart
from fleet.config.watchdog import StragglerAction, Watchdog
from fleet.console import Console
from fleet.facts.ranktop import NodeTop, Place, RankSample, parse_top
from fleet.lifecycle import notify, runner, straggler_watch
from fleet.lifecycle.guard import Guard
from fleet.lifecycle.monitor import RunState, monitor
from fleet.lifecycle.spares import Places
from fleet.lifecycle.straggler_watch import StragglerWatch, spare_for
from fleet.run import straggler_record
from fleet.states import NodeOutcome, NodeStatus, RunStatus
from tests.unit.test_runner import FakeRun, make_job

Looks = dict[str, NodeLook | Exception]


def rank(r: int, collective: int, samples: int = 100, host_pid: int = 100) -> RankSample:
    """A rank's summary: `collective` of its `samples` in all_reduce, the rest computing."""
    return RankSample(host_pid + r, r, r % 2, True, 0.5, 20.0, samples, collective, 99.0,
                      1 << 20, None, Place(0, "compute", "forward() (train.py)"),
                      (Place(collective, "collective", "all_reduce()"),
                       Place(samples - collective, "compute", "forward() (train.py)")))


def node(*ranks: RankSample) -> NodeLook:
    return NodeLook(NodeTop(now=1000.0, samples=ranks))


def slow(r3_waits: int = 5) -> Looks:
    """Ranks 0-2 wait half their time for rank 3, which hardly waits: rank 3 (n2) is it."""
    return {"n1": node(rank(0, 50), rank(1, 52)), "n2": node(rank(2, 48), rank(3, r3_waits))}


def clean() -> Looks:
    return {"n1": node(rank(0, 30), rank(1, 33)), "n2": node(rank(2, 31), rank(3, 29))}


class WatchedRun(FakeRun):
    """A fake run whose ranks() answers `looks(n)` at its n-th call, and whose events are a
    Quiet about every 5 ms until `until(self)` (or 10 s), then every node's success."""

    def __init__(self, job: Job, record_dir: Path, looks: Callable[[int], Looks],
                 until: Callable[[WatchedRun], bool]) -> None:
        super().__init__(job, record_dir)
        self.looks, self.until, self.asked = looks, until, 0

    def ranks(self) -> Looks:
        self.asked += 1
        return self.looks(self.asked)

    def events(self) -> Generator[Event, None, None]:
        self.calls.append(("events",))
        deadline = time.monotonic() + 10
        try:
            while not self.until(self) and time.monotonic() < deadline:
                time.sleep(0.005)
                yield Quiet(0.0)
            for i, name in enumerate(("n1", "n2")):
                yield NodeEnded(NodeOutcome(name, i, NodeStatus.SUCCEEDED, 0))
        finally:
            self.calls.append(("events closed",))


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(straggler_watch, "LOOK_S", 0.01)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))


def watched_job(tmp_path: Path, **kw: object) -> Job:
    job = make_job(tmp_path)
    return dataclasses.replace(job, watchdog=Watchdog(straggler=1.3, **kw))  # type: ignore[arg-type]


def collected() -> tuple[Console, ev.Collected]:
    sink = ev.Collected()
    return Console(out=io.StringIO(), err=io.StringIO(), sink=sink), sink


def stragglers(sink: ev.Collected) -> list[ev.Straggler]:
    return [e for e in sink.events if isinstance(e, ev.Straggler)]


def watch_run(tmp_path: Path, looks: Callable[[int], Looks], until: Callable[[WatchedRun], bool],
              job: Job | None = None, spare: straggler_watch.SpareFor | None = None
              ) -> tuple[WatchedRun, RunState, ev.Collected]:
    run = WatchedRun(job or watched_job(tmp_path), tmp_path / "state" / "j-1", looks, until)
    c, sink = collected()
    return run, monitor(run, Guard(run, c), c, spare), sink


class Answers:
    """Only the seam's ranks(), answered by `fn`: a watch looked through by hand."""

    def __init__(self, fn: Callable[[], Looks]) -> None:
        self.fn = fn

    def ranks(self) -> Looks:
        return self.fn()


def by_hand(fn: Callable[[], Looks]) -> StragglerWatch:
    return StragglerWatch(Answers(fn), 1.3)  # type: ignore[arg-type]


# ---- one look after another ---------------------------------------------------------------
def test_a_rank_is_named_at_its_third_look_in_a_row_and_then_not_again() -> None:
    w = by_hand(slow)
    got = [w.look() for _ in range(6)]
    assert got[0] is None and got[1] is None and got[3:] == [None] * 3
    s = got[2]
    assert s is not None and (s.rank, s.host, s.place) == (3, "n2", "all_reduce()")
    assert s.score == 1.9 and s.others_wait == 0.5
    assert s.line.startswith("rank 3 (n2) is the straggler: the others wait for it in "
                             "all_reduce() 50% of the time")
    assert w.looks == 6 and not w.thread.is_alive()  # never started: looks by hand


def test_a_clean_set_is_never_named_nor_one_slow_look_among_clean_ones() -> None:
    answers = iter([clean(), slow(), clean(), slow(), slow(), clean()] + [clean()] * 10)
    w = by_hand(lambda: next(answers))
    assert [w.look() for _ in range(16)] == [None] * 16


def test_a_watch_that_judges_no_rank_says_so_once_and_one_that_judges_never_does() -> None:
    from fleet.lifecycle.straggler_watch import BLIND_LOOKS

    w = by_hand(lambda: {"n1": node(rank(0, 50))})  # one rank: nothing to judge it against
    for _ in range(BLIND_LOOKS - 1):
        w.look()
    assert w.blind() is None
    w.look()
    said = w.blind()
    assert said == (f"the straggler watch has judged no rank after {BLIND_LOOKS} looks (fewer "
                    "than two ranks in a process group): nothing is named meanwhile")
    assert w.blind() is None  # once
    failing = by_hand(lambda: (_ for _ in ()).throw(RuntimeError("connection reset")))
    for _ in range(BLIND_LOOKS):
        failing.look()
    assert "(RuntimeError: connection reset)" in (failing.blind() or "")
    judging = by_hand(clean)
    for _ in range(BLIND_LOOKS + 1):
        judging.look()
    assert judging.blind() is None


def test_a_node_that_raises_is_left_out_and_a_look_that_fails_whole_is_no_look() -> None:
    broken: Looks = {"n1": node(rank(0, 50), rank(1, 2)), "n2": TimeoutError("n2: timed out")}
    answers: list[Looks | Exception] = [broken, RuntimeError("connection reset"), broken, broken]

    def ranks() -> Looks:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    w = by_hand(ranks)
    got = [w.look() for _ in range(4)]
    # n1's two ranks judged alone: rank 1 hardly waits for rank 0; the failed look in between
    # neither counts nor breaks the run of looks.
    assert got[:3] == [None, None, None] and w.problem == "RuntimeError: connection reset"
    assert got[3] is not None and (got[3].rank, got[3].host) == (1, "n1") and w.looks == 3


def test_made_text_parsed_as_a_node_says_it_is_judged_the_same() -> None:
    def summary(pid: int, r: int, coll: int) -> str:
        return (f"=== sample {pid}\n|fleet-samples 1\n|rank {r} local {r} pid {pid} dist 1\n"
                f"|time 999.5 window 20 samples 100 collective {coll}\n"
                f"|cpu 98.0 rss 1000 throttled 0.40\n|now compute forward() (x.py)\n"
                f"|place {coll} collective all_reduce()\n"
                f"|place {100 - coll} compute forward() (x.py)\n")

    one = parse_top(f"=== now 1000.0\n{summary(11, 0, 50)}{summary(12, 1, 47)}")
    two = parse_top(f"=== now 1000.0\n{summary(21, 2, 3)}")
    answers = {"a": NodeLook(one), "b": NodeLook(two)}
    w = by_hand(lambda: answers)
    s = [w.look() for _ in range(3)][2]
    assert s is not None and (s.rank, s.host) == (2, "b")
    assert s.line.endswith("; b CPU throttled 40% of the time")


# ---- in the monitor -----------------------------------------------------------------------
def test_the_monitor_says_a_straggler_once_keeps_it_and_its_thread_ends_with_the_run(
        tmp_path: Path, fast: None) -> None:
    run, state, sink = watch_run(tmp_path, lambda n: slow(), lambda r: r.asked >= 12)
    said = stragglers(sink)
    assert len(said) == 1 and (said[0].rank, said[0].host, said[0].score) == (3, "n2", 1.9)
    assert said[0].place == "all_reduce()" and said[0].others_wait == 0.5
    assert [(s.rank, s.host) for s in state.stragglers] == [(3, "n2")]
    assert state.replacing is None and not state.stopping  # warn: the run goes on
    assert state.status is RunStatus.SUCCEEDED
    kept = straggler_record.read(run.record_dir)
    assert [(k.straggler, k.run_id) for k in kept] == [(said[0], "j-1")]
    threads = [t for t in threading.enumerate() if t.name == "fleet-straggler-watch"]
    for t in threads:
        assert t.daemon  # never what keeps fleet alive
        t.join(2)
    assert not any(t.is_alive() for t in threads)
    asked = run.asked
    time.sleep(0.1)
    assert run.asked == asked  # no look after the run's end


def test_the_monitor_names_nothing_in_a_clean_run_and_without_the_setting_never_looks(
        tmp_path: Path, fast: None) -> None:
    run, state, sink = watch_run(tmp_path, lambda n: clean(), lambda r: r.asked >= 10)
    assert run.asked >= 10 and stragglers(sink) == [] and state.stragglers == ()
    assert straggler_record.read(run.record_dir) == []
    plain = make_job(tmp_path)  # no [watchdog] straggler
    quiet = iter(range(50))
    run, state, sink = watch_run(tmp_path, lambda n: slow(), lambda r: next(quiet, None) is None,
                                 job=plain)
    assert run.asked == 0 and stragglers(sink) == []


def test_a_failing_ranks_never_fails_the_run(tmp_path: Path, fast: None) -> None:
    def looks(n: int) -> Looks:
        raise OSError("the seam broke")

    run, state, sink = watch_run(tmp_path, looks, lambda r: r.asked >= 5)
    assert state.status is RunStatus.SUCCEEDED and stragglers(sink) == []


def test_the_terminal_warns_once_with_the_line(tmp_path: Path, fast: None) -> None:
    run = WatchedRun(watched_job(tmp_path), tmp_path / "state" / "j-1", lambda n: slow(),
                     lambda r: r.asked >= 8)
    err = io.StringIO()
    c = Console(out=io.StringIO(), err=err, color=False, live=False)
    monitor(run, Guard(run, c), c)
    lines = [x for x in err.getvalue().splitlines() if "straggler" in x]
    assert len(lines) == 1
    assert lines[0].startswith("fleet: straggler: rank 3 (n2) is the straggler: the others wait")


# ---- straggler_action = "replace" ---------------------------------------------------------
def test_replace_stops_the_attempt_where_a_spare_is_free(tmp_path: Path, fast: None) -> None:
    job = watched_job(tmp_path, straggler_action=StragglerAction.REPLACE)
    places = Places(lambda: ["s1"])
    run, state, sink = watch_run(tmp_path, lambda n: slow(), lambda r: bool(r.named("stop")),
                                 job=job, spare=spare_for(places, 1, 2))
    assert state.replacing is not None and state.replacing.host == "n2" and state.stopping
    assert [c[1] for c in run.named("stop")] == ["straggler watch: rank 3 (n2) is the straggler"]
    notes = [e.words for e in sink.events if isinstance(e, ev.Note)]
    assert "straggler: stopping this attempt; n2 gives way to spare s1 in the next one" in notes


@pytest.mark.parametrize("spares, attempt, why", [
    ([], 1, "no spare is free"), (["s1"], 3, "no attempt left ([restart] max = 2)")])
def test_replace_without_a_free_spare_or_an_attempt_left_only_warns(
        tmp_path: Path, fast: None, spares: list[str], attempt: int, why: str) -> None:
    job = watched_job(tmp_path, straggler_action=StragglerAction.REPLACE)
    run, state, sink = watch_run(tmp_path, lambda n: slow(), lambda r: r.asked >= 8, job=job,
                                 spare=spare_for(Places(lambda: spares), attempt, 2))
    assert run.named("stop") == [] and state.replacing is None
    assert state.status is RunStatus.SUCCEEDED and len(stragglers(sink)) == 1
    notes = [e for e in sink.events if isinstance(e, ev.Note)]
    assert [n.words for n in notes] == [f'straggler: n2 is not replaced ({why}; '
                                        'straggler_action = "replace"): the run goes on']
    assert notes[0].tone is ev.Tone.WARN


def test_a_replacing_attempt_restarts_with_the_spare_in_the_stragglers_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.backends.base import Final
    from tests.unit.test_restart import FakeRun as Ran
    from tests.unit.test_restart import book, outcome

    b = book(tmp_path, "[restart]\nmax = 2\n", monkeypatch)
    w = by_hand(lambda: {"n1": node(rank(0, 50)), "n2": node(rank(1, 2))})
    s = [w.look() for _ in range(3)][2]
    assert s is not None and s.host == "n2"
    state = RunState({"n1": outcome("n1", NodeStatus.STOPPED),
                      "n2": outcome("n2", NodeStatus.STOPPED)}, True, None, replacing=s)
    assert b.record(Ran(b.run_id), Final(RunStatus.STOPPED), state, None, 1.0, 2.0) == 2  # type: ignore[arg-type]
    assert b.replace == {"n2": "s1"}
    assert b.attempts[0].why == "rank 1 (n2) was the straggler"
    b.confirm()
    assert "n2 replaced by spare s1 (rank 1 (n2) was the straggler)" in \
        b.console.err.getvalue()  # type: ignore[attr-defined]


# ---- told at the end, and kept ------------------------------------------------------------
def test_the_ends_notice_carries_each_straggler_named(tmp_path: Path, fast: None) -> None:
    job = dataclasses.replace(watched_job(tmp_path), restart=Restart())
    run = WatchedRun(job, tmp_path / "state" / "j-1", lambda n: slow(), lambda r: r.asked >= 8)
    told = notify.Told("j", time.time())
    c, _ = collected()
    ended = runner.attempt(type("B", (), {"prepare": lambda *a: run})(), job, c,  # type: ignore[arg-type]
                           Options(), told)
    assert not isinstance(ended, str) and len(told.stragglers) == 1
    n = notify.notice(told, None, time.time())
    assert n is not None and n.stragglers == (told.stragglers[0],)
    text = notify.message(n)
    assert "\nstraggler: rank 3 (n2) is the straggler: the others wait" in text
    body = json.loads(notify.request("http://x", notify.Format.JSON, n).data)  # type: ignore[arg-type]
    assert body["stragglers"] == [told.stragglers[0]]


def test_the_record_keeps_every_straggler_and_refuses_a_damaged_one(tmp_path: Path) -> None:
    one = ev.Straggler(3, "n2", 1.9, 0.5, "all_reduce()", "rank 3 (n2) is the straggler: x")
    assert straggler_record.keep(tmp_path, one, "r-1") is None
    assert straggler_record.keep(tmp_path, dataclasses.replace(one, rank=1), "r-1") is None
    kept = straggler_record.read(tmp_path)
    assert [k.straggler.rank for k in kept] == [3, 1]
    assert kept[0].words(2).startswith("straggler: rank 3 (n2) is the straggler: x (named at ")
    assert kept[0].words(2).endswith(" in attempt 2)")
    d = straggler_record.as_json(kept[0])
    assert set(d) == {"rank", "host", "score", "others_wait", "place", "line", "at", "run_id"}
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / straggler_record.FILE).write_text('{"stragglers": [{"rank": "x"}]}')
    named, problems = straggler_record.of_run([tmp_path, tmp_path / "bad", tmp_path / "none"])
    assert len(named) == 2 and len(problems) == 1 and "damaged" in problems[0]
    assert straggler_record.keep(tmp_path / "bad", one, "r") is not None  # said, not raised
    assert straggler_record.keep(tmp_path / "gone", one, "r") is not None


def test_up_with_replace_starts_the_next_attempt_with_the_spare_in_the_stragglers_place(
        tmp_path: Path, fast: None) -> None:
    from fleet.backends.base import Final

    job = dataclasses.replace(watched_job(tmp_path, straggler_action=StragglerAction.REPLACE),
                              restart=Restart(max=1, backoff=0.0))
    first = WatchedRun(job, tmp_path / "state" / "a1", lambda n: slow(),
                       lambda r: bool(r.named("stop")))
    first.final = Final(RunStatus.STOPPED, " by straggler watch: rank 3 (n2) is the straggler")
    second = WatchedRun(job, tmp_path / "state" / "a2", lambda n: clean(),
                        lambda r: r.asked >= 5)
    asked: list[Options] = []

    class Backend:
        def prepare(self, job: Job, console: Console, options: Options) -> WatchedRun:
            asked.append(options)
            return (first, second)[len(asked) - 1]

        def spares(self, inventory: Path) -> list[str]:
            return ["s1"]

    c, sink = collected()
    runner.up(Backend(), job, c)  # type: ignore[arg-type]
    assert [o.attempt for o in asked] == [1, 2]
    assert asked[0].replace == () and asked[1].replace == (("n2", "s1"),)
    assert [c[1] for c in first.named("stop")] == [
        "straggler watch: rank 3 (n2) is the straggler"]
    assert second.named("stop") == [] and len(stragglers(sink)) == 1
    words = [e.words for e in sink.events if isinstance(e, ev.Note)]
    assert "restart: n2 replaced by spare s1 (rank 3 (n2) was the straggler)" in words, words
    attempt = next(e for e in sink.events if isinstance(e, ev.Attempt))
    assert (attempt.number, attempt.why) == (2, "rank 3 (n2) was the straggler")


def test_a_detached_run_is_told_it_has_no_watch(tmp_path: Path, fast: None) -> None:
    run = WatchedRun(watched_job(tmp_path), tmp_path / "state" / "j-1", lambda n: slow(),
                     lambda r: True)
    c, sink = collected()
    assert runner.up(type("B", (), {"prepare": lambda *a: run})(), run.job, c,  # type: ignore[arg-type]
                     Options(detach=True)) == "j-1"
    notes = [e for e in sink.events if isinstance(e, ev.Note) and "straggler" in e.words]
    assert [n.tone for n in notes] == [ev.Tone.WARN] and "no straggler watch" in notes[0].words
    assert run.asked == 0 and run.named("events") == []


def test_status_says_the_stragglers_kept_from_the_record_alone(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    from fleet.lifecycle import attempts, history
    from tests.conftest import InProcessCLI
    from tests.unit.test_verdict import ended, save

    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / ".fleet"))
    monkeypatch.setattr("fleet.backends.hosts.recorded.on_nodes", lambda *a, **k: pytest.fail(
        "a host was asked"))
    cli = InProcessCLI(tmp_path)
    first, second = save("r", ("n1", "n2")), save("r-a2", ("n1", "s1"), parent="r")
    for rec, node in ((first, "n1"), (first, "n2"), (second, "n1"), (second, "s1")):
        ended(rec, node, NodeStatus.SUCCEEDED, 0)
    items = [attempts.Attempt(n, rec.run_id, [x.host.name for x in rec.nodes], 0.0, 1.0,
                              RunStatus.SUCCEEDED) for n, rec in ((1, first), (2, second))]
    (first.dir / attempts.FILE).write_text(json.dumps(
        {"max": 1, "attempts": [attempts.as_dict(a) for a in items]}))
    assert history.keep("r", RunStatus.SUCCEEDED, 0, "fleet up", "run r succeeded")
    assert json.loads(cli("status", "r", "--json", timeout=5).stdout)["straggler"] is None
    one = ev.Straggler(1, "n2", 1.9, 0.5, "all_reduce()", "rank 1 (n2) is the straggler: a")
    assert straggler_record.keep(first.dir, one, "r") is None
    assert straggler_record.keep(second.dir, dataclasses.replace(
        one, host="s1", line="rank 1 (s1) is the straggler: b"), "r-a2") is None
    st = cli("status", "r", timeout=5)
    assert st.returncode == 0, st.stdout + st.stderr
    said = [x for x in st.stdout.splitlines() if "straggler" in x]
    assert [x.split(" (named at ")[0] for x in said] == [
        "  straggler: rank 1 (n2) is the straggler: a",
        "  straggler: rank 1 (s1) is the straggler: b"]
    assert said[0].endswith(" in attempt 1)") and said[1].endswith(" in attempt 2)")
    js = json.loads(cli("status", "r", "--json", timeout=5).stdout)
    assert (js["straggler"]["host"], js["straggler"]["run_id"]) == ("s1", "r-a2")
    (second.dir / straggler_record.FILE).write_text("{")  # damaged: said, the rest still is
    st = cli("status", "r", timeout=5)
    assert st.returncode == 0 and "  straggler: rank 1 (n2) is the straggler: a" in st.stdout
    assert "the stragglers kept are damaged" in st.stdout
