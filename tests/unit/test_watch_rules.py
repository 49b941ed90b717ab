"""The nodes' own watchers' rules (fleet.nodeside.shared.watch_rules): every message they take
from the network is checked (signature over this side's nonce, fields, sizes, order), and what
they decide from what they heard; the laptop's side of it (fleet.backends.hosts.watchers) and
`status`'s word on who watches a run (fleet.run.watched)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleet.backends.hosts import watchers
from fleet.config.inventory import BackendKind
from fleet.nodeside.shared import watch_rules as w
from fleet.nodeside.shared.watch_rules import BadMessage, Hub, Message, Peer

TOKEN = b"t" * 64
NONCE = "ab" * 16
NODES = frozenset({"node1", "node2", "node3"})


def line(m: Message, token: bytes = TOKEN, nonce: str = NONCE) -> bytes:
    return w.encode(token, nonce, m)


def test_each_kind_goes_through_as_it_was_sent() -> None:
    for m in (Message("beat", "node2", 1), Message("end", "node2", 2, code=0),
              Message("end", "node3", 3, code=None), Message("end", "node3", 4, code=255),
              Message("stop", "node1", 5, why="fail-fast: node3 unreachable", culprit="node3"),
              Message("stop", "node1", 6, why="fail-fast: x", culprit="")):
        assert w.parse(line(m), TOKEN, NONCE, NODES, 0) == m


@pytest.mark.parametrize("mutate, why", [
    (lambda b: b.replace(b'"node2"', b'"node3"'), "signature"),  # a field changed in transit
    (lambda b: b[:-1], "cut short"),
    (lambda b: b"0" * 64 + b[64:], "signature"),
    (lambda b: b"nonsense\n", "signature"),
    (lambda b: b"\xff" * 10 + b"\n", "UTF-8"),
    (lambda b: b"x" * (w.MAX_LINE + 1) + b"\n", "too long"),
])
def test_a_tampered_or_malformed_line_is_refused(mutate, why) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadMessage, match=why):
        w.parse(mutate(line(Message("beat", "node2", 1))), TOKEN, NONCE, NODES, 0)


def test_a_message_signed_for_another_link_or_run_is_refused() -> None:
    m = Message("stop", "node1", 1, why="fail-fast: x", culprit="node2")
    with pytest.raises(BadMessage, match="signature"):  # recorded on another link: its nonce
        w.parse(line(m, nonce="cd" * 16), TOKEN, NONCE, NODES, 0)
    with pytest.raises(BadMessage, match="signature"):  # another run's token
        w.parse(line(m, token=b"u" * 64), TOKEN, NONCE, NODES, 0)


def test_a_replayed_or_reordered_message_is_refused() -> None:
    with pytest.raises(BadMessage, match="order"):
        w.parse(line(Message("beat", "node2", 5)), TOKEN, NONCE, NODES, 5)


def signed(fields: dict[str, object]) -> bytes:
    """A correctly signed line of any JSON: what the run's token alone makes."""
    body = json.dumps(fields)
    return f"{w.sign(TOKEN, NONCE, body)} {body}\n".encode()


@pytest.mark.parametrize("fields, why", [
    ({"k": "beat", "n": "node2", "s": 1, "extra": 1}, "fields"),
    ({"k": "run", "n": "node2", "s": 1}, "fields"),
    ({"k": "end", "n": "node2", "s": 1}, "fields"),  # an end without its code
    ({"k": "beat", "n": "node9", "s": 1}, "no node"),
    ({"k": "beat", "n": 7, "s": 1}, "no node"),
    ({"k": "beat", "n": "node2", "s": "1"}, "order"),
    ({"k": "beat", "n": "node2", "s": True}, "order"),
    ({"k": "beat", "n": "node2", "s": 1 << 60}, "order"),
    ({"k": "end", "n": "node2", "s": 1, "c": 256}, "exit code"),
    ({"k": "end", "n": "node2", "s": 1, "c": -1}, "exit code"),
    ({"k": "end", "n": "node2", "s": 1, "c": "0"}, "exit code"),
    ({"k": "stop", "n": "node1", "s": 1, "why": "a\nb", "by": ""}, "reason"),
    ({"k": "stop", "n": "node1", "s": 1, "why": "x" * 301, "by": ""}, "reason"),
    ({"k": "stop", "n": "node1", "s": 1, "why": "x", "by": "elsewhere"}, "reason"),
    ({"k": "stop", "n": "node1", "s": 1, "why": 3, "by": ""}, "reason"),
])
def test_every_field_is_checked_even_when_signed(fields: dict[str, object], why: str) -> None:
    with pytest.raises(BadMessage, match=why):
        w.parse(signed(fields), TOKEN, NONCE, NODES, 0)


