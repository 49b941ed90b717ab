"""Spares and the policy of who gives way to one (`[restart] replace`), without hosts: a failed
node retried in place first, a lost one replaced at once; a spare said to take a place only once
its attempt passed its checks; an attempt that could not start is one of `max`; the restart's
words are the failure report's."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.backends.base import Final
from fleet.config.job import load_job
from fleet.config.restart import Ending, Replace
from fleet.errors import ConfigError
from fleet.facts.failure import RankFailure, cause
from fleet.lifecycle import attempts, spares
from fleet.states import RunStatus
from tests.unit.test_restart import FakeRun, S, book, failed_state, job_file, said

L, F = Replace.LOST, Replace.FAIL


@pytest.mark.parametrize(("kind", "lost", "failed", "before", "replace", "give_way", "in_place"), [
    # A lost node gives way at once, whatever the policy.
    (Ending.LOST, ["n2"], None, set(), L, ("n2",), None),
    (Ending.LOST, ["n2", "n3", "n2"], None, set(), F, ("n2", "n3"), None),
    # A failed node: retried in place first by default, replaced if it fails again.
    (Ending.FAIL, [], "n2", set(), L, (), "n2"),
    (Ending.FAIL, [], "n2", {"n1"}, L, (), "n2"),
    (Ending.FAIL, [], "n2", {"n2"}, L, ("n2",), None),
    # replace = "fail": at once.
    (Ending.FAIL, [], "n2", set(), F, ("n2",), None),
    # A hang names no node to blame; a success or a stop none at all.
    (Ending.HANG, [], None, set(), F, (), None),
    (None, [], None, set(), F, (), None),
])
def test_who_gives_way_to_a_spare(kind: Ending | None, lost: list[str], failed: str | None,
                                  before: set[str], replace: Replace,
                                  give_way: tuple[str, ...], in_place: str | None) -> None:
    assert spares.decide(kind, lost, failed, before, replace) == spares.Decision(give_way,
                                                                                 in_place)


def test_replace_is_read_and_checked(tmp_path: Path) -> None:
    path = job_file(tmp_path, "[restart]\nmax = 1\n")
    assert load_job(path).restart.replace is Replace.LOST  # the default
    path.write_text(path.read_text() + 'replace = "fail"\n')
    assert load_job(path).restart.replace is Replace.FAIL
    path.write_text(path.read_text().replace('"fail"', '"always"'))
    with pytest.raises(ConfigError, match=r'restart\.replace.*must be one of "lost", "fail", '
                                          r"not 'always'"):
        load_job(path)


def test_a_failed_node_is_retried_in_place_then_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, "[restart]\nmax = 3\n", monkeypatch)
    failed = Final(RunStatus.FAILED, cause="rank 1 on n2 killed by SIGKILL")
    assert b.record(FakeRun(b.run_id), failed, failed_state(), None, 1.0, 2.0) == 2  # type: ignore[arg-type]
    assert b.replace == {} and b.places.free() == ["s1", "s2"]  # the spares stay free
    assert 'restart: n2 is retried in place (its first failure; [restart] replace = "lost")' \
        in said(b)
    b.confirm()
    assert "replaced" not in said(b)
    assert b.record(FakeRun("a2"), failed, failed_state(), None, 3.0, 4.0) == 3  # type: ignore[arg-type]
    assert b.replace == {"n2": "s1"}
    b.confirm()
    assert "restart: n2 replaced by spare s1 (rank 1 on n2 killed by SIGKILL)" in said(b)
    assert [a.replaced for a in b.attempts] == [{}, {"n2": "s1"}]


def test_replace_fail_gives_a_failed_node_way_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, '[restart]\nmax = 3\nreplace = "fail"\n', monkeypatch)
    assert b.record(FakeRun(b.run_id), Final(RunStatus.FAILED), failed_state(), None, 1.0,  # type: ignore[arg-type]
                    2.0) == 2
    assert b.replace == {"n2": "s1"} and "retried in place" not in said(b)


def test_an_attempt_that_cannot_start_is_one_of_max_not_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """n2 lost, both spares unfit: n2 is tried again while it is still down; that attempt
    could not start, and the next follows while max allows one."""
    b = book(tmp_path, "[restart]\nmax = 3\n", monkeypatch)
    lost = Final(RunStatus.UNKNOWN)
    assert b.record(FakeRun(b.run_id), lost, failed_state("n2", S.UNREACHABLE), None, 1.0,  # type: ignore[arg-type]
                    2.0) == 2
    assert b.unfit({"s1": "unknown host key for s1"}) and b.unfit({"s2": "unreachable"})
    assert b.replace == {}
    down = {"n2": "could not connect: Connection refused\nmore"}
    assert b.unstarted(f"{b.run_id}-a2", down, 3.0) == 3
    a2 = b.attempts[-1]
    assert (a2.number, a2.status, a2.hosts, a2.replaced) == (2, RunStatus.FAILED,
                                                            ["n1", "n2"], {})
    assert a2.why == "it could not start: n2: could not connect: Connection refused"
    assert b.unstarted(f"{b.run_id}-a3", down, 4.0) == 4
    assert b.unstarted(f"{b.run_id}-a4", down, 5.0) is None
    assert "restart: no attempt left ([restart] max = 3)" in said(b)
    assert "replaced" not in said(b)
    assert all(not a.replaced for a in b.attempts)
    # The first attempt's error is for a person.
    fresh = book(tmp_path, "[restart]\nmax = 3\n", monkeypatch)
    assert fresh.unstarted(fresh.run_id, down, 1.0) is None and not fresh.attempts


def test_a_spare_found_unfit_after_it_was_said_is_taken_back_from_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A check after the preparation (the preflight's ports) fails on the spare: the record
    keeps no "replaced by" for it, and the next spare is said once it passed."""
    b = book(tmp_path, "[restart]\nmax = 3\n", monkeypatch)
    assert b.record(FakeRun(b.run_id), Final(RunStatus.UNKNOWN),  # type: ignore[arg-type]
                    failed_state("n2", S.UNREACHABLE), None, 1.0, 2.0) == 2
    b.confirm()
    assert b.attempts[-1].replaced == {"n2": "s1"}
    assert b.unfit({"s1": "port 29500 is taken"})
    assert b.attempts[-1].replaced == {}
    b.confirm()
    assert b.attempts[-1].replaced == {"n2": "s2"}


