"""The queue's rules, for its node program (fleet/nodeside/queue.py: the runner that places
queued runs, the agents that start them on each host) and for the laptop that reads what the
runner wrote: the signed messages between runner and agents, parsed as untrusted input; a
queued run's spec as the laptop wrote it; where runs go (all or nothing, by priority, longest
expected first); the GPUs a host has free, from nvidia-smi; a run's last metric values."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from fleet.nodeside.shared.watch_rules import BadMessage, sign, signed_object

QUEUE_LINE = 16384  # bytes of one message, its newline included: a longer line ends the link
MAX_GPUS = 256  # GPUs of one host the queue places on
QUEUE_WHY = 300  # characters of a reason
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")
# The words of a queued run's state, as the runner writes them and the laptop reads them.
QUEUED, RUNNING, SUCCEEDED, FAILED, LOST, Q_STOPPED = (
    "queued", "running", "succeeded", "failed", "lost", "stopped")
STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, LOST, Q_STOPPED)
ENDED = (SUCCEEDED, FAILED, LOST, Q_STOPPED)
# What each side may say, and the fields each kind carries.
FROM_AGENT = {"hello": {"host", "gpus", "free", "held", "running", "smi"},
              "beat": {"gpus", "free", "held", "running", "smi"},
              "started": {"run", "gpus", "at"},
              "refused": {"run", "why"},
              "ended": {"run", "code", "started", "ended", "metrics", "stopped"}}
FROM_RUNNER = {"start": {"run", "gpus"}, "stop": {"run", "why"}, "ack": {"run"}, "bye": set()}


BadWord = BadMessage  # a line that is no message of this queue: its link is dropped


def encode_word(token: bytes, nonce: str, kind: str, seq: int, fields: dict[str, object]) -> bytes:
    """One line: `<hmac> <json>`, the hmac over the receiver's nonce and the json."""
    body = json.dumps({"k": kind, "s": seq, **fields}, separators=(",", ":"), sort_keys=True)
    line = f"{sign(token, nonce, body)} {body}\n".encode()
    if len(line) > QUEUE_LINE:
        raise ValueError("a queue message longer than QUEUE_LINE")
    return line


def decode_word(line: bytes, token: bytes, nonce: str, after: int,
                kinds: dict[str, set[str]]) -> tuple[str, int, dict[str, object]]:
    """(kind, number, fields) of a signed line, checked: at most QUEUE_LINE bytes, signed over
    this side's `nonce`, a JSON object of exactly its kind's fields, numbered above `after` (no
    replay within a link). The fields' values are checked by the functions below. BadWord
    otherwise."""
    got = signed_object(line, token, nonce, QUEUE_LINE)
    kind, seq = got.pop("k", None), got.pop("s", None)
    if not isinstance(kind, str) or kind not in kinds or set(got) != kinds[kind]:
        raise BadWord("not a message's fields")
    if type(seq) is not int or seq <= after or seq >= 1 << 53:
        raise BadWord("out of order")
    return kind, seq, got


