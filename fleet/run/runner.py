"""`fleet up` for every backend, as one state machine: prepare (nothing runs yet), then under the
guard schedule, monitor and report; with `[restart]`, the policy decides on each attempt's end
(fleet.run.attempts); the run's final state becomes fleet's exit code here."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from fleet.backends.base import Backend, Final, Options, Run
from fleet.config.job import Job
from fleet.console import Console, Meaning
from fleet.errors import HostError, Interrupted, JobFailed, RunStopped
from fleet.run import attempts
from fleet.run.guard import Guard
from fleet.run.monitor import RunState, monitor
from fleet.run.states import RunStatus
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
    saying what was left where."""
    options = options or Options()
    policy = job.restart
    if policy.max and options.detach:
        console.info("[restart] needs fleet attached (it restarts the run): this detached run "
                     "is not restarted")
    if not policy.max or options.detach:
        ended = attempt(backend, job, console, options)
        return ended if isinstance(ended, str) else conclude(ended, console)
    book = attempts.Book(job, policy, console)
    while True:
        opts = book.options(options)
        try:
            ended = attempt(backend, book.job_for(opts.attempt), console, opts)
        except HostError as e:  # a spare not fit for the job: the next one, if any
            if not book.unfit(e.failures):
                raise
            continue
        assert not isinstance(ended, str)  # never detached here
        nxt = book.record(ended.run, ended.final, ended.state, ended.hang, ended.started,
                          ended.ended)
        if nxt is None:
            return conclude(ended, console, book.run_id, book.summary())
        wait = policy.wait(nxt)
        console.info(f"restart: attempt {nxt}/{policy.max + 1} in {wait:g}s "
                     f"({book.last_why()})")
        try:
            deadline = time.monotonic() + wait
            with console.waiting(f"restart: attempt {nxt} in {math.ceil(wait)}s") as w:
                while time.monotonic() < deadline and not book.stop_requested():
                    left = math.ceil(max(deadline - time.monotonic(), 0))
                    w.update(f"restart: attempt {nxt} in {left}s")
                    time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
        except Interrupted as e:
            raise Interrupted(e.signame, f"during the wait before attempt {nxt}: "
                                         f"{book.left()}") from None
        if book.stop_requested():
            raise RunStopped(f"run {book.run_id} was stopped by fleet stop during the wait "
                             f"before attempt {nxt}; {book.summary()}")


def attempt(backend: Backend, job: Job, console: Console, options: Options) -> Ended | str:
    """One whole run of the job on the backend; its run id where it was detached."""
    started = time.time()
    try:
        run = backend.prepare(job, console, options)
    except Interrupted as e:
        raise Interrupted(e.signame, "nothing had been started on any node") from None
    try:
        with Guard(run, console) as guard:
            run.schedule(options)
            if options.detach:
                guard.released = True  # from here, an error leaves the started run to itself
                said = run.detached()
                if said is not None:
                    console.info(said)
                    return run.run_id
                guard.released = False  # it ended already: reported as an attached run's end
                state = RunState({}, False, None)
            else:
                # Inside the guard: its teardown comes after every forward is closed.
                with declared(run.tunnel, job.forward, console):
                    state = monitor(run, guard, console)
            guard.ended = True
            final = run.report(state.outcomes)
    finally:
        run.close()
    return Ended(run, final, state, guard.hang, started, time.time())


def conclude(ended: Ended, console: Console, run_id: str = "", summary: str = "") -> str:
    """The attempt's final state as fleet's own: the run id returned, or the error raised."""
    run, final = ended.run, ended.final
    run_id = run_id or run.run_id
    tail = f"; {summary}" if summary else ""
    if ended.hang is not None:
        raise JobFailed(f"run {run_id} hung: {ended.hang}; {run.halted_words()} (logs: "
                        f"`fleet logs {run_id}`){tail}")
    if final.status is RunStatus.SUCCEEDED:
        console.info(f"run {run_id} succeeded {final.words}{tail}", Meaning.OK)
        return run_id
    if final.status is RunStatus.STOPPED:
        raise RunStopped(f"run {run_id} was stopped{final.words}{tail}")
    if final.status is RunStatus.FAILED:
        raise JobFailed(f"run {run_id} failed{final.words} (logs: `fleet logs {run_id}`){tail}")
    raise JobFailed(f"run {run_id} ended in an unknown state: fleet lost sight of a node "
                    f"(logs: `fleet logs {run_id}`){tail}", exit_code=final.status.exit_code)