@pytest.mark.parametrize(("failure", "words"), [
    (RankFailure("node2", 1, 1, 0, -9, 1.0, ""), "rank 1 on node2 killed by SIGKILL"),
    (RankFailure("node2", 1, 1, 0, 1, 1.0, 'Traceback (most recent call last):\n  File "x"\n'
                 "RuntimeError: injected crash at step 3\n"),
     "rank 1 on node2: RuntimeError: injected crash at step 3"),
    (RankFailure("node1", 0, None, None, 2, 1.0, "last words", found=False),
     "a rank on node1 exited with code 2"),
    (RankFailure("node1", 0, None, None, None, 1.0, "last words", found=False), ""),
])
def test_the_restart_names_the_cause_as_the_failure_report_does(failure: RankFailure,
                                                                 words: str) -> None:
    assert cause(failure) == words
    state = failed_state()
    assert attempts.ending(Final(RunStatus.FAILED, cause=words), state, None) == (
        Ending.FAIL, words or "n2 failed (exit 1)")  # else the node's own words


def test_check_and_plan_cover_the_spares_marked_as_such(tmp_path: Path) -> None:
    from fleet.backends.checks import Check, Status
    from fleet.backends.hosts.check import marked
    from fleet.backends.hosts.planview import Spare, spare_lines
    from fleet.config.inventory import load_inventory

    inv = load_inventory(job_file(tmp_path, "").parent / "inv.toml")
    rows = [Check("n1", "ssh", Status.PASS, "ok"),
            Check("s1", "ssh", Status.FAIL, "unknown host key for s1")]
    assert [c.host for c in marked(inv, rows)] == ["n1", "s1 (spare)"]
    said = spare_lines((Spare(inv.spares[0], "unknown host key for s1"), Spare(inv.spares[1])))
    assert said[0].startswith("\n[s1] spare (not used at the start") and "10.0.0.3" in said[0]
    assert said[1] == "  probe:     unknown host key for s1"
    assert said[2].startswith("\n[s2] spare") and len(said) == 3


def test_a_spare_standing_since_an_earlier_attempt_found_unfit_gives_way_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = book(tmp_path, "[restart]\nmax = 3\n", monkeypatch)
    lost = Final(RunStatus.UNKNOWN)
    assert b.record(FakeRun(b.run_id), lost, failed_state("n2", S.UNREACHABLE), None, 1.0,  # type: ignore[arg-type]
                    2.0) == 2
    b.confirm()
    hang = Final(RunStatus.FAILED)
    assert b.record(FakeRun("a2"), hang, failed_state("n1", S.STOPPED), "stuck", 3.0,  # type: ignore[arg-type]
                    4.0) == 3
    assert b.unfit({"s1": "unreachable"}) and b.replace == {"n2": "s2"}
    b.confirm()
    assert [a.replaced for a in b.attempts] == [{"n2": "s1"}, {"s1": "s2"}]
    assert "restart: s1 replaced by spare s2 (a hang)" in said(b)