def gpu_list(value: object, within: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """GPU indices, sorted, once each (and among `within`); BadWord otherwise."""
    if not isinstance(value, list) or len(value) > MAX_GPUS or not all(
            type(v) is int and 0 <= v < 1 << 16 for v in value) or len(set(value)) != len(value):
        raise BadWord("not a list of GPUs")
    if within is not None and not set(value) <= set(within):
        raise BadWord("a GPU the host does not have")
    return tuple(sorted(value))


def words(value: object, most: int = QUEUE_WHY) -> str:
    """Printable text of at most `most` characters; BadWord otherwise."""
    if not isinstance(value, str) or len(value) > most or not all(c.isprintable() for c in value):
        raise BadWord("not printable words")
    return value


def run_id(value: object) -> str:
    if not isinstance(value, str) or not RUN_ID.match(value):
        raise BadWord("not a run id")
    return value


def when(value: object) -> float:
    """A time (seconds since the epoch, the host's clock)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 <= value < 1e11):
        raise BadWord("not a time")
    return float(value)


def exit_code(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < 256:
        raise BadWord("not an exit code")
    return value


def metric_values(value: object) -> dict[str, float]:
    if not isinstance(value, dict) or len(value) > 16:
        raise BadWord("not metrics")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not METRIC.match(k) or isinstance(v, bool) or not isinstance(
                v, (int, float)) or not math.isfinite(v):
            raise BadWord("not a metric's value")
        out[k] = float(v)
    return out


def held_gpus(value: object, within: tuple[int, ...]) -> dict[int, str]:
    """Why a host's GPUs are not free (its agent's words), by GPU."""
    if not isinstance(value, dict) or len(value) > MAX_GPUS:
        raise BadWord("not the GPUs held")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k.isdigit() or int(k) not in within:
            raise BadWord("a GPU the host does not have")
        out[int(k)] = words(v)
    return out


def running_runs(value: object, within: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    if not isinstance(value, dict) or len(value) > MAX_GPUS + 1:
        raise BadWord("not the runs running")
    return {run_id(k): gpu_list(v, within) for k, v in value.items()}


# ---- a queued run, as the laptop staged it ------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """One queued run: its id, its sweep's, the GPUs it needs on one host (0: the whole host,
    whatever it has), its priority (higher first), the time it is expected to take (None:
    unknown), when it was submitted, how many attempts it may have (a lost host's run starts
    again where the job has [restart]), the hosts it may run on (those it was staged on), and
    the job's [metrics] patterns."""

    run: str
    sweep: str
    gpus: int
    priority: int
    expect: float | None
    submitted: float
    attempts: int
    hosts: tuple[str, ...]
    metrics: dict[str, str] = field(default_factory=dict)


def parse_spec(text: str) -> Spec:
    """A spec file's JSON, checked (ValueError otherwise)."""
    got = json.loads(text)
    if not isinstance(got, dict):
        raise ValueError("not an object")
    try:
        hosts = got["hosts"]
        if not isinstance(hosts, list) or not hosts or not all(
                isinstance(h, str) and HOST.match(h) for h in hosts):
            raise ValueError("bad hosts")
        gpus, priority, attempts = got["gpus"], got["priority"], got["attempts"]
        if type(gpus) is not int or not 0 <= gpus <= MAX_GPUS:
            raise ValueError("bad gpus")
        if type(priority) is not int or abs(priority) > 1000:
            raise ValueError("bad priority")
        if type(attempts) is not int or not 1 <= attempts <= 101:
            raise ValueError("bad attempts")
        expect = got["expect"]
        metrics = got["metrics"]
        if not isinstance(metrics, dict) or len(metrics) > 16 or not all(
                isinstance(k, str) and METRIC.match(k) and isinstance(v, str) and len(v) <= 300
                for k, v in metrics.items()):
            raise ValueError("bad metrics")
        return Spec(run=run_id(got["run"]), sweep=run_id(got["sweep"]), gpus=gpus,
                    priority=priority, expect=None if expect is None else when(expect),
                    submitted=when(got["submitted"]), attempts=attempts, hosts=tuple(hosts),
                    metrics=dict(metrics))
    except (KeyError, BadWord) as e:
        raise ValueError(f"not a queued run: {e}") from e


def spec_json(s: Spec) -> str:
    return json.dumps({"run": s.run, "sweep": s.sweep, "gpus": s.gpus, "priority": s.priority,
                       "expect": s.expect, "submitted": s.submitted, "attempts": s.attempts,
                       "hosts": list(s.hosts), "metrics": s.metrics}, sort_keys=True)


# ---- where runs go ------------------------------------------------------------------------
@dataclass
class Slots:
    """One host's agent as the runner knows it: its GPUs, those free now, and why the others
    are not (another user's process or lease, a run of the queue)."""

    gpus: tuple[int, ...]
    free: set[int]
    held: dict[int, str] = field(default_factory=dict)
    whole: bool = False  # a run of the whole host is on it: nothing else goes there
    busy: dict[int, float] = field(default_factory=dict)  # GPU -> its run's time left, expected


def order(specs: list[Spec]) -> list[Spec]:
    """The queue's order: higher priority first; then longer expected first (packing: the
    longest runs start early, the short ones fill the gaps at the end), unknown lengths after
    known ones; then submit order."""
    return sorted(specs, key=lambda s: (-s.priority, s.expect is None, -(s.expect or 0.0),
                                        s.submitted, s.run))


