"""The queue's rules (fleet/nodeside/shared/queue_rules.py): signed messages parsed as untrusted
input, a spec as the laptop writes it, where runs go (all or nothing, by priority, longest
expected first, best fit), what a host has free, a run's last metric values; and the runner's
decisions (fleet/nodeside/queue_runner.py) driven with links that record what they were told."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleet.nodeside import queue_runner
from fleet.nodeside.shared.queue_rules import (
    FROM_AGENT,
    QUEUE_LINE,
    BadWord,
    Slots,
    Spec,
    decode_word,
    encode_word,
    last_metrics,
    order,
    parse_smi,
    parse_spec,
    place,
    spec_json,
    waiting_why,
)

TOKEN, NONCE = b"k" * 64, "ab" * 16


def spec(run: str, gpus: int = 1, priority: int = 0, expect: float | None = None,
         submitted: float = 1.0, hosts: tuple[str, ...] = ("a", "b"), attempts: int = 1) -> Spec:
    return Spec(run, "sw", gpus, priority, expect, submitted, attempts, hosts, {})


# ---- messages -----------------------------------------------------------------------------
def test_a_signed_message_reads_back_and_anything_else_is_refused() -> None:
    line = encode_word(TOKEN, NONCE, "started", 3, {"run": "r-1", "gpus": [0], "at": 5.0})
    assert decode_word(line, TOKEN, NONCE, 2, FROM_AGENT) == (
        "started", 3, {"run": "r-1", "gpus": [0], "at": 5.0})
    with pytest.raises(BadWord, match="out of order"):
        decode_word(line, TOKEN, NONCE, 3, FROM_AGENT)  # a replay within the link
    with pytest.raises(BadWord, match="signature"):
        decode_word(line, b"x" * 64, NONCE, 0, FROM_AGENT)  # another queue's key
    with pytest.raises(BadWord, match="signature"):
        decode_word(line, TOKEN, "cd" * 16, 0, FROM_AGENT)  # signed for another link
    forged = line.replace(b'"r-1"', b'"r-2"')
    with pytest.raises(BadWord, match="signature"):
        decode_word(forged, TOKEN, NONCE, 0, FROM_AGENT)
    extra = encode_word(TOKEN, NONCE, "started", 4, {"run": "r", "gpus": [], "at": 1, "x": 1})
    with pytest.raises(BadWord, match="fields"):
        decode_word(extra, TOKEN, NONCE, 0, FROM_AGENT)
    unknown = encode_word(TOKEN, NONCE, "start", 4, {"run": "r", "gpus": []})
    with pytest.raises(BadWord, match="fields"):
        decode_word(unknown, TOKEN, NONCE, 0, FROM_AGENT)  # the runner's word, from an agent
    with pytest.raises(BadWord, match="too long"):
        decode_word(b"x" * QUEUE_LINE + b"\n", TOKEN, NONCE, 0, FROM_AGENT)


# ---- specs --------------------------------------------------------------------------------
def test_a_spec_round_trips_and_a_hostile_one_is_refused() -> None:
    s = Spec("sw-1", "sw", 2, 5, 30.0, 1.5, 2, ("node1", "node2"), {"loss": "loss (?P<v>.+)"})
    assert parse_spec(spec_json(s)) == s
    good = json.loads(spec_json(s))
    for key, bad in [("run", "../etc"), ("run", "a b"), ("gpus", -1), ("gpus", True),
                     ("hosts", []), ("hosts", ["a;rm"]), ("priority", 10**6),
                     ("attempts", 0), ("expect", "soon"), ("metrics", {"a b": "x"})]:
        with pytest.raises(ValueError):
            parse_spec(json.dumps({**good, key: bad}))
    with pytest.raises(ValueError):
        parse_spec(json.dumps({k: v for k, v in good.items() if k != "hosts"}))


# ---- placement ----------------------------------------------------------------------------
def test_order_is_priority_then_longest_expected_then_submit_order() -> None:
    runs = [spec("late", submitted=3), spec("short", expect=10), spec("long", expect=40),
            spec("urgent", priority=1, submitted=9), spec("early", submitted=2)]
    assert [s.run for s in order(runs)] == ["urgent", "long", "short", "early", "late"]


def test_place_is_all_or_nothing_and_fills_the_fullest_host_that_fits() -> None:
    agents = {"a": Slots((0, 1, 2, 3), {0, 1, 2, 3}), "b": Slots((0, 1), {1})}
    got = place([spec("two", gpus=2, submitted=1), spec("one", submitted=2),
                 spec("three", gpus=3, submitted=3)], agents, ["a", "b"])
    # the 1-GPU run takes b's last GPU (best fit), the 2-GPU run two of a's; the 3-GPU run
    # cannot have the 2 left on a: it starts nowhere, holding nothing
    assert [(s.run, h, g) for s, h, g in got] == [("two", "a", (0, 1)), ("one", "b", (1,))]
    assert agents["a"].free == {2, 3} and agents["b"].free == set()


def test_a_lower_priority_run_only_takes_what_the_higher_ones_leave() -> None:
    agents = {"a": Slots((0, 1), {0, 1})}
    got = place([spec("low", priority=-1), spec("high", gpus=2, priority=5)], agents, ["a"])
    assert [s.run for s, _, _ in got] == ["high"]


def test_a_whole_host_run_needs_every_gpu_free_and_keeps_the_host() -> None:
    agents = {"a": Slots((0, 1), {0, 1}), "b": Slots((0, 1), {0})}
    got = place([spec("whole", gpus=0, submitted=1), spec("one", submitted=2)], agents,
                ["a", "b"])
    assert [(s.run, h, g) for s, h, g in got] == [("whole", "a", (0, 1)), ("one", "b", (0,))]
    cpu = {"c": Slots((), set())}
    assert [h for _, h, _ in place([spec("w1", gpus=0, hosts=("c",)),
                                    spec("w2", gpus=0, hosts=("c",))], cpu, ["c"])] == ["c"]


def test_a_run_waits_with_the_words_of_why() -> None:
    agents = {"a": Slots((0, 1), {1}, {0: "a lease of alice until 99"})}
    why = waiting_why(spec("r", gpus=2, hosts=("a", "b")), agents)
    assert why == ("waits for 2 free GPU(s) on one host: a: 1 free (a lease of alice until 99),"
                   " b: no agent yet")


# ---- a host's GPUs, a run's metrics ---------------------------------------------------------
def test_parse_smi_maps_processes_to_indices_and_skips_junk() -> None:
    gpus, by_uuid, apps = parse_smi("0, GPU-a\n1, GPU-b\nNo devices were found\n",
                                    "GPU-b, 4242\n[N/A], x\nGPU-a, 77\n")
    assert gpus == (0, 1) and by_uuid == {"GPU-a": 0, "GPU-b": 1}
    assert apps == [("GPU-b", 4242), ("GPU-a", 77)]


def test_last_metrics_takes_each_patterns_last_number() -> None:
    text = "loss 0.9\nacc 0.5\nloss 0.3\nloss nan-ish\n"
    assert last_metrics(text, {"loss": r"loss (?P<v>[0-9.]+)", "acc": r"acc (?P<v>[0-9.]+)",
                               "none": r"x (?P<v>\d+)"}) == {"loss": 0.3, "acc": 0.5}


# ---- the runner's decisions -----------------------------------------------------------------
class FakeLink:
    def __init__(self) -> None:
        self.told: list[tuple[str, dict[str, Any]]] = []
        self.host = ""
        self.closed = False
        self.opened = 0.0

    def send(self, kind: str, **fields: Any) -> bool:
        self.told.append((kind, fields))
        return True

    def close(self) -> None:
        self.closed = True


def runner_with(tmp_path: Any, specs: list[Spec]) -> queue_runner.Runner:
    (tmp_path / "jobs").mkdir()
    for s in specs:
        (tmp_path / "jobs" / f"{s.run}.json").write_text(spec_json(s))
    r = queue_runner.Runner(str(tmp_path), TOKEN)
    r.scan()
    return r


def hello(r: queue_runner.Runner, link: FakeLink, host: str, free: list[int]) -> None:
    r.heard(link, "hello", {"host": host, "gpus": [0, 1], "free": free, "held": {},
                            "running": {}, "smi": "ok"})  # type: ignore[arg-type]


def test_the_runner_starts_what_fits_and_records_the_end(tmp_path: Any) -> None:
    r = runner_with(tmp_path, [spec("sw-1", hosts=("a",)), spec("sw-2", hosts=("a",)),
                               spec("sw-3", hosts=("a",))])
    link = FakeLink()
    hello(r, link, "a", [0, 1])
    r.schedule()
    assert [(k, f["run"], f["gpus"]) for k, f in link.told] == [
        ("start", "sw-1", [0]), ("start", "sw-2", [1])]
    assert r.runs["sw-3"]["why"].startswith("waits for 1 free GPU(s) on one host: a: 0 free")
    r.heard(link, "started", {"run": "sw-1", "gpus": [0], "at": 10.0})  # type: ignore[arg-type]
    r.heard(link, "ended", {"run": "sw-1", "code": 0, "started": 10.0, "ended": 20.0,
                            "metrics": {"loss": 0.5}, "stopped": False})  # type: ignore[arg-type]
    assert r.runs["sw-1"]["state"] == "succeeded" and r.runs["sw-1"]["metrics"] == {"loss": 0.5}
    assert link.told[-1] == ("ack", {"run": "sw-1"})
    r.schedule()
    assert link.told[-1] == ("start", {"run": "sw-3", "gpus": [0]})
    # an agent's word about a run it was not told to start changes nothing
    other = FakeLink()
    hello(r, other, "b", [0])
    r.heard(other, "ended", {"run": "sw-2", "code": 1, "started": 1.0, "ended": 2.0,
                             "metrics": {}, "stopped": False})  # type: ignore[arg-type]
    assert r.runs["sw-2"]["state"] == "running"
    with pytest.raises(BadWord):  # a GPU the host does not have
        r.heard(link, "started", {"run": "sw-2", "gpus": [7], "at": 1.0})  # type: ignore[arg-type]


def test_a_refused_start_goes_back_in_the_queue(tmp_path: Any) -> None:
    r = runner_with(tmp_path, [spec("sw-1", hosts=("a",))])
    link = FakeLink()
    hello(r, link, "a", [0])
    r.schedule()
    r.heard(link, "refused", {"run": "sw-1", "why": "a lease of alice until 9"})  # type: ignore[arg-type]
    assert r.runs["sw-1"]["state"] == "queued" and r.runs["sw-1"]["host"] == ""


@pytest.mark.parametrize(("attempts", "state", "attempt"), [(1, "lost", 1), (2, "queued", 2)])
def test_a_lost_host_loses_its_runs_or_queues_them_again(tmp_path: Any, attempts: int,
                                                         state: str, attempt: int) -> None:
    r = runner_with(tmp_path, [spec("sw-1", hosts=("a", "b"), attempts=attempts)])
    link = FakeLink()
    hello(r, link, "a", [0, 1])
    r.schedule()
    r.heard(link, "started", {"run": "sw-1", "gpus": [0], "at": 10.0})  # type: ignore[arg-type]
    r.born -= 100
    r.lose(r.agents["a"]["seen"] + queue_runner.LOST_S + 1)
    assert link.closed and "a" not in r.agents
    assert (r.runs["sw-1"]["state"], r.runs["sw-1"]["attempt"]) == (state, attempt)
    assert r.runs["sw-1"]["lost"] == ["a"]
    assert "a was lost" in r.runs["sw-1"]["why"]


def test_a_cancel_stops_what_waits_and_tells_the_agent_what_runs(tmp_path: Any) -> None:
    r = runner_with(tmp_path, [spec("sw-1", hosts=("a",)), spec("sw-2", hosts=("a",))])
    link = FakeLink()
    hello(r, link, "a", [0])
    r.schedule()
    (tmp_path / "cancel").mkdir()
    (tmp_path / "cancel" / "sw").write_text("")
    r.scan()
    assert r.runs["sw-2"]["state"] == "stopped"
    assert link.told[-1] == ("stop", {"run": "sw-1", "why": "fleet sweep stop"})
    r.heard(link, "ended", {"run": "sw-1", "code": 143, "started": 1.0, "ended": 2.0,
                            "metrics": {}, "stopped": False})  # type: ignore[arg-type]
    assert r.runs["sw-1"]["state"] == "stopped"
    assert not r.active()


def test_a_run_its_own_stop_ended_is_stopped_not_failed(tmp_path: Any) -> None:
    """`fleet stop RUN` on a queued run: its stop.sh ran on the host (the agent saw its mark),
    so its 143 is a stop, not a failure; a 143 without that mark is a failure."""
    r = runner_with(tmp_path, [spec("sw-1", hosts=("a",)), spec("sw-2", hosts=("a",))])
    link = FakeLink()
    hello(r, link, "a", [0, 1])
    r.schedule()
    for run, stopped in (("sw-1", True), ("sw-2", "yes")):  # a non-bool is no stop
        r.heard(link, "started", {"run": run, "gpus": [0], "at": 1.0})  # type: ignore[arg-type]
        r.heard(link, "ended", {"run": run, "code": 143, "started": 1.0, "ended": 2.0,
                                "metrics": {}, "stopped": stopped})  # type: ignore[arg-type]
    assert (r.runs["sw-1"]["state"], r.runs["sw-2"]["state"]) == ("stopped", "failed")
    assert r.runs["sw-1"]["code"] == 143


def test_the_first_run_that_fits_nowhere_keeps_a_host_from_those_behind_it() -> None:
    agents = {"a": Slots((0, 1), {1}), "b": Slots((0, 1), {0})}
    got = place([spec("big", gpus=2, priority=5), spec("small", priority=0, submitted=2),
                 spec("small2", priority=0, submitted=3)], agents, ["a", "b"])
    # big fits nowhere and keeps a (the first with the most free); the small runs take b only
    assert [(s.run, h) for s, h, _ in got] == [("small", "b")]


def test_a_slow_host_taken_for_lost_gets_its_run_back_and_a_start_never_confirmed_requeues(
        tmp_path: Any) -> None:
    r = runner_with(tmp_path, [spec("sw-1", hosts=("a",), attempts=2),
                               spec("sw-2", hosts=("a",))])
    link = FakeLink()
    hello(r, link, "a", [0, 1])
    r.schedule()
    r.heard(link, "started", {"run": "sw-1", "gpus": [0], "at": 10.0})  # type: ignore[arg-type]
    # sw-2 was told to start and its agent never said: after START_S it waits again
    r.runs["sw-2"]["sent"] -= queue_runner.START_S + 1
    r.heard(link, "beat", {"gpus": [0, 1], "free": [1], "held": {}, "running": {"sw-1": [0]},
                           "smi": "ok"})  # type: ignore[arg-type]
    assert r.runs["sw-2"]["state"] == "queued"
    r.born -= 100
    r.lose(r.agents["a"]["seen"] + queue_runner.LOST_S + 1)
    assert r.runs["sw-1"]["state"] == "queued" and r.runs["sw-1"]["attempt"] == 2
    again = FakeLink()
    r.heard(again, "hello", {"host": "a", "gpus": [0, 1], "free": [1], "held": {},
                             "running": {"sw-1": [0]}, "smi": "ok"})  # type: ignore[arg-type]
    assert (r.runs["sw-1"]["state"], r.runs["sw-1"]["attempt"]) == ("running", 1)


def test_a_host_whose_nvidia_smi_failed_gets_nothing(tmp_path: Any) -> None:
    r = runner_with(tmp_path, [spec("sw-1", gpus=0, hosts=("a",))])
    link = FakeLink()
    r.heard(link, "hello", {"host": "a", "gpus": [], "free": [], "held": {}, "running": {},
                            "smi": "failed"})  # type: ignore[arg-type]
    r.schedule()
    assert link.told == [] and r.runs["sw-1"]["state"] == "queued"


def test_a_run_missing_from_one_report_is_not_gone_three_in_a_row_is(tmp_path: Any) -> None:
    r = runner_with(tmp_path, [spec("sw-1", hosts=("a",))])
    link = FakeLink()
    hello(r, link, "a", [0, 1])
    r.schedule()
    r.heard(link, "started", {"run": "sw-1", "gpus": [0], "at": 10.0})  # type: ignore[arg-type]
    beat = {"gpus": [0, 1], "free": [1], "held": {}, "running": {}, "smi": "ok"}
    for _ in range(2):  # its end is on its way behind a beat that no longer lists it
        r.heard(link, "beat", beat)  # type: ignore[arg-type]
    assert r.runs["sw-1"]["state"] == "running"
    r.heard(link, "beat", beat)  # type: ignore[arg-type]
    assert r.runs["sw-1"]["state"] == "lost"
    assert r.runs["sw-1"]["why"] == "a's agent no longer knows it"
