"""Local record of runs under <state dir>/runs/<run-id>/, so later commands find every node."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.config.inventory import BackendKind, Host
from fleet.errors import DamagedRecord, RunNotFound, UsageError

if TYPE_CHECKING:  # the planner is not needed to read a record (`fleet ps` starts faster)
    from fleet.plan import Plan


@dataclass(frozen=True)
class NodeRecord:
    host: Host
    node_rank: int
    run_dir: str
    rank_base: int | None
    nproc: int | None = None  # its process count, where known before launch

    def ranks(self) -> str:
        """`node rank 1 (ranks 2-3)`: the node's rank beside the global ranks its log tags
        carry (`node2 r2`), which a bare "rank 1" would be confused with."""
        from fleet.plan import rank_span

        span = rank_span(self.rank_base, self.nproc)
        return f"node rank {self.node_rank}" + (f" ({span})" if span else "")


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    job: str
    started: float
    nodes: tuple[NodeRecord, ...]
    controller: str = ""  # the `fleet up` that made it (controller_id); "" in older records
    # Known to this machine alone (never in a node's env.sh or a job's environment): a node's
    # stop record is fleet's only if it carries the key derived from it (see stop_key). Empty
    # in records written before there was one: their stop records are taken as they read.
    secret: str = ""
    backend: BackendKind = BackendKind.HOSTS  # which backend ran it: what answers for it
    parent: str = ""  # a restart's attempt: the run it belongs to (its first attempt's id)

    @property
    def dir(self) -> Path:
        return state_dir() / self.run_id

    @property
    def launched(self) -> bool:
        """Whether its `fleet up` got as far as starting a node (mark_launched)."""
        return (self.dir / LAUNCHED).exists()

    def never_started(self) -> bool:
        """Its `fleet up` ended (killed, say) before it started any node: nothing of the run
        can be running, whatever directories it left on the nodes."""
        return not self.launched and controller_alive(self.controller) is False

    def stop_key(self, host: str) -> str:
        return stop_key(self.secret, self.run_id, host)


LAUNCHED = "launched"


@dataclass(frozen=True)
class Wrapper:
    """A node's run.sh as start.sh saw it when it started it: its pid and start time (clock
    ticks after the node's boot, /proc/PID/stat). Recorded on this machine at the start, never
    read back from the run directory (the job can write that): stop.sh takes the run's start
    and session from it (run_pids.sh)."""

    pid: int
    start: int

    def words(self) -> str:
        return f"{self.pid} {self.start}"


WRAPPER = "wrapper-"  # + host name: one file per node, each written by its own start's thread


def note_wrapper(record_dir: Path, host: str, wrapper: Wrapper) -> None:
    write_atomic(record_dir / f"{WRAPPER}{host}", wrapper.words() + "\n")


def parse_wrapper(text: str) -> Wrapper | None:
    """A recorded `<pid> <start>`; None where it is not one (never a guess)."""
    words = text.split()
    if len(words) != 2 or not all(w.isdigit() and len(w) <= 20 for w in words):
        return None
    return Wrapper(int(words[0]), int(words[1]))


def wrapper(record_dir: Path, host: str) -> Wrapper | None:
    """The node's wrapper as recorded at its start; None where none was (a run recorded before
    fleet kept it, or a start that never answered)."""
    try:
        return parse_wrapper((record_dir / f"{WRAPPER}{host}").read_text())
    except OSError:
        return None


def mark_launched(record_dir: Path) -> None:
    """Before the first start on any node: from now on the nodes say what runs."""
    (record_dir / LAUNCHED).touch()


def controller_id() -> str:
    """This process as `<machine>:<pid>:<start>`, its start time (clock ticks after boot,
    /proc/self/stat) telling it apart from a later process given the same pid."""
    return f"{_machine()}:{os.getpid()}:{_started(os.getpid())}"


def controller_alive(controller: str) -> bool | None:
    """Whether the process a controller_id names still runs; None where it cannot be told
    (another machine, an older record)."""
    machine, _, rest = controller.partition(":")
    pid_text, _, start = rest.partition(":")
    if not controller or machine != _machine() or not pid_text.isdigit():
        return None
    return _started(int(pid_text)) == start


def _machine() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{os.uname().nodename}/{boot}"


def _started(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""



def stop_key(secret: str, run_id: str, host: str) -> str:
    """The proof a stop record on `host` carries that fleet wrote it: one key per node, so a
    key read on one node is worth nothing on another. Empty where the run has no secret."""
    if not secret:
        return ""
    return hmac.new(secret.encode(), f"{run_id}/{host}".encode(), hashlib.sha256).hexdigest()[:32]


def state_dir() -> Path:
    """Where runs are recorded, the same from any directory: $FLEET_STATE_DIR, else
    $XDG_STATE_HOME/fleet, else ~/.local/state/fleet (XDG's base directories)."""
    explicit = os.environ.get("FLEET_STATE_DIR")
    if explicit:
        return Path(explicit) / "runs"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "fleet" / "runs"


def save(plan: Plan, parent: str = "") -> RunRecord:
    rec = RunRecord(run_id=plan.run_id, job=str(plan.job.path), started=time.time(),
                    nodes=tuple(NodeRecord(n.host, n.node_rank, n.run_dir, n.rank_base,
                                           n.nproc if isinstance(n.nproc, int) else None)
                                for n in plan.nodes), controller=controller_id(),
                    secret=secrets.token_hex(16), parent=parent)
    d = state_dir() / plan.run_id
    try:
        d.mkdir(parents=True, exist_ok=True)
        write_atomic(d / "run.json", json.dumps(dataclasses.asdict(rec), indent=2) + "\n")
    except OSError as e:
        raise UsageError(f"cannot record the run in {d}: {e}; set FLEET_STATE_DIR (or "
                         "XDG_STATE_HOME) to a writable directory") from e
    return rec


def save_queued(run_id: str, job: str, started: float, host: Host, run_dir: str,
                nproc: int | None) -> RunRecord:
    """The record of a queued run once fleet saw where it runs (one node, started by the
    queue's agent there): `fleet logs`, `status`, `stop` and `ps` find it like any run."""
    rec = RunRecord(run_id=run_id, job=job, started=started,
                    nodes=(NodeRecord(host, 0, run_dir, 0, nproc),))
    d = state_dir() / run_id
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / "run.json", json.dumps(dataclasses.asdict(rec), indent=2) + "\n")
    mark_launched(d)
    return rec