def test_not_an_object_is_refused() -> None:
    with pytest.raises(BadMessage, match="object"):
        w.parse(signed([1, 2]), TOKEN, NONCE, NODES, 0)  # type: ignore[arg-type]


def test_the_nonce_line() -> None:
    assert w.parse_nonce(f"nonce {NONCE}\n".encode()) == NONCE
    for bad in (b"nonce abc\n", b"nonce " + b"g" * 32 + b"\n", b"hello " + NONCE.encode(),
                b"nonce " + NONCE.encode() + b" more\n", b"x" * 2000):
        with pytest.raises(BadMessage):
            w.parse_nonce(bad)


# ---- decisions ----------------------------------------------------------------------------
def hub(**peers: Peer) -> Hub:
    return Hub("node1", since=100.0, after=10.0, hello_within=30.0,
               peers={"node2": Peer(), "node3": Peer(), **peers})


def test_the_master_waits_while_every_node_is_heard_of() -> None:
    h = hub(node2=Peer(seen=105.0), node3=Peer(seen=109.0))
    assert w.hub_decide(h, 114.9, (False, None)) is None


def test_a_silent_node_stops_the_run_after_unreachable_after() -> None:
    h = hub(node2=Peer(seen=115.0), node3=Peer(seen=104.0))
    v = w.hub_decide(h, 114.5, (False, None))
    assert v is not None and v.culprit == "node3"
    assert v.why.startswith("fail-fast: node3 unreachable (no word from it for 10s")


def test_every_other_node_silent_at_once_names_the_master_cut_off() -> None:
    h = hub(node2=Peer(seen=104.0), node3=Peer(seen=103.0))
    v = w.hub_decide(h, 114.5, (False, None))
    assert v is not None and v.culprit == "node1"
    assert v.why.startswith("fail-fast: node1 cut off (no word from any other node for 10s")
    h.peers["node2"] = Peer(seen=104.0, ended=True, code=0)  # one done: the other is lost
    v = w.hub_decide(h, 114.5, (False, None))
    assert v is not None and v.culprit == "node3"


def test_a_node_never_heard_of_is_lost_after_hello_within() -> None:
    h = hub(node2=Peer(seen=101.0))
    h.peers["node2"].seen = 129.0
    assert w.hub_decide(h, 129.0, (False, None)) is None
    v = w.hub_decide(h, 130.5, (False, None))
    assert v is not None and v.culprit == "node3" and "never reached" in v.why


def test_a_failed_part_stops_the_run_and_a_succeeded_one_may_be_silent() -> None:
    h = hub(node2=Peer(seen=101.0, ended=True, code=0), node3=Peer(seen=150.0))
    assert w.hub_decide(h, 155.0, (False, None)) is None  # node2 done, silent by right
    h.peers["node3"] = Peer(seen=155.0, ended=True, code=1)
    v = w.hub_decide(h, 155.0, (False, None))
    assert v is not None and v.why.startswith("fail-fast: node3 failed (exit 1")
    h.peers["node3"] = Peer(seen=155.0, ended=True, code=None)
    v = w.hub_decide(h, 155.0, (False, None))
    assert v is not None and "killed outright" in v.why


def test_the_masters_own_failure_stops_the_run() -> None:
    h = hub(node2=Peer(seen=150.0), node3=Peer(seen=150.0))
    v = w.hub_decide(h, 150.0, (True, 2))
    assert v is not None and v.culprit == "node1" and "exit 2" in v.why
    assert w.hub_decide(h, 150.0, (True, 0)) is None


def test_the_master_ends_once_every_part_has() -> None:
    h = hub(node2=Peer(seen=1.0, ended=True, code=0), node3=Peer(seen=1.0))
    assert not w.hub_done(h, True)
    h.peers["node3"].ended = True
    assert not w.hub_done(h, False)
    assert w.hub_done(h, True)


