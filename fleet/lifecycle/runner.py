"""`fleet up` for every backend, as one state machine: prepare (nothing runs yet), then under the
guard schedule, monitor and report; with `[restart]`, the policy decides on each attempt's end
(fleet.lifecycle.attempts); the run's final state becomes fleet's exit code here, and word of it
goes where `[notify]` says (fleet.lifecycle.notify), once for the whole run."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from fleet import phrases
from fleet.backends.answers import Replicas
from fleet.backends.base import Backend, Final, Options, Run
from fleet.config.job import Job
from fleet.console import Console, Meaning
from fleet.errors import HostError, Interrupted, JobFailed, RunStopped
from fleet.events import Attempt, Phase, Step, Verdict
from fleet.lifecycle import attempts, checkup, history, notify
from fleet.lifecycle.guard import Guard
from fleet.lifecycle.monitor import RunState, monitor
from fleet.lifecycle.straggler_watch import SpareFor, spare_for
from fleet.states import RunStatus
from fleet.transport.forward import declared


@dataclass(frozen=True)
class Ended:
    """One attempt, once it ended: what the report said, and what the policy decides on."""

    run: Run
    final: Final
    state: RunState
    hang: str | None
    started: float
    ended: float


def up(backend: Backend, job: Job, console: Console, options: Options | None = None) -> str:
    """Run the job; returns the run id. Raises JobFailed, RunStopped or Interrupted, each
    saying what was left where. Its end is told where `[notify]` says (bounded in time; a
    failure to tell is a warning, never the exit code); a restart's attempts are not."""
    told = notify.Told(job.name, time.time())
    try:
        run_id = run_all(backend, job, console, options or Options(), told)
    except BaseException as e:
        notify.tell(job.notify, told, e, console)
        raise
    notify.tell(job.notify, told, None, console)
    return run_id


def run_all(backend: Backend, job: Job, console: Console, options: Options,
            told: notify.Told) -> str:
    """Every attempt of the run, as `[restart]` decides (one without it)."""
    policy = job.restart
    checkup.before_up(backend, job, console)
    if policy.max and options.detach:
        console.info("[restart] on a detached run: the nodes' own watchers start attempt 2, "
                     "prepared now, once, where a node other than the master is lost and an "
                     "inventory spare is there; any other end fails fast, not restarted")
    if job.watchdog.straggler and options.detach:
        console.info("[watchdog] straggler: a detached run has no straggler watch (fleet is not "
                     "there to look); `fleet top` names the straggler of a run that goes on",
                     Meaning.WARN)
    if not policy.max or options.detach:
        ended = attempt(backend, job, console, options, told)
        return ended if isinstance(ended, str) else conclude(ended, console, told)
    book = attempts.Book(job, policy, console, backend)
    left = attempts.Left(backend, console, book.run_id)
    keeper = backend.replicas(job, console, book.run_id) if policy.checkpoints else None
    try:
        return heal(backend, job, console, options, told, book, left, keeper)
    finally:
        left.cancel()
        if keeper is not None:
            keeper.close()


def heal(backend: Backend, job: Job, console: Console, options: Options, told: notify.Told,
         book: attempts.Book, left: attempts.Left, keeper: Replicas | None = None) -> str:
    """Attempts until the policy says the run is over; what an attempt left on a node it lost
    is stopped once the node answers (`left`), or named at the end. With `keeper`, each
    attempt's nodes hold the newest checkpoint a survivor has before it starts (once its hosts
    passed their checks)."""
    policy = job.restart
    while True:
        if book.attempts:  # a host the doctor names gives way to a spare before this attempt
            book.doctor_named(checkup.before_attempt(backend, job, console,
                                                     len(book.attempts) + 1))
        opts = book.options(options)
        lost = book.attempts[-1].lost if book.attempts else []

        def prepared(opts: Options = opts, lost: list[str] = lost) -> None:
            book.confirm()
            # Only once every host (a spare too) passed its checks: a spare found unfit gets
            # no copy, and no word of one.
            if keeper is not None:
                keeper.ready(opts.attempt, dict(opts.replace), lost)

        started = time.time()
        try:
            ended = attempt(backend, book.job_for(opts.attempt), console, opts, told,
                            prepared=prepared,
                            spare=spare_for(book.places, opts.attempt, policy.max))
        except HostError as e:  # a spare not fit for the job: the next one, if any
            if book.unfit(e.failures):
                continue
            # A host not fit (the lost one still down): an attempt, while `max` allows one.
            nxt = book.unstarted(opts.run_id or "", e.failures, started)
            if nxt is None:
                left.end()
                raise
        else:
            assert not isinstance(ended, str)  # never detached here
            nxt = book.record(ended.run, ended.final, ended.state, ended.hang, ended.started,
                              ended.ended)
            left.add(book.attempts[-1])
            if nxt is None:
                left.end()
                return conclude(ended, console, told, book.run_id, book.summary())
        wait = policy.wait(nxt)
        console.event(Attempt(nxt, policy.max + 1, wait, book.last_why()))
        console.event(Phase(Step.WAITING, book.run_id))
        try:
            deadline = time.monotonic() + wait
            with console.waiting(f"restart: attempt {nxt} in {math.ceil(wait)}s") as w:
                while time.monotonic() < deadline and not book.stop_requested():
                    secs = math.ceil(max(deadline - time.monotonic(), 0))
                    w.update(f"restart: attempt {nxt} in {secs}s")
                    time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
        except Interrupted as e:
            said = f"during the wait before attempt {nxt}: {book.left()}"
            last = book.attempts[-1].status  # the run is as its last attempt ended
            history.keep(book.run_id, last, last.exit_code,
                         f"fleet up, interrupted ({e.signame})", f"run {book.run_id} {said}")
            raise Interrupted(e.signame, said) from None
        if book.stop_requested():
            said = (f"run {book.run_id} was stopped by fleet stop during the wait before "
                    f"attempt {nxt}; {book.summary()}")
            last = book.attempts[-1].status
            history.keep(book.run_id, last, last.exit_code, "fleet up, after fleet stop", said)
            raise RunStopped(said)