def write_atomic(path: Path, text: str) -> None:
    """Replace a file whole or not at all (a crash mid-write leaves the old one); readable by
    this user alone (a run record holds the run's secret)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def parse_record(text: str, path: Path | None = None) -> RunRecord:
    """A run record from its JSON; ValueError (or KeyError/TypeError) if it is damaged, and
    DamagedRecord naming `path` where it names a backend fleet does not know."""
    data = json.loads(text)
    nodes = tuple(NodeRecord(Host(**{**n["host"]}), n["node_rank"], n["run_dir"],
                             n.get("rank_base"), n.get("nproc"))
                  for n in data["nodes"])
    # Records older than the field: a Slurm run's had no nodes and a slurm.json beside it.
    word = data.get("backend") or ("hosts" if nodes else "slurm")
    if word not in {k.value for k in BackendKind}:
        raise DamagedRecord(f"{path or 'run.json'}: run {data['run_id']} names a backend fleet "
                            f"does not know ({word!r})")
    return RunRecord(data["run_id"], data["job"], data["started"], nodes,
                     str(data.get("controller", "")), str(data.get("secret", "")),
                     BackendKind(word),
                     str(data.get("parent", "")))


def load(run_id: str | None = None) -> RunRecord:
    """A recorded run by id (or by a unique start of its id or of its tag, see `matches`), or
    the latest one."""
    root = state_dir()
    if run_id is None:
        runs, _ = all_runs()
        runs = [r for r in runs if not r.parent]  # a restart's attempt answers as its run
        if not runs:
            raise RunNotFound(f"no runs recorded under {root} (run `fleet up JOB` first)")
        return runs[-1]
    path = root / run_id / "run.json"
    if "/" in run_id or not run_id:
        raise RunNotFound(f"no run {run_id!r} under {root} (see `fleet ps`)")
    if not path.is_file():
        return _by_prefix(run_id, root)
    try:
        return parse_record(path.read_text(), path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedRecord(f"{path}: the record of run {run_id} is damaged ({e}); remove that "
                            "directory if the run is no more") from e


def matches(run_id: str, typed: str) -> bool:
    """Whether what a person typed names this run: the start of its id (`mnist-2025`) or of
    its tag, the id's last word (`49b0` of mnist-20250101-120000-49b0)."""
    return run_id.startswith(typed) or run_id.rpartition("-")[2].startswith(typed)


SHOWN = 10  # candidates an ambiguous run id lists


def _by_prefix(typed: str, root: Path) -> RunRecord:
    runs, _ = all_runs()
    found = [r for r in runs if not r.parent and matches(r.run_id, typed)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise RunNotFound(f"no run {typed!r} under {root} (see `fleet ps`)")
    listed = "\n  ".join(r.run_id for r in found[-SHOWN:])
    more = f"\n  (and {len(found) - SHOWN} older)" if len(found) > SHOWN else ""
    raise UsageError(f"run {typed!r} is ambiguous: {len(found)} runs match; give more of "
                     f"the id:\n  {listed}{more}")


def all_runs() -> tuple[list[RunRecord], dict[str, str]]:
    """Every recorded run, oldest first, and the damaged records (path: why), skipped."""
    runs, damaged = [], {}
    for p in state_dir().glob("*/run.json"):
        try:
            runs.append(parse_record(p.read_text(), p))
        except DamagedRecord as e:
            damaged[str(p)] = str(e)
        except (OSError, ValueError, KeyError, TypeError) as e:
            damaged[str(p)] = f"{type(e).__name__}: {e}"
    return sorted(runs, key=lambda r: r.started), damaged
