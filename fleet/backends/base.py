"""The seam between the one runner (fleet.lifecycle) and a backend (hosts over SSH, a Slurm
cluster): the verbs in which backends really differ, and nothing that is the same for all.

A backend prepares a run (connect, probe, plan, preflight, record: nothing runs yet), schedules
it, reports what happens as a stream of events, stops it, and answers for a recorded run
(describe, list, cancel, logs, dump, delete). The runner owns the rest: the guard and its
teardown, the monitor (fail-fast, the hang watchdog), the report's verdict and the exit code.
(torchx's `Scheduler` and torch elastic's agent draw the same line.)"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fleet.backends.checks import Check
from fleet.config.inventory import Inventory
from fleet.config.job import Job
from fleet.config.notify import Notify
from fleet.console import Console
from fleet.errors import UsageError
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
from fleet.transport.transfer.pull import Pulled
from fleet.trust import KeyStatus


@dataclass(frozen=True)
class Options:
    """What `fleet up` was asked for, beyond the job."""

    detach: bool = False
    checks: bool = True  # the preflight's port checks (--skip-checks)
    force: bool = False  # start although another run holds the hosts
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
    """Hosts or Slurm: how a run is made, and what is known of a recorded one."""

    name: str

    @abstractmethod
    def prepare(self, job: Job, console: Console, options: Options) -> Run:
        """Connect, probe, plan, preflight, record: nothing of the job runs yet. A bad input
        or an unreachable host raises before anything is left anywhere."""

    @abstractmethod
    def checks(self, job: Job, collective: bool, progress: Callable[[str], None],
               trust: str) -> list[Check]:
        """`fleet check`: per host (or login node) and check, pass / warn / fail with the fix;
        nothing is started. `collective` (a short all_reduce after) is refused where it cannot
        run. `progress` hears how far the checks are; `trust` is the command that trusts the
        hosts' keys, as the user named the files."""

    @abstractmethod
    def trust_inventory(self, path: Path) -> Inventory | None:
        """The hosts whose keys `fleet trust` shows; None where fleet connects to none."""

    @abstractmethod
    def pin_keys(self, statuses: list[KeyStatus], path: Path) -> int:
        """Pin the new keys in the inventory file; how many were."""

    @abstractmethod
    def describe(self, rec: RunRecord) -> tuple[RunStatus, list[str]]:
        """`fleet status`: the run's state and the lines that say it per node."""

    @abstractmethod
    def state_word(self, rec: RunRecord) -> str:
        """`fleet ps`: the run's state in a word (or `unknown (why)`)."""

    @abstractmethod
    def cancel(self, rec: RunRecord, console: Console) -> None:
        """`fleet stop`: end the run everywhere, nothing of it left."""

    def stop_part(self, rec: RunRecord, node: str, by: str) -> bool:
        """Stop what of a recorded run still runs on one of its nodes (one an attempt lost,
        once it answers again), connected afresh; FleetError where it cannot. Returns whether
        anything of the run was found there to stop (a node rebooted since: nothing). Only a
        backend that restarts runs ([restart]) is asked."""
        raise UsageError(f"the {self.name} backend does not stop one node's part of a run")

    def parts_left(self, rec: RunRecord, nodes: set[str]) -> list[str]:
        """`status` rows for these nodes of a recorded run (those an attempt lost and fleet
        could not stop since), asked of them alone; none where their parts are over. Only a
        backend that restarts runs ([restart]) is asked."""
        raise UsageError(f"the {self.name} backend does not ask one node's part of a run")

    @abstractmethod
    def logs(self, rec: RunRecord, console: Console, follow: bool, node: str | None,
             rank: int | None, view: View) -> int:
        """Print the run's logs from the first line, or those `view` asks for (--merge, --tail,
        --since), and with `follow` what comes until the run's end; returns how many lines
        were shown. A view a backend cannot give is refused (UsageError)."""

    @abstractmethod
    def dump(self, rec: RunRecord) -> tuple[list[str], list[str]]:
        """Every rank's stack while the run goes on: (lines, problems)."""

    @abstractmethod
    def delete(self, rec: RunRecord, console: Console) -> None:
        """`fleet rm`: the run's directories where it ran (its local record is the caller's)."""

    @abstractmethod
    def tunnel(self, rec: RunRecord, node: str | None) -> Tunnel:
        """`fleet forward`: a fresh connection that reaches the ports of the run's node (the
        master by default; the caller closes its transport); UsageError for a node the run has
        not, naming those it has."""

    @abstractmethod
    def manifest(self, rec: RunRecord, console: Console) -> dict[str, Any]:
        """`fleet show`: what exactly ran."""

    @abstractmethod
    def pull(self, rec: RunRecord, console: Console, paths: list[str], to: Path,
             every: bool) -> dict[str, Pulled | Exception]:
        """`fleet pull`: `paths` (under the job's directory on the nodes; none: the job's
        declared outputs) from the master into `to`, or with `every` from each node into
        to/<node>; per node what is in place and what went wrong, or why it could not be
        asked."""

    @abstractmethod
    def survey(self, inventory: Path, nodes: list[str]) -> GpuSurvey:
        """`fleet gpus`, `fleet reserve --list`: the GPUs and leases of every host of the
        inventory (or those in `nodes`), looked at as often as asked. Refused where fleet cannot
        see them."""

    @abstractmethod
    def lease(self, inventory: Path, host: str, order: LeaseOrder) -> Taken:
        """`fleet reserve` (take, then drop what it replaced, or drop it to undo) and `fleet
        release` (give): leases of GPUs on one host of the inventory, kept there."""

    @abstractmethod
    def execute(self, inventory: Path, job: Job | None, argv: list[str], nodes: list[str],
                timeout: float | None, progress: Callable[[int, int], None]
                ) -> dict[str, Outcome]:
        """`fleet exec`: argv on every host of the inventory (or those in `nodes`) at once;
        with a job, in its directory and with its env there. Per host its answer or why none
        came; `progress(answered, total)` hears each answer. Refused where it cannot run."""
