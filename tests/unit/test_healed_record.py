"""A detached run that healed by itself, taken into the laptop's record
(fleet.backends.hosts.healed): the record of the attempt that ran is the one prepared with the
lost node's place taken by the spare; the run's attempts.json says the loss and the
replacement as fleet.lifecycle.attempts reads it; a healed.json that is not fleet's word
changes nothing; the next attempt's heal.sh quotes every name."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from fleet.backends.hosts import heal, healed
from fleet.config.inventory import Host
from fleet.errors import RemoteCommandError
from fleet.lifecycle import attempts
from fleet.nodeside.shared.heal_rules import Healing, dumps_healed
from fleet.run import record as state
from fleet.run import watched
from fleet.states import RunStatus

HOSTS = {n: Host(n, f"10.0.0.{i}") for i, n in enumerate(("node1", "node2", "node3", "spare1"))}


def rec_of(run_id: str, names: tuple[str, ...], parent: str = "") -> state.RunRecord:
    return state.RunRecord(run_id, "job.toml", 100.0, tuple(
        state.NodeRecord(HOSTS[n], i, f"/h/fleet/runs/{run_id}/{n}", i, 1)
        for i, n in enumerate(names)), secret="s" * 32, parent=parent)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> state.RunRecord:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    rec = rec_of("r1", ("node1", "node2", "node3"))
    rec.dir.mkdir(parents=True)
    state.write_atomic(rec.dir / "run.json", json.dumps(dataclasses.asdict(rec)))
    for lost, names in (("node2", ("node1", "spare1", "node3")),
                        ("node3", ("node1", "node2", "spare1"))):
        d = rec.dir / heal.STAGED / lost
        d.mkdir(parents=True)
        state.write_atomic(d / "run.json", json.dumps(dataclasses.asdict(
            rec_of("r1-a2", names, "r1"))))
    (rec.dir / heal.STAGED / "max").write_text("2\n")
    return rec


def test_the_attempt_that_ran_is_taken_into_the_record(run: state.RunRecord) -> None:
    assert healed.waiting(run) == ["node2", "node3"]
    text = dumps_healed(Healing(2, "r1-a2", "node3", "spare1", "healed: node3 unreachable",
                                500.0))
    assert healed.take(run, text) is not None
    a2 = state.load("r1-a2")
    assert [n.host.name for n in a2.nodes] == ["node1", "node2", "spare1"]
    assert a2.parent == "r1" and a2.launched
    assert watched.watched_by(a2, RunStatus.RUNNING).startswith("watched by: the nodes' own ")
    max_, items = attempts.load(run) or (0, [])
    assert max_ == 2 and len(items) == 1
    assert items[0].replaced == {"node3": "spare1"} and items[0].lost == ["node3"]
    assert attempts.headline(max_, items, 2).startswith(
        "attempt 2/3, node3 replaced by spare1 after node3 was lost at")
    assert healed.waiting(run) == []  # once
    assert [r.run_id for r in attempts.records(run)] == ["r1", "r1-a2"]


def test_nothing_healed_changes_nothing(run: state.RunRecord) -> None:
    assert healed.take(run, "") is None
    assert healed.waiting(run) == ["node2", "node3"]
    # `fleet rm` removes the attempt prepared on every node it was written to.
    prepared = healed.waiting_record(run)
    assert prepared is not None and prepared.run_id == "r1-a2"
    assert sorted(n.host.name for n in prepared.nodes) == ["node1", "node2", "node3", "spare1"]


@pytest.mark.parametrize("text", [
    "{not json", dumps_healed(Healing(2, "r1-a2", "node1", "spare1", "x", 1.0)),
    dumps_healed(Healing(2, "r1-a2", "node3", "node2", "x", 1.0)),
    dumps_healed(Healing(3, "r1-a3", "node3", "spare1", "x", 1.0)),
])
def test_a_healed_json_that_is_not_fleets_word_changes_nothing(run: state.RunRecord,
                                                              text: str) -> None:
    with pytest.raises(RemoteCommandError, match="healed.json"):
        healed.take(run, text)
    assert healed.waiting(run) == ["node2", "node3"]
    assert attempts.load(run) is None


def test_heal_sh_quotes_every_name() -> None:
    n = type("N", (), {"run_dir": "/h/fleet/runs/r 1-a2/node2"})()
    text = heal.heal_script(n, "r 1-a2", "python3", ["node3", "odd'name"])  # type: ignore[arg-type]
    assert f"cd {shlex.quote('/h/fleet/runs/r 1-a2/node2')} || exit 1" in text
    assert "case \"$1\" in node3|'odd'\"'\"'name') ;;" in text


def test_a_run_whose_end_is_kept_is_not_asked_about_a_heal(run: state.RunRecord,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A detached run prepared to heal that ended without healing keeps its prepared attempt
    (for `fleet rm`), but once its end is in the record, no status or ps asks its master."""
    from fleet.backends.hosts.backend import HostsBackend
    from fleet.run import verdict

    asked: list[str] = []
    monkeypatch.setattr(healed, "read", lambda rec: asked.append(rec.run_id) or "")
    HostsBackend().take_healed(run)
    assert asked == ["r1"]  # not ended: the master is asked
    verdict.record(run.dir, verdict.Verdict(RunStatus.SUCCEEDED, 0, "fleet status", 200.0,
                                            "run r1 succeeded", ()))
    HostsBackend().take_healed(run)
    assert asked == ["r1"] and healed.waiting(run) == ["node2", "node3"]


def test_an_end_read_before_the_heal_was_taken_in_is_not_kept(
        run: state.RunRecord, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status` read attempt 1's end, and the nodes' watchers healed the run meanwhile: that
    end is no end of the run (attempt 2 goes on), so no verdict is kept."""
    from fleet.lifecycle.answers import keep_seen
    from fleet.run import verdict

    text = dumps_healed(Healing(2, "r1-a2", "node3", "spare1", "healed: node3 unreachable",
                                500.0))
    monkeypatch.setattr(healed, "read", lambda rec: text)
    keep_seen(run, run, "fleet status", RunStatus.STOPPED)
    assert verdict.read(run.dir) is None
    assert [r.run_id for r in attempts.records(run)] == ["r1", "r1-a2"]