def attempt(backend: Backend, job: Job, console: Console, options: Options,
            told: notify.Told, prepared: Callable[[], None] | None = None,
            spare: SpareFor | None = None) -> Ended | str:
    """One whole run of the job on the backend; its run id where it was detached. `prepared`
    is called once the backend's preparation (every host's checks) passed; `spare` names the
    spare a straggler's host would give way to."""
    started = time.time()
    console.event(Phase(Step.PREPARING, options.run_id or ""))
    try:
        run = backend.prepare(job, console, options)
    except Interrupted as e:
        before = f"{e.outcome}; " if e.outcome else ""
        raise Interrupted(e.signame, f"{before}nothing had been started on any node") from None
    if prepared is not None:
        prepared()
    told.run_id = told.run_id or run.run_id
    told.failure, told.hang = (), None
    guard = Guard(run, console)  # its signal handlers from `with` on
    try:
        with guard:
            console.event(Phase(Step.SCHEDULING, run.run_id))
            run.schedule(options)
            if options.detach:
                guard.released = True  # from here, an error leaves the started run to itself
                went = run.detached()
                if went is not None:
                    console.event(Verdict(run.run_id, RunStatus.RUNNING, 0, (),
                                          phrases.detached(went)))
                    told.detached = True
                    if job.notify.wanted:
                        console.info(run.watch_end(job.notify))
                    return run.run_id
                guard.released = False  # it ended already: reported as an attached run's end
                state = RunState({}, False, None)
            else:
                # Inside the guard: its teardown comes after every forward is closed.
                console.event(Phase(Step.RUNNING, run.run_id))
                with declared(run.tunnel, job.forward, console):
                    state = monitor(run, guard, console, spare)
                told.stragglers += [s.line for s in state.stragglers]
            guard.ended = True
            console.event(Phase(Step.REPORTING, run.run_id))
            final = run.report(state.outcomes)
    finally:
        told.hang = guard.hang
        run.close()
    told.failure = final.failure
    return Ended(run, final, state, guard.hang, started, time.time())


def conclude(ended: Ended, console: Console, told: notify.Told, run_id: str = "",
             summary: str = "") -> str:
    """The attempt's final state as fleet's own: the run id returned, or the error raised (and
    both told, for `[notify]`)."""
    run, final = ended.run, ended.final
    run_id = run_id or run.run_id
    tail = f"; {summary}" if summary else ""
    nodes = tuple(sorted(ended.state.outcomes.values(), key=lambda o: o.node_rank))

    def verdict(code: int) -> None:
        console.event(Verdict(run_id, final.status, int(code), nodes, told.said))
        seen = RunStatus.FAILED if ended.hang is not None else final.status
        history.keep(run_id, seen, int(code), "fleet up", told.said)  # kept at once

    if ended.hang is not None:
        told.state = notify.NoticeState.HUNG
        told.said = (f"run {run_id} hung: {ended.hang}; {phrases.halted(run.halted())} (logs: "
                     f"`fleet logs {run_id}`){tail}")
        verdict(JobFailed.exit_code)
        raise JobFailed(told.said)
    if final.status is RunStatus.SUCCEEDED:
        told.state = notify.NoticeState.SUCCEEDED
        told.said = f"run {run_id} succeeded {final.words}{tail}"
        verdict(0)
        return run_id
    if final.status is RunStatus.STOPPED:
        told.state = notify.NoticeState.STOPPED
        told.said = f"run {run_id} was stopped{final.words}{tail}"
        verdict(RunStopped.exit_code)
        raise RunStopped(told.said)
    if final.status is RunStatus.FAILED:
        told.state = notify.NoticeState.FAILED
        told.said = f"run {run_id} failed{final.words} (logs: `fleet logs {run_id}`){tail}"
        verdict(JobFailed.exit_code)
        raise JobFailed(told.said)
    told.state = notify.NoticeState.UNKNOWN
    told.said = (f"run {run_id} ended in an unknown state: fleet lost sight of a node (logs: "
                 f"`fleet logs {run_id}`){tail}")
    verdict(final.status.exit_code)
    raise JobFailed(told.said, exit_code=final.status.exit_code)


