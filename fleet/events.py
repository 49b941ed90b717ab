"""A run's lifecycle as typed events: what fleet is doing, each node's start and end, the
watchdog's clock, a restart, a transfer, a log line, the remaining human words, the verdict.
The runner and the backends emit them to one sink; a view renders them (the terminal is one:
fleet.console; JSON lines are another: fleet.run.jsonl). Pure data, no I/O.

`as_json` / `from_json` are the stable interface `fleet up --json` writes (docs/EVENTS.md):
every object carries `v` (SCHEMA) and `event` (the type's name). A field added is no change of
version; a field removed, renamed, or given another meaning is."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Protocol

from fleet.states import NodeOutcome, NodeStatus, RunStatus

SCHEMA = 1


class Step(Enum):
    """What fleet is doing now (a Phase)."""

    PREPARING = "preparing"  # connect, probe, plan, preflight, record: nothing runs yet
    SCHEDULING = "scheduling"  # the backend sends and starts the job (the steps below, or a
    #                            scheduler's submission)
    UPLOADING = "uploading"  # the job's code and files to every node
    SETUP = "setup"
    STARTING = "starting"  # the nodes' parts are being started, the master first
    RUNNING = "running"  # every node started: following the logs and the ends
    STOPPING = "stopping"
    REPORTING = "reporting"
    WAITING = "waiting"  # between two attempts ([restart])
    FOLLOWING = "following"  # `fleet logs`: reading a recorded run's logs


class Tone(Enum):
    """What a Note's words mean (the terminal colours by it)."""

    PLAIN = "plain"
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    NOTE = "note"
    NAME = "name"


@dataclass(frozen=True)
class Phase:
    """fleet moved on to another step of the run (`host` where it is one node's step)."""

    step: Step
    run_id: str = ""
    host: str = ""


@dataclass(frozen=True)
class NodeStarted:
    """A node's part was started: its wrapper's pid; `ranks` its global ranks where known
    (empty where the node decides how many: nproc_per_node = "auto")."""

    host: str
    node_rank: int
    ranks: tuple[int, ...] = ()
    pid: int | None = None
    master: bool = False


@dataclass(frozen=True)
class NodeEnded:
    """A node's part ended (or was lost: status UNREACHABLE); the runner fails fast on it."""

    outcome: NodeOutcome


@dataclass(frozen=True)
class Quiet:
    """Nothing else happened: how long no node has printed a line (the watchdog's clock; 0
    while the job cannot print yet, waiting in a queue)."""

    silent: float


@dataclass(frozen=True)
class Attempt:
    """With [restart]: attempt `number` of `of` begins in `wait` seconds, and why."""

    number: int
    of: int
    wait: float
    why: str


@dataclass(frozen=True)
class Transfer:
    """What was sent to a node (`label`: code, data...): files sent, bytes, files already
    there, seconds."""

    host: str
    label: str
    files: int
    size: int
    unchanged: int
    seconds: float


@dataclass(frozen=True)
class Line:
    """A log line of the job: its node, its global rank where the line says it, and its text
    exactly as the node wrote it (a view makes it harmless). `tag` is how the terminal tags it
    (host or host/rank), `index` the node's place in the run (its colour)."""

    host: str
    rank: int | None
    text: str
    tag: str = ""
    index: int = 0


class Ending(Enum):
    """What a node's stop still waits for (stop.sh's look, fleet.facts.stopping)."""

    TORCHRUN_WORKERS = "torchrun_workers"  # torchrun, ending its workers
    TORCHRUN = "torchrun"  # torchrun itself, its workers gone
    WORKERS = "workers"  # workers whose torchrun is gone
    WRAPPER = "wrapper"  # run.sh, recording how torchrun ended
    OTHER = "other"  # other processes of the run (the job's own children)
    # fleet's own steps of a node's stop, before stop.sh speaks (fleet.backends.hosts.node)
    CONNECTING = "connecting"  # a connection to the node
    RECORDING = "recording"  # the node's stop, recorded before any node is signalled
    SIGNALLING = "signalling"  # stop.sh, sending SIGTERM (it speaks once something is ending)


