"""How a detached run heals without the laptop (fleet.nodeside.shared.heal_rules): the `heal`
message, the master's choice between healing and failing fast, the prepared attempt in the
watcher's config, and healed.json read back as the node's word."""

from __future__ import annotations

import json

import pytest

from fleet.nodeside.shared import heal_rules as h
from fleet.nodeside.shared import watch_rules as w
from fleet.nodeside.shared.watch_rules import BadMessage, Message

TOKEN = b"t" * 64
NONCE = "ab" * 16
EVERYONE = frozenset({"node1", "node2", "node3", "spare1"})
HEAL = h.Heal(2, "r1-a2", "/home/u/fleet/runs/r1-a2/node2/heal.sh", ("spare1", "spare2"))


def test_a_heal_goes_through_as_it_was_sent() -> None:
    m = Message("heal", "node1", 3, why="healed: node3 unreachable", culprit="node3",
                spare="spare1")
    assert w.parse(w.encode(TOKEN, NONCE, m), TOKEN, NONCE, EVERYONE, 0) == m


@pytest.mark.parametrize("fields", [
    {"k": "heal", "n": "node1", "s": 1, "why": "x", "by": "node3"},  # no spare
    {"k": "heal", "n": "node1", "s": 1, "why": "x", "by": "node3", "sp": "nobody"},
    {"k": "heal", "n": "node1", "s": 1, "why": "x", "by": "node3", "sp": "node3"},
    {"k": "heal", "n": "node1", "s": 1, "why": "x", "by": "", "sp": "spare1"},
    {"k": "heal", "n": "node1", "s": 1, "why": "x", "by": "node3", "sp": 7},
    {"k": "stop", "n": "node1", "s": 1, "why": "x", "by": "node3", "sp": "spare1"},
])
def test_a_heal_without_its_nodes_is_refused(fields: dict[str, object]) -> None:
    body = json.dumps(fields, separators=(",", ":"), sort_keys=True)
    with pytest.raises(BadMessage):
        w.parse(f"{w.sign(TOKEN, NONCE, body)} {body}\n".encode(), TOKEN, NONCE, EVERYONE, 0)


def test_a_lost_node_is_healed_by_the_first_spare_heard_of() -> None:
    heard = {"spare1": None, "spare2": 95.0}
    got = h.choose("node1", "node3", True, HEAL, heard, 100.0, 10.0, 1234.5)
    assert got == h.Healing(2, "r1-a2", "node3", "spare2", "healed: node3 unreachable; "
                            "attempt 2 started with spare2 in its place (seen by the nodes' "
                            "watchers)", 1234.5)
    heard["spare1"] = 99.0
    assert h.choose("node1", "node3", True, HEAL, heard, 100.0, 10.0, 0.0).spare == "spare1"


@pytest.mark.parametrize("culprit, lost, heal, heard", [
    ("node1", True, HEAL, {"spare1": 99.0}),  # the master lost: nobody left to decide
    ("node3", False, HEAL, {"spare1": 99.0}),  # failed, not lost: fail fast
    ("node3", True, None, {"spare1": 99.0}),  # nothing prepared
    ("node3", True, HEAL, {"spare1": None}),  # no spare ever heard of
    ("node3", True, HEAL, {"spare1": 80.0}),  # the spare silent too
])
def test_otherwise_the_run_fails_fast(culprit: str, lost: bool, heal: h.Heal | None,
                                      heard: dict[str, float | None]) -> None:
    assert h.choose("node1", culprit, lost, heal, heard, 100.0, 10.0, 0.0) is None


def test_only_a_loss_is_a_lost_verdict() -> None:
    assert w.lost("node2", 4).lost and not w.failed("node2", 1).lost


def test_the_config_carries_the_prepared_attempt() -> None:
    cfg = w.Config("r1", "spare1", ("node1", "node2"), "10.0.0.1", 4242, "tok", "key", 4.0,
                   30.0, HEAL)
    back = w.parse_config(cfg.dumps())
    assert back == cfg and back.standby and not back.master
    assert back.everyone == {"node1", "node2", "spare1", "spare2"}
    plain = json.loads(cfg.dumps())
    del plain["heal"]
    with pytest.raises(ValueError, match="node not in nodes"):  # a spare needs the heal
        w.parse_config(json.dumps(plain))
    for bad in ({**HEAL.as_obj(), "attempt": 1}, {**HEAL.as_obj(), "spares": []},
                {**HEAL.as_obj(), "spares": ["a b"]}, {**HEAL.as_obj(), "x": 1},
                {**HEAL.as_obj(), "script": ""}):
        with pytest.raises(ValueError, match="heal"):
            w.parse_config(json.dumps({**plain, "heal": bad}))


GOOD = h.Healing(2, "r1-a2", "node3", "spare1", "healed: node3 unreachable", 1700000000.5)


def test_healed_json_goes_through() -> None:
    text = h.dumps_healed(GOOD)
    assert h.parse_healed(text, "r1", ("node1", "node2", "node3"), ("spare1",)) == GOOD


@pytest.mark.parametrize("change", [
    {"run": "r2-a2"}, {"attempt": 1, "run": "r1-a1"}, {"attempt": True}, {"lost": "node1"},
    {"lost": "node9"}, {"spare": "node2"}, {"why": "a\nb"}, {"why": "x" * 301},
    {"at": "now"}, {"at": float("inf")}, {"extra": 1},
])
def test_healed_json_is_the_nodes_word(change: dict[str, object]) -> None:
    got = {**json.loads(h.dumps_healed(GOOD)), **change}
    with pytest.raises(ValueError):
        h.parse_healed(json.dumps(got), "r1", ("node1", "node2", "node3"), ("spare1",))
    for text in ("[]", "{", "x" * 3000):
        with pytest.raises(ValueError):
            h.parse_healed(text, "r1", ("node1", "node2", "node3"), ("spare1",))


def test_a_fail_fast_stop_says_why_it_was_not_healed() -> None:
    why = "fail-fast: node1 unreachable (no word from it for 4s)"
    assert h.unhealed(why, "node1", True, "node1", HEAL) == \
        why + "; not healed: the master was lost"
    assert h.unhealed(why, "node3", True, "node1", HEAL) == \
        why + "; not healed: no standby spare answered"
    assert h.unhealed(why, "node3", False, "node1", HEAL) == why  # failed: never healed
    assert h.unhealed(why, "node1", True, "node1", None) == why  # nothing prepared
