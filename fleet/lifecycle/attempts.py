"""Runs that heal: `[restart]`'s policy over whole attempts, and their record. Each attempt is a
whole run of its own (every node stopped, then started again with a new rendezvous and
FLEET_ATTEMPT set, the job resuming from its own checkpoint); a spare (`spare = true` in the
inventory) takes a lost or failed node's place, with its rank. The first attempt's run id names
the run; later attempts are `<run id>-a<N>`, recorded with it as their parent."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any

from fleet import trackers
from fleet.backends.base import Backend, Final, Options, Run
from fleet.config.job import Job
from fleet.config.restart import Ending, Restart
from fleet.console import Console
from fleet.errors import ConfigError, DamagedRecord
from fleet.lifecycle import spares
from fleet.lifecycle.left import Left as Left  # its home was here
from fleet.lifecycle.monitor import RunState
from fleet.plan import new_run_id
from fleet.run import record as state
from fleet.states import NodeStatus, RunStatus

FILE = "attempts.json"  # in the run's (its first attempt's) local record
STOP = "stop-requested"  # beside it: `fleet stop` asked for the run's end, no attempt after


@dataclass
class Attempt:
    """What one attempt was and how it ended (times are time.time())."""

    number: int
    run_id: str
    hosts: list[str]
    started: float
    ended: float
    status: RunStatus  # written as its word (`failed`), as before it was a type
    why: str = ""  # how it ended badly: `node2 was lost`, `node1 failed (exit 1)`, `a hang`
    stopped_at: float | None = None  # when fleet began to stop it (the failure known)
    progressed_at: float | None = None  # a rank's first line of its own
    replaced: dict[str, str] = field(default_factory=dict)  # host -> the spare after it
    then: str = ""  # what the policy decided after it: why no attempt followed, if none did
    lost: list[str] = field(default_factory=list)  # nodes it lost: their part may still run


def ending(final: Final, run_state: RunState, hang: str | None) -> tuple[Ending | None, str]:
    """Which of `[restart] on`'s endings an attempt had (None: success, or a person's stop),
    and the words for it: for a failure, the failure report's own (`rank 1 on node2 killed by
    SIGKILL`), torchrun's exit code only where no report was found."""
    if hang is not None:
        return Ending.HANG, "a hang"
    if (s := run_state.replacing) is not None:  # stopped for a spare: the watch's own policy
        return None, f"rank {s.rank} ({s.host}) was the straggler"
    lost = [o for o in run_state.outcomes.values() if o.status is NodeStatus.UNREACHABLE]
    if lost:
        return Ending.LOST, f"{lost[0].name} was lost"
    if final.status is RunStatus.FAILED:
        failed = run_state.outcomes.get(failed_node(run_state) or "")
        if final.cause:
            return Ending.FAIL, final.cause
        return Ending.FAIL, f"{failed.name} {failed.describe()}" if failed else "it failed"
    return None, ""


def failed_node(run_state: RunState) -> str | None:
    """The node of an attempt's first failure (not a loss): the first to end, if it failed."""
    first = run_state.outcomes.get(run_state.first or "")
    if first is not None and first.status is NodeStatus.FAILED:
        return first.name
    return next((o.name for o in run_state.outcomes.values() if o.status is NodeStatus.FAILED),
                None)


class Book:
    """The attempts of one run: which comes next, on which hosts, and the record of each."""

    def __init__(self, job: Job, policy: Restart, console: Console, backend: Backend) -> None:
        self.job, self.policy, self.console, self.backend = job, policy, console, backend
        self.run_id = new_run_id(job.name)
        self.attempts: list[Attempt] = []
        self.places = spares.Places(self._spares)
        self.doctor_said: dict[str, str] = {}  # node -> why fleet doctor had it give way

    @property
    def replace(self) -> dict[str, str]:
        """Inventory host -> the spare in its place now."""
        return self.places.replace

    def options(self, base: Options) -> Options:
        n = len(self.attempts) + 1
        return dataclasses.replace(base, run_id=self.run_id if n == 1 else f"{self.run_id}-a{n}",
                                   parent="" if n == 1 else self.run_id, attempt=n,
                                   replace=tuple(self.replace.items()))

    def job_for(self, number: int) -> Job:
        # What fleet created for the run's tracker before (its MLflow run), for every attempt.
        made = trackers.created_vars(state.state_dir() / self.run_id)
        return dataclasses.replace(self.job, env={**made, **self.job.env,
                                                  "FLEET_ATTEMPT": str(number)})

    def record(self, run: Run, final: Final, run_state: RunState, hang: str | None,
               started: float, ended: float) -> int | None:
        """Keep the attempt; the number of the next one, or None where the run is over."""
        kind, why = ending(final, run_state, hang)
        ordered = sorted(run_state.outcomes.values(), key=lambda o: o.node_rank)
        a = Attempt(len(self.attempts) + 1, run.run_id, [o.name for o in ordered], started,
                    ended, final.status if not hang else RunStatus.FAILED, why,
                    run_state.stopped_at, run.progressed(),
                    lost=[o.name for o in ordered if o.status is NodeStatus.UNREACHABLE])
        self.attempts.append(a)
        swap = run_state.replacing is not None and self.places.take(run_state.replacing.host)
        nxt = a.number + 1 if swap else self._next(a, kind, run_state)  # a straggler's swap
        self.save()
        return nxt

    def _next(self, a: Attempt, kind: Ending | None, run_state: RunState) -> int | None:
        if kind is None:
            return None
        say = self.console.info
        if kind not in self.policy.on:
            a.then = (f"not restarted: {a.why}, and [restart] on is "
                      f"{', '.join(e.value for e in self.policy.on) or 'empty'}")
        elif a.progressed_at is None:
            a.then = (f"not restarted: {a.why} before any rank printed a line of its own (a "
                      "script, import or setup error needs a person, not a restart)")
        elif a.number > self.policy.max:
            a.then = f"no attempt left ([restart] max = {self.policy.max})"
        if a.then:
            say(a.then if a.then.startswith("not") else f"restart: {a.then}")
            return None
        lost = [n for n, o in run_state.outcomes.items() if o.status is NodeStatus.UNREACHABLE]
        failed = failed_node(run_state) if kind is Ending.FAIL else None
        d = spares.decide(kind, lost, failed, self.places.failed, self.policy.replace)
        if failed:
            self.places.failed.add(failed)
        if d.in_place and self.places.free():
            say(f"restart: {d.in_place} is retried in place (its first failure; [restart] "
                f'replace = "{self.policy.replace.value}")')
        for name in d.give_way:
            if self.places.take(name) is None and name in lost:
                say(f"restart: no spare left for {name}: the next attempt tries it again")
        return a.number + 1

    def doctor_named(self, named: dict[str, str]) -> None:
        """Hosts `fleet doctor` named before the next attempt (host -> its lines): a spare
        named is never taken; a host in use gives way to the first free spare, said with the
        doctor's word once the attempt passes its checks."""
        if not named or not self.attempts:
            return
        self.places.used |= set(named) & set(self.places.spares())
        in_use = [self.replace.get(h, h) for h in self.attempts[-1].hosts]
        for name in in_use:
            if name not in named:
                continue
            spare = self.places.take(name)
            if spare is None:
                self.console.info(f"restart: fleet doctor named {name}, and no spare is left: "
                                  "the next attempt runs on it")
                continue
            self.doctor_said[name] = f"fleet doctor: {named[name]}"
        self.save()

    def _spares(self) -> list[str]:
        """The backend's spares that the run's `--node`/`--exclude` keep, in its order."""
        try:
            found = self.backend.spares(self.job.inventory)
        except ConfigError:
            return []
        return [s for s in found if self.job.selection.keeps(s)]

    def confirm(self) -> None:
        """The attempt about to start passed its checks, its spares with it: only now is each
        spare's taking a node's place said and recorded."""
        said = self.places.confirmed()
        if not said or not self.attempts:
            return
        a = self.attempts[-1]
        for name, spare in said.items():
            a.replaced[name] = spare
            why = self.doctor_said.pop(name, a.why)
            self.console.info(f"restart: {name} replaced by spare {spare} ({why})")
        self.save()

    def unfit(self, failures: dict[str, str]) -> bool:
        """Spares that failed the checks of their attempt (unreachable, an unknown host key,
        other versions, a taken port...): the next free spare is checked in each one's place.
        False where none of the failures is a spare's."""
        unfit = [s for s in self.replace.values() if s in failures]
        if not unfit:
            return False
        a = self.attempts[-1]
        for name, spare in list(a.replaced.items()):  # said too early (a check after prepare)
            if spare in unfit:
                del a.replaced[name]
                self.places.pending[name] = spare
        for spare in unfit:
            home, nxt = self.places.refit(spare)
            self.console.info(f"restart: spare {spare} is not fit for the job "
                              f"({failures[spare]})" + (f"; {nxt} is checked in its place"
                                                        if nxt else ""))
            if nxt is None:
                self.console.info(f"restart: no spare left: {home} is tried again")
        self.save()
        return True

    def unstarted(self, run_id: str, failures: dict[str, str], started: float) -> int | None:
        """A later attempt that could not start on hosts that are not spares (the lost node
        still down, no spare left): kept as a failed attempt, and the next follows while `max`
        allows (each failing host giving way to a free spare, if any); None on the first
        attempt (its error is for a person) or once `max` is reached."""
        if not self.attempts:
            return None
        before = self.attempts[-1]
        hosts = [self.places.pending.get(h, before.replaced.get(h, h)) for h in before.hosts]
        a = Attempt(len(self.attempts) + 1, run_id, hosts, started, time.time(),
                    RunStatus.FAILED, "it could not start: " + "; ".join(
                        f"{h}: {why.splitlines()[0]}" for h, why in failures.items()))
        self.attempts.append(a)
        if a.number > self.policy.max:
            a.then = f"no attempt left ([restart] max = {self.policy.max})"
            self.console.info(f"restart: {a.then}")
            self.save()
            return None
        for name in failures:
            self.places.take(name)
        self.save()
        return a.number + 1

    def stop_requested(self) -> bool:
        return (state.state_dir() / self.run_id / STOP).exists()

    def left(self) -> str:
        """What of the run may still run while no attempt does: the last one's lost nodes."""
        lost = self.attempts[-1].lost if self.attempts else []
        if not lost:
            return f"nothing of run {self.run_id} was running"
        return (f"nothing of run {self.run_id} was started since; its lost node(s) "
                f"{', '.join(lost)} may still run their part: `fleet stop {self.run_id}` once "
                "they answer")

    def last_why(self) -> str:
        return self.attempts[-1].why

    def summary(self) -> str:
        total = self.policy.max + 1
        return "attempts: " + ", ".join(
            f"{a.number}/{total} {a.status.value}" + (f" ({a.why})" if a.why else "")
            for a in self.attempts)

    def save(self) -> None:
        d = state.state_dir() / self.run_id
        if d.is_dir():
            state.write_atomic(d / FILE, json.dumps(
                {"max": self.policy.max, "attempts": [as_dict(a) for a in self.attempts]},
                indent=2) + "\n")


def as_dict(a: Attempt) -> dict[str, Any]:
    """The attempt as attempts.json (and `status --json`) has it: its status as its word."""
    return {**dataclasses.asdict(a), "status": a.status.value}


def from_dict(item: dict[str, Any]) -> Attempt:
    """An attempt from attempts.json (ValueError, KeyError or TypeError where it is not one)."""
    word = item["status"]
    try:
        status = RunStatus(word)
    except ValueError:
        raise ValueError(f"attempt {item.get('number')}'s status {word!r} is none of "
                         f"{', '.join(s.value for s in RunStatus)}") from None
    return Attempt(**{**item, "status": status})


def load(rec: state.RunRecord) -> tuple[int, list[Attempt]] | None:
    """A run's attempts (and `max`), where it had a restart policy."""
    path = rec.dir / FILE
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return int(data["max"]), [from_dict(a) for a in data["attempts"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DamagedRecord(f"{path}: the attempts of run {rec.run_id} are damaged ({e})") from e


def lines(max_: int, items: list[Attempt]) -> list[str]:
    """`fleet status`'s words for each attempt: how it ended, what replaced what, how long
    from the failure to training again."""
    out = []
    for a, after in zip(items, [*items[1:], None], strict=True):
        when = time.strftime("%H:%M:%S", time.localtime(a.stopped_at or a.ended))
        words = f"  attempt {a.number}/{max_ + 1} ({a.run_id}): {a.status.value}"
        if a.why:
            words += f", {a.why} at {when}"
        for host, spare in a.replaced.items():
            words += f"; {host} replaced by {spare}"
        if a.then:
            words += f"; {a.then}"
        if after is not None and a.stopped_at and after.progressed_at:
            words += (f"; the job's first line again {after.progressed_at - a.stopped_at:.1f}s "
                      "later")
        out.append(words)
    return out


def headline(max_: int, items: list[Attempt], number: int) -> str:
    """`attempt 2/4, node2 replaced by spare1 after node2 was lost at 03:12`: the attempt
    `number` (the last one, ended or under way), after the one before it."""
    words = f"attempt {number}/{max_ + 1}"
    before = items[number - 2] if 1 < number <= len(items) + 1 else None
    if before is not None:
        when = time.strftime("%H:%M", time.localtime(before.stopped_at or before.ended))
        swaps = ", ".join(f"{h} replaced by {s}" for h, s in before.replaced.items())
        words += f", {swaps} after {before.why} at {when}" if swaps else \
            f" after {before.why} at {when}"
    return words


def request_stop(rec: state.RunRecord) -> None:
    """No attempt of this run starts after this (`fleet stop`, which also stops the one under
    way)."""
    run_dir = state.state_dir() / (rec.parent or rec.run_id)
    if run_dir.is_dir():
        (run_dir / STOP).touch()


def records(rec: state.RunRecord) -> list[state.RunRecord]:
    """Every attempt's record, the first one first, the one under way too (the run's own
    alone, without attempts)."""
    return list(numbered(rec).values())


def numbered(rec: state.RunRecord) -> dict[int, state.RunRecord]:
    """Each attempt's record by its number (1: the run's own), in order: an attempt that never
    started has no record, and the later ones keep their own numbers."""
    later = []
    for path in state.state_dir().glob(f"{rec.run_id}-a*/run.json"):
        number = path.parent.name.rpartition("-a")[2]
        if number.isdigit() and int(number) > 1:
            later.append((int(number), path.parent.name))
    return {1: rec} | {n: state.load(name) for n, name in sorted(later)}


def as_json(rec: state.RunRecord) -> dict[str, Any] | None:
    found = load(rec)
    return None if not found else {"max": found[0], "attempts": [as_dict(a) for a in found[1]]}
