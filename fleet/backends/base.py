"""The seam between the one runner (fleet.lifecycle) and a backend (hosts over SSH, a Slurm
cluster): the verbs in which backends really differ, and nothing that is the same for all.

A backend prepares a run (connect, probe, plan, preflight, record: nothing runs yet), schedules
it, reports what happens as events, stops it, and answers for a recorded run (describe, list,
cancel, logs, dump, delete). The runner owns the rest: the guard, its teardown, the monitor,
the verdict and the exit code (torchx's `Scheduler` and torch elastic's agent draw that line)."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast

from fleet.backends.answers import VERBS, NodeLook, Preview, RankLooks, Replicas, Seen
from fleet.backends.checks import Check
from fleet.config.inventory import BackendKind, Inventory
from fleet.config.job import Job
from fleet.config.notify import Notify
from fleet.config.select import Selection
from fleet.console import Console
from fleet.doctor.figures import Examination
from fleet.errors import Unsupported
from fleet.events import NodeEnded as NodeEnded  # the runner's protocol, moved
from fleet.events import Quiet as Quiet
from fleet.facts.command import Outcome
from fleet.facts.gpus import GpuFacts
from fleet.facts.leases import LeaseOrder, Taken
from fleet.reports import Detached, Forgotten, Stopped
from fleet.run.logs import View
from fleet.run.record import RunRecord
from fleet.states import NodeOutcome, RunStatus
from fleet.transport.forward import Tunnel
from fleet.trust import KeyStatus
from fleet.waits import Words

if TYPE_CHECKING:  # the transfer machinery is loaded by what pulls, not by every command
    from fleet.backends.queueing import Queue
    from fleet.transport.transfer.pull import Pulled


@dataclass(frozen=True)
class Options:
    """What `fleet up` was asked for, beyond the job."""

    detach: bool = False
    checks: bool = True  # the preflight's port checks (--skip-checks)
    force: bool = False  # start although another run holds the hosts, or another user's
    # process is on their GPUs
    allow_mismatch: bool = False  # nodes with different python/torch versions
    force_setup: bool = False  # the job's setup again, changed or not
    wait: float | None = None  # --wait: seconds to wait for free GPUs (math.inf: no end)
    ignore_leases: bool = False  # start on GPUs other users leased
    # A restart (fleet.lifecycle.attempts): the attempt's own run id, the first attempt's, its
    # number, and the hosts replaced by spares (name -> the spare's name).
    run_id: str | None = None
    parent: str = ""
    attempt: int = 1
    replace: tuple[tuple[str, str], ...] = ()


class GpuSurvey(Protocol):
    """Connections to hosts to look at their GPUs through, closed together."""

    def look(self) -> dict[str, GpuFacts | str]:
        """Per host its GPUs and leases, or why they could not be known (the host's row)."""

    def close(self) -> None:
        """Close every connection."""


# ---- what a running job reports: pushed by the backend, decided on by the runner -----------
# (the event types themselves are fleet.events, where every view finds them)
Event = NodeEnded | Quiet  # what Run.events yields


@dataclass(frozen=True)
class Final:
    """How a run ended, in the backend's words: `run X <status> <words>`."""

    status: RunStatus
    words: str = ""
    failure: tuple[str, ...] = ()  # the first failure's report: where, which rank, traceback
    cause: str = ""  # that report in a few words (`rank 1 on node2 killed by SIGKILL`)


class Run(ABC):
    """One run of a backend, from its preparation on; the runner's guard owns it from then."""

    run_id: str
    record_dir: Path  # the local record, dropped if nothing ever started
    job: Job

    @abstractmethod
    def schedule(self, options: Options) -> None:
        """Send what the job needs and start it everywhere (hosts: upload, setup, start,
        master first; Slurm: sync, submit). From the first start attempted, `started()` holds."""

    @abstractmethod
    def started(self) -> bool:
        """Whether anything of the job may run somewhere: a teardown must then stop it."""

    @abstractmethod
    def detached(self) -> Detached | None:
        """After a detached schedule: the run goes on without fleet; how far it started. None
        where the job already ended: its end is reported as an attached run's."""

    @abstractmethod
    def events(self) -> Generator[Event, None, None]:
        """Until every part of the job has ended and every log line is shown: each node's
        end as it happens, and a Quiet about once a second otherwise."""

    @abstractmethod
    def stop(self, by: str, skip: set[str] | None = None) -> dict[str, str]:
        """Stop whatever of the job may run (but the nodes in `skip`), saying who stops it;
        returns per node the problem, where it may still hold a process."""

    @abstractmethod
    def forget(self) -> Forgotten:
        """Nothing ever started: remove what the preparation left (best effort)."""

    def progressed(self) -> float | None:
        """When a rank first printed a line of its own (not a traceback): a failure before it
        needs a person, not a restart. None where no rank has."""
        return None

    def watch_end(self, notify: Notify) -> str:
        """After a detached start, with `[notify]`: start whatever tells of the run's end
        without fleet; what to say of it (never raises: what fails is said)."""
        return ("warning: notify: a detached run of this backend sends no notification "
                "(nothing watches its end without fleet): run it attached for [notify]")

    @abstractmethod
    def stopped(self, problems: dict[str, str]) -> Stopped:
        """What a teardown's stop (that returned these problems) achieved."""

    @abstractmethod
    def stacks(self, hung: bool, skip: set[str]) -> tuple[list[str], list[str]]:
        """Every rank's stack (but on the nodes in `skip`, which ended): (the report's lines,
        problems)."""

    def ranks(self) -> dict[str, NodeLook | Exception]:
        """Every rank's sampling on every node, for the straggler watch ({}: none here)."""
        return {}

    @abstractmethod
    def halted(self) -> Stopped:
        """What the watchdog's stop did (the last stop's problems, if any), for the verdict of
        a hung run."""

    @abstractmethod
    def report(self, outcomes: dict[str, NodeOutcome]) -> Final:
        """Per node how it ended; for a failure the first failing rank and its traceback."""

    @abstractmethod
    def tunnel(self) -> Tunnel:
        """What reaches the master's ports while the run goes on (the job's `forward`), over
        the run's own connection; UsageError where it cannot."""

    @abstractmethod
    def close(self) -> None:
        """Connections closed, claims released."""


class Backend(ABC):
    """Every verb a backend may answer, each refused by default with the one Unsupported: a
    backend takes roles (Launch, Recorded, LabTools below), whose verbs it must then answer,
    and may answer any other verb it can."""

    kind: ClassVar[BackendKind]
    # Per verb it refuses, what to do instead: the refusal's second half.
    instead: ClassVar[dict[str, str]] = {}

    def refuse(self, verb: str) -> Unsupported:
        """The one refusal of a verb this backend does not answer."""
        return Unsupported(str(self.kind), VERBS[verb], self.instead.get(verb, ""))

    # ---- launch -------------------------------------------------------------------------
    def prepare(self, job: Job, console: Console, options: Options) -> Run:
        """Connect, probe, plan, preflight, record: nothing of the job runs yet; a bad input
        or an unreachable host raises before anything is left anywhere."""
        raise self.refuse("prepare")

    def checks(self, job: Job, collective: bool, progress: Callable[[Words], None],
               trust: str) -> list[Check]:
        """`fleet check`: per host and check, pass / warn / fail with the fix; nothing starts.
        `progress` hears how far they are; `trust` is the command that trusts the keys."""
        raise self.refuse("checks")

    def preview(self, job: Job, probe: bool) -> Preview:
        """`fleet plan`: what `up` would run (with `probe`, looked at on the nodes)."""
        raise self.refuse("preview")

    def collective(self, job: Job) -> Job:
        """`fleet check --collective`: the bandwidth test as a job on `job`'s nodes."""
        raise self.refuse("collective")

    def queue(self, inventory: Path) -> Queue:  # fleet submit, sweep, queue
        raise self.refuse("queue")

    def export(self, job: Job, settings: dict[str, Any]) -> str:
        """`fleet export`: the job as a script the scheduler runs without fleet, with
        `settings` (those given) instead of the inventory's."""
        raise self.refuse("export")

    def spares(self, inventory: Path) -> list[str]:
        """The hosts that may take a lost node's place in a restart, in order (none: [])."""
        return []

    def replicas(self, job: Job, console: Console, run_id: str) -> Replicas:
        """`[restart] checkpoints`: what copies the run's checkpoints between its nodes (its
        record is run `run_id`'s)."""
        raise self.refuse("replicas")

    # ---- recorded runs ------------------------------------------------------------------
    def describe(self, rec: RunRecord) -> tuple[RunStatus, list[str]]:
        """`fleet status`: the run's state and the lines that say it per node."""
        raise self.refuse("describe")

    def state(self, rec: RunRecord) -> Seen:
        """`fleet ps`: the run's state (or why it is unknown)."""
        raise self.refuse("state")

    def take_healed(self, rec: RunRecord) -> None:
        """Take into the run's record an attempt that its nodes started by themselves (a
        detached run that healed without the laptop), once; nothing where none did."""
        return None

    def cancel(self, rec: RunRecord, console: Console) -> None:
        """`fleet stop`: end the run everywhere, nothing of it left."""
        raise self.refuse("cancel")

    def stop_part(self, rec: RunRecord, node: str, by: str) -> bool:
        """Stop what of a recorded run still runs on one node (one an attempt lost, once it
        answers again); FleetError where it cannot. Whether anything was found there to stop.
        Only a backend that restarts runs ([restart]) is asked."""
        raise self.refuse("stop_part")

    def parts_left(self, rec: RunRecord, nodes: set[str]) -> list[str]:
        """`status` rows for these nodes of a recorded run (those an attempt lost and fleet
        could not stop since), asked of them alone; none where their parts are over."""
        raise self.refuse("parts_left")

    def logs(self, rec: RunRecord, console: Console, follow: bool, node: str | None,
             rank: int | None, view: View) -> int:
        """Print the run's logs (those `view` asks for), with `follow` until the run's end;
        how many lines were shown. A view a backend cannot give is refused (UsageError)."""
        raise self.refuse("logs")

    def dump(self, rec: RunRecord) -> tuple[list[str], list[str]]:
        """Every rank's stack while the run goes on: (lines, problems)."""
        raise self.refuse("dump")

    def top(self, rec: RunRecord) -> RankLooks:
        """`fleet top`: the run's ranks, looked at again at each call."""
        raise self.refuse("top")

    def delete(self, rec: RunRecord, console: Console) -> None:
        """`fleet rm`: the run's directories where it ran (its local record is the caller's)."""
        raise self.refuse("delete")

    def tunnel(self, rec: RunRecord, node: str | None) -> Tunnel:
        """`fleet forward`: a fresh connection to the ports of the run's node (the master by
        default; the caller closes it); UsageError for a node the run has not."""
        raise self.refuse("tunnel")

    def manifest(self, rec: RunRecord, console: Console) -> dict[str, Any]:
        """`fleet show`: what exactly ran."""
        raise self.refuse("manifest")

    def pull(self, rec: RunRecord, console: Console, paths: list[str], to: Path,
             every: bool) -> dict[str, Pulled | Exception]:
        """`fleet pull`: `paths` (under the job's directory; none: its declared outputs) from
        the master into `to`, or with `every` from each node into to/<node>; per node what
        is in place and what went wrong."""
        raise self.refuse("pull")

    # ---- lab tools ----------------------------------------------------------------------
    def survey(self, inventory: Path, nodes: Selection) -> GpuSurvey:
        """`fleet gpus`: the GPUs and leases of the inventory's hosts (those `nodes` keeps)."""
        raise self.refuse("survey")

    def lease(self, inventory: Path, host: str, order: LeaseOrder) -> Taken:
        """`fleet reserve` and `release`: leases of GPUs on one host, kept there."""
        raise self.refuse("lease")

    def execute(self, inventory: Path, job: Job | None, argv: list[str], nodes: Selection,
                timeout: float | None) -> dict[str, Outcome]:
        """`fleet exec`: argv on every host of the inventory (or those `nodes` keeps) at once,
        with a job in its directory and env; per host its answer or why none came (the wait
        announced with fleet.waits.over)."""
        raise self.refuse("execute")

    def doctor(self, inventory: Path, nodes: Selection, quick: bool,
               progress: Callable[[Words], None]) -> Examination:
        """`fleet doctor`: every figure of the hosts `nodes` keeps and of the links between them."""
        raise self.refuse("doctor")

    def trust_inventory(self, path: Path) -> Inventory | None:
        """The hosts whose keys `fleet trust` shows; None where fleet connects to none."""
        raise self.refuse("trust_inventory")

    def pin_keys(self, statuses: list[KeyStatus], path: Path) -> int:
        """Pin the new keys in the inventory file; how many were."""
        raise self.refuse("pin_keys")


# ---- the roles: the verbs a backend that takes one must answer ------------------------------
F = TypeVar("F", bound=Callable[..., Any])


def required(verb: F) -> F:
    """Backend's verb, abstract in a role (a copy: Backend's own stays a refusal)."""
    return cast(F, abstractmethod(functools.wraps(verb)(lambda *a, **k: verb(*a, **k))))


class Launch(Backend):
    """Runs a job: the runner drives what `prepare` returns (fleet up, fleet check)."""

    prepare = required(Backend.prepare)
    checks = required(Backend.checks)


class Recorded(Backend):
    """Answers for a run it recorded (status, ps, stop, logs, dump, rm, forward, show)."""

    describe = required(Backend.describe)
    state = required(Backend.state)
    cancel = required(Backend.cancel)
    logs = required(Backend.logs)
    dump = required(Backend.dump)
    delete = required(Backend.delete)
    tunnel = required(Backend.tunnel)
    manifest = required(Backend.manifest)


class LabTools(Backend):
    """Tools for a lab's own hosts, with no run: gpus, reserve, release, exec, trust."""

    survey = required(Backend.survey)
    lease = required(Backend.lease)
    execute = required(Backend.execute)
    trust_inventory = required(Backend.trust_inventory)
    pin_keys = required(Backend.pin_keys)


ROLES: tuple[type[Backend], ...] = (Launch, Recorded, LabTools)
