"""The queue as its runner last wrote it on the queue's host (fleet/nodeside/queue_runner.py):
one command (the runner's state.json and whether its process lives) and a pure parser that
takes only what fleet can check: runs it knows by id, hosts of the inventory, GPUs as numbers,
states it knows, times as numbers. Whatever else the file says is dropped, never obeyed."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from fleet.nodeside.shared.queue_rules import ENDED, HOST, METRIC, QUEUED, RUN_ID, STATES

MAX_STATE = 8 << 20  # bytes of state.json read
QUEUE_WHY = 300


@dataclass(frozen=True)
class QueuedRun:
    """One run of a sweep: its parameters, what it needs, and its state as fleet last saw it
    (host, GPUs, times on the host's clock, exit code, the last value of each [metrics])."""

    run_id: str
    params: dict[str, str] = field(default_factory=dict)
    gpus: int = 1  # GPUs it needs on one host; 0: a whole host
    priority: int = 0
    expect_s: float | None = None
    state: str = QUEUED
    host: str = ""
    gpu_ids: tuple[int, ...] = ()
    user: str = ""  # the account it ran as on the host
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    attempt: int = 1
    metrics: dict[str, float] = field(default_factory=dict)
    why: str = ""
    seen: float = 0.0  # when fleet last saw its state

    @property
    def ended_state(self) -> bool:
        return self.state in ENDED

    @property
    def gpu_hours(self) -> float:
        """GPU-hours it held (whole-host runs count the GPUs they were given, at least 1)."""
        if self.started is None:
            return 0.0
        end = self.ended if self.ended is not None else self.seen or time.time()
        return max(0.0, end - self.started) * max(1, len(self.gpu_ids)) / 3600


def look_script(qdir: str) -> str:
    """sh text: `alive` or `gone` (the runner's pid from runner.json is this user's runner of
    this queue, alive), then `===`, then state.json (at most MAX_STATE bytes)."""
    from fleet.shell import quote

    q = quote(qdir)
    return "\n".join([
        f"pid=$(sed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p' {q}/runner.json 2>/dev/null)",
        'if [ -n "$pid" ] && [ -O "/proc/$pid" ] && tr "\\0" " " < "/proc/$pid/cmdline" '
        f'2>/dev/null | grep -qF {quote(qdir + "/queue_runner.py")}; then echo alive; '
        "else echo gone; fi",
        "echo ===",
        f"head -c {MAX_STATE} {q}/state.json 2>/dev/null",
        "exit 0"])


@dataclass(frozen=True)
class AgentSeen:
    host: str
    seen: float
    gpus: tuple[int, ...]
    free: tuple[int, ...]
    held: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueLook:
    """The runner alive or not, when it wrote (its host's clock), its agents, and the runs."""

    alive: bool
    now: float | None = None
    agents: dict[str, AgentSeen] = field(default_factory=dict)
    runs: dict[str, QueuedRun] = field(default_factory=dict)
    damaged: str = ""  # why the state could not be read, where it could not


def _time(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v) if 0 <= v < 1e11 else None


def _gpus(v: object) -> tuple[int, ...]:
    if not isinstance(v, list):
        return ()
    return tuple(sorted({x for x in v if type(x) is int and 0 <= x < 1 << 16}))[:256]


def _text(v: object) -> str:
    return "".join(c for c in v if c.isprintable())[:QUEUE_WHY] if isinstance(v, str) else ""


def _metrics(v: object) -> dict[str, float]:
    """A run's metric values: names of a metric's shape, finite numbers, 16 at most."""
    if not isinstance(v, dict):
        return {}
    return {k: float(x) for k, x in list(v.items())[:16]
            if isinstance(k, str) and METRIC.match(k) and not isinstance(x, bool)
            and isinstance(x, (int, float)) and math.isfinite(x)}


def parse_look(out: str, hosts: set[str], user: str = "") -> QueueLook:
    """The look's output, checked against the inventory's `hosts`: runs with a run id's shape
    (the caller keeps those it queued), each with a known state, a host of the inventory or
    none."""
    head, _, body = out.partition("===\n")
    alive = head.strip().splitlines()[-1:] == ["alive"] if head.strip() else False
    if not body.strip():
        return QueueLook(alive)
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError as e:
        return QueueLook(alive, damaged=f"the queue's state.json is not JSON: {e}")
    agents = {}
    listed = data.get("agents")
    for host, a in listed.items() if isinstance(listed, dict) else []:
        if host in hosts and isinstance(a, dict) and (seen := _time(a.get("seen"))) is not None:
            held = a.get("held")
            held = held if isinstance(held, dict) else {}
            agents[host] = AgentSeen(host, seen, _gpus(a.get("gpus")), _gpus(a.get("free")),
                                     {int(k): _text(w) for k, w in held.items()
                                      if isinstance(k, str) and k.isdigit() and len(k) < 6})
    now = _time(data.get("now"))
    runs = {}
    raw = data.get("runs")
    raw = raw if isinstance(raw, dict) else {}
    for run, r in raw.items():
        if not isinstance(run, str) or not RUN_ID.match(run) or not isinstance(r, dict):
            continue
        state, host = r.get("state"), r.get("host")
        if state not in STATES or not isinstance(host, str) or (host and (
                host not in hosts or not HOST.match(host))):
            continue
        code = r.get("code")
        attempt = r.get("attempt")
        metrics = _metrics(r.get("metrics"))
        runs[run] = QueuedRun(
            run_id=run, state=state, host=host, gpu_ids=_gpus(r.get("gpus")),
            user=user if host else "", started=_time(r.get("started")),
            ended=_time(r.get("ended")),
            exit_code=code if type(code) is int and 0 <= code < 256 else None,
            attempt=attempt if type(attempt) is int and 0 < attempt < 1000 else 1,
            metrics=metrics,
            why=_text(r.get("why")), seen=now or 0.0)
    return QueueLook(alive, now, agents, runs)
