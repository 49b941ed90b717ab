"""A transfer that ends early hears its nodes out before its verdict (fleet/transport/transfer/
relay.py): a node that could not pass the data on lets the nodes after it in its chain say why
(one of them found what reached it altered), a tamper finder lets the nodes before it finish
their look, each at most TAMPER_GRACE_S; closing every receiver sooner loses their words, and a
tampering relay was once reported as "the transfer broke: Socket is closed"."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from fleet.transport.transfer import relay


def transfer(chain: list[str]) -> relay.Transfer:
    targets = [cast(Any, relay.Target)(n, None, "python3", "10.0.0.1", ()) for n in chain]
    t = relay.Transfer(targets, [], cast(Any, None))
    t.routes = [chain]
    return t


def lost_in_thread(t: relay.Transfer, name: str) -> threading.Thread:
    th = threading.Thread(target=t._lost, args=(name,), daemon=True)
    th.start()
    return th


def say(t: relay.Transfer, name: str, **facts: Any) -> None:
    with t.changed:
        for k, v in facts.items():
            setattr(t.states[name], k, v)
        t.changed.notify_all()


def test_a_node_that_could_not_pass_data_on_waits_for_those_after_it() -> None:
    t = transfer(["a", "b", "c"])
    say(t, "a", error={"msg": "passing the data on failed", "relay": "out"}, ended=True)
    th = lost_in_thread(t, "a")
    th.join(0.3)
    assert th.is_alive()  # b and c have not said anything yet
    say(t, "b", error={"msg": "writers [0, 2]; fleet sent writers [0, 1, 2]", "tampered": True})
    th.join(0.3)
    assert th.is_alive()  # c neither
    say(t, "c", ended=True)
    th.join(2)
    assert not th.is_alive() and t.cause == "a"


def test_a_tamper_finder_waits_for_those_before_it_only() -> None:
    t = transfer(["a", "b", "c"])
    say(t, "b", error={"msg": "altered", "tampered": True}, ended=True)
    th = lost_in_thread(t, "b")
    th.join(0.3)
    assert th.is_alive()  # a, before it, looks at the same bytes
    say(t, "a", done=True)
    th.join(2)
    assert not th.is_alive()  # c, after it, is not waited for


def test_a_node_lost_without_a_word_ends_the_transfer_at_once() -> None:
    t = transfer(["a", "b"])
    say(t, "a", ended=True)
    th = lost_in_thread(t, "a")
    th.join(1)
    assert not th.is_alive()


def test_the_wait_is_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(relay, "TAMPER_GRACE_S", 0.3)
    t = transfer(["a", "b"])
    say(t, "a", error={"msg": "passing the data on failed", "relay": "out"})
    began = time.monotonic()
    t._lost("a")
    assert 0.25 <= time.monotonic() - began < 2