def fits(spec: Spec, slots: Slots) -> tuple[int, ...] | None:
    """The GPUs this host would give the run (its lowest free ones), or None."""
    if slots.whole:
        return None
    if spec.gpus == 0:  # the whole host: every GPU free, no run of the queue on it
        return slots.gpus if slots.free == set(slots.gpus) else None
    if len(slots.free) < spec.gpus:
        return None
    return tuple(sorted(slots.free)[:spec.gpus])


def place(specs: list[Spec], agents: dict[str, Slots], host_order: list[str]
          ) -> list[tuple[Spec, str, tuple[int, ...]]]:
    """Where the waiting runs start now: in the queue's order, each on the host with the fewest
    free GPUs that still fits it (so that runs needing many GPUs find a host empty), ties in
    the inventory's order. The first run that fits nowhere keeps a host for itself (the one
    with the most GPUs free of those it could ever fit on): runs behind it in the queue may
    start on other hosts only, so that priority holds and a big run is not starved by small
    ones. The GPUs given are taken out of `agents`."""
    out = []
    kept: str | None = None
    for spec in order(specs):
        best = None
        for host in host_order:
            slots = agents.get(host)
            if slots is None or host not in spec.hosts or host == kept:
                continue
            got = fits(spec, slots)
            if got is not None and (best is None or len(slots.free) < len(agents[best[0]].free)):
                best = (host, got)
        if best is None:
            if kept is None:
                kept = _keep(spec, agents, host_order)
            continue
        host, got = best
        agents[host].free -= set(got)
        if spec.gpus == 0:
            agents[host].whole = True
        out.append((spec, host, got))
    return out


def _keep(spec: Spec, agents: dict[str, Slots], host_order: list[str]) -> str | None:
    """The host a run that fits nowhere now waits for: of those it could fit on once free, the
    one with the most GPUs free."""
    could = [h for h in host_order if h in spec.hosts and h in agents
             and len(agents[h].gpus) >= spec.gpus]
    return max(could, key=lambda h: len(agents[h].free), default=None)


def waiting_why(spec: Spec, agents: dict[str, Slots]) -> str:
    """Why a queued run waits, in a few words: what it needs and what each host has."""
    need = "a whole host" if spec.gpus == 0 else f"{spec.gpus} free GPU(s) on one host"
    seen = []
    for host in spec.hosts:
        slots = agents.get(host)
        if slots is None:
            seen.append(f"{host}: no agent yet")
            continue
        held = sorted({w for w in slots.held.values()})
        seen.append(f"{host}: {len(slots.free)} free" + (f" ({'; '.join(held)[:120]})"
                                                         if held else ""))
    return f"waits for {need}: " + ", ".join(seen)


# ---- what a host has ----------------------------------------------------------------------
def parse_smi(gpus_out: str, apps_out: str) -> tuple[tuple[int, ...], dict[str, int],
                                                     list[tuple[str, int]]]:
    """nvidia-smi's `--query-gpu=index,uuid` and `--query-compute-apps=gpu_uuid,pid` (csv,
    noheader): the GPUs' indices, index by uuid, and (uuid, pid) per compute process. Lines
    that are not one are skipped."""
    by_uuid: dict[str, int] = {}
    for line in gpus_out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) < 1 << 16 and parts[1]:
            by_uuid[parts[1]] = int(parts[0])
    apps = []
    for line in apps_out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[1].isdigit():
            apps.append((parts[0], int(parts[1])))
    return tuple(sorted(set(by_uuid.values()))), by_uuid, apps


def last_metrics(text: str, patterns: dict[str, str]) -> dict[str, float]:
    """Each [metrics] pattern's last value in a log's text (those that match a number)."""
    out = {}
    for name, pattern in patterns.items():
        try:
            found = list(re.finditer(pattern, text))
        except re.error:
            continue
        for m in reversed(found):
            try:
                value = float(m.group("v"))
            except (IndexError, TypeError, ValueError):
                continue
            if math.isfinite(value):
                out[name] = value
                break
    return out