def test_a_node_that_loses_the_master() -> None:
    assert w.spoke_decide("node1", 0.0, None, 29.0, 10.0, 30.0) is None
    v = w.spoke_decide("node1", 0.0, None, 31.0, 10.0, 30.0)
    assert v is not None and v.culprit == "node1" and "never reached" in v.why
    assert w.spoke_decide("node1", 0.0, 40.0, 50.0, 10.0, 30.0) is None
    v = w.spoke_decide("node1", 0.0, 40.0, 50.5, 10.0, 30.0)
    assert v is not None and v.why.startswith("fail-fast: node1 unreachable")


def test_beats_come_four_times_within_unreachable_after() -> None:
    assert w.beat_every(10.0) == 1.0
    assert w.beat_every(2.0) == 0.5
    assert w.beat_every(0.1) == 0.1


# ---- config, port, who watches -------------------------------------------------------------
def config() -> w.Config:
    return w.Config("r1", "node2", ("node1", "node2"), "10.0.0.1", 4242, "tok", "key", 10.0, 30.0)


def test_the_config_goes_through_and_is_checked() -> None:
    assert w.parse_config(config().dumps()) == config()
    good = json.loads(config().dumps())
    for key, value in (("port", 70000), ("port", "1"), ("node", "node9"), ("nodes", []),
                       ("after", 0), ("after", True), ("token", 3)):
        with pytest.raises(ValueError):
            w.parse_config(json.dumps({**good, key: value}))
    with pytest.raises(ValueError):
        w.parse_config("[]")


def test_the_masters_port_is_the_nodes_word() -> None:
    assert watchers.parse_port("41234\n") == 41234
    for bad in ("", "0", "65536", "-1", "12 13", "x"):
        assert watchers.parse_port(bad) is None


def test_the_token_is_the_runs_and_no_stop_key() -> None:
    from fleet.run.record import stop_key

    t = watchers.token("secret", "run-1")
    assert t != watchers.token("secret", "run-2") != watchers.token("other", "run-1")
    assert t[:32] != stop_key("secret", "run-1", "watchers")


def test_status_says_who_watches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.run import record, watched
    from fleet.states import RunStatus

    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    rec = record.RunRecord("r1", "job", 0.0, (), controller=record.controller_id())
    rec.dir.mkdir(parents=True)
    said = watched.watched_by(rec, RunStatus.RUNNING)
    assert said == f"watched by: fleet up (pid {os.getpid()} on this machine)"
    assert watched.watched_by(rec, RunStatus.STOPPED) == ""
    gone = record.RunRecord("r1", "job", 0.0, (), controller="elsewhere:1:2")
    assert "nobody" in watched.watched_by(gone, RunStatus.RUNNING)
    watched.mark(gone.dir)
    assert "the nodes' own watchers (a node" in watched.watched_by(gone, RunStatus.RUNNING)
    assert "where they still run" in watched.watched_by(gone, RunStatus.UNKNOWN)
    slurm = record.RunRecord("r1", "job", 0.0, (), backend=BackendKind.SLURM)
    assert watched.watched_by(slurm, RunStatus.RUNNING) == ""
    # the same, as a word for `status --json`
    assert watched.who(rec, RunStatus.RUNNING) == "fleet_up"
    assert watched.who(gone, RunStatus.RUNNING) == "nodes"
    assert watched.who(rec, RunStatus.STOPPED) == watched.who(slurm, RunStatus.RUNNING) == ""
    nobody = record.RunRecord("r2", "job", 0.0, (), controller="elsewhere:1:2")
    nobody.dir.mkdir(parents=True)
    assert watched.who(nobody, RunStatus.RUNNING) == "nobody"


def test_status_json_says_who_watches_a_run_that_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.lifecycle.answers import Looked, status_object
    from fleet.run import record, watched
    from fleet.states import RunStatus

    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    rec = record.RunRecord("r1", "job", 0.0, (), controller="elsewhere:1:2")
    rec.dir.mkdir(parents=True)
    watched.mark(rec.dir)
    out = status_object(Looked(rec, [rec], None, None, RunStatus.RUNNING, [], [], []))
    assert out["watched_by"]["who"] == "nodes"
    assert out["watched_by"]["words"].startswith("the nodes' own watchers")
    over = status_object(Looked(rec, [rec], None, None, RunStatus.SUCCEEDED, [], [], []))
    assert "watched_by" not in over  # over: nobody need watch