@dataclass(frozen=True)
class Stopping:
    """A stop of `total` nodes under way: `done` have ended; `host` is the node waited for
    longest, `ending` what it still waits for there, `since` seconds after its SIGTERM
    (`host` empty: none has said yet)."""

    done: int
    total: int
    host: str = ""
    ending: Ending | None = None
    since: float = 0.0
    count: int = 0  # how many processes of that kind (workers, other) are still ending


@dataclass(frozen=True)
class Note:
    """Words for a person, not yet typed: what fleet says (about `host`, where one)."""

    words: str
    tone: Tone = Tone.PLAIN
    host: str = ""


@dataclass(frozen=True)
class Verdict:
    """How the run ended: its state, fleet's exit code for it, each node's outcome, the words
    (a detached run's verdict is RUNNING with exit code 0)."""

    run_id: str
    status: RunStatus
    exit_code: int
    nodes: tuple[NodeOutcome, ...] = ()
    words: str = ""


@dataclass(frozen=True)
class Straggler:
    """`fleet up`'s straggler watch named a rank (the same one, looks in a row): the rank the
    others wait for, its host, its score (its compute per step over the others'), the others'
    median share of time in collectives, where they wait most, and the line that says it."""

    rank: int
    host: str
    score: float
    others_wait: float
    place: str
    line: str


@dataclass(frozen=True)
class Error:
    """fleet ends with an error: its message and exit code (always the last event then)."""

    words: str
    exit_code: int


Event = Phase | NodeStarted | NodeEnded | Quiet | Attempt | Transfer | Line | Note | Verdict \
    | Error | Stopping | Straggler
TYPES: dict[str, type[Event]] = {
    "phase": Phase, "node_started": NodeStarted, "node_ended": NodeEnded, "quiet": Quiet,
    "attempt": Attempt, "transfer": Transfer, "line": Line, "note": Note, "verdict": Verdict,
    "error": Error, "stopping": Stopping, "straggler": Straggler}
NAMES = {t: name for name, t in TYPES.items()}


class Sink(Protocol):
    """Where events go: a view."""

    def emit(self, event: Event) -> None: ...


@dataclass
class Collected:
    """A sink that keeps every event (tests, and whoever renders at the end)."""

    events: list[Event] = field(default_factory=list)

    def emit(self, event: Event) -> None:
        self.events.append(event)


def outcome_json(o: NodeOutcome) -> dict[str, Any]:
    return {"host": o.name, "node_rank": o.node_rank, "status": o.status.value,
            "exit_code": o.code, "detail": o.detail, "own_failure": o.own_failure,
            "elapsed": o.elapsed}


def outcome_of(d: dict[str, Any]) -> NodeOutcome:
    return NodeOutcome(str(d["host"]), int(d["node_rank"]), NodeStatus(d["status"]),
                       d["exit_code"], str(d["detail"]), str(d["own_failure"]), d["elapsed"])


def as_json(event: Event) -> dict[str, Any]:
    """The event as one JSON object of the schema."""
    out: dict[str, Any] = {"v": SCHEMA, "event": NAMES[type(event)]}
    if isinstance(event, NodeEnded):
        return {**out, **outcome_json(event.outcome)}
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, Enum):
            value = value.value
        elif f.name == "nodes":
            value = [outcome_json(o) for o in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def from_json(d: dict[str, Any]) -> Event:
    """An event back from its JSON object (ValueError where it is not one of this schema)."""
    if d.get("v") != SCHEMA or d.get("event") not in TYPES:
        raise ValueError(f"not an event of schema {SCHEMA}: {d!r}")
    kind = TYPES[d["event"]]
    if kind is NodeEnded:
        return NodeEnded(outcome_of(d))
    args: dict[str, Any] = {}
    for f in fields(kind):
        if f.name not in d:
            continue
        value = d[f.name]
        if f.name == "step":
            value = Step(value)
        elif f.name == "tone":
            value = Tone(value)
        elif f.name == "ending":
            value = None if value is None else Ending(value)
        elif f.name == "status":
            value = RunStatus(value)
        elif f.name == "nodes":
            value = tuple(outcome_of(o) for o in value)
        elif isinstance(value, list):
            value = tuple(value)
        args[f.name] = value
    return kind(**args)
