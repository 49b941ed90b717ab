"""`fleet up` for every backend, as one state machine: prepare (nothing runs yet), then under the
guard schedule, monitor and report; the run's final state becomes fleet's exit code here."""

from __future__ import annotations

from fleet.backends.base import Backend, Options
from fleet.config.job import Job
from fleet.console import Console
from fleet.errors import Interrupted, JobFailed, RunStopped
from fleet.run.guard import Guard
from fleet.run.monitor import monitor
from fleet.run.states import RunStatus


def up(backend: Backend, job: Job, console: Console, options: Options | None = None) -> str:
    """Run the job; returns the run id. Raises JobFailed, RunStopped or Interrupted, each
    saying what was left where."""
    options = options or Options()
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
                outcomes = {}
            else:
                outcomes = monitor(run, guard, console)
            guard.ended = True
            final = run.report(outcomes)
    finally:
        run.close()
    run_id = run.run_id
    if guard.hang is not None:
        raise JobFailed(f"run {run_id} hung: {guard.hang}; {run.halted_words()} (logs: "
                        f"`fleet logs {run_id}`)")
    if final.status is RunStatus.SUCCEEDED:
        console.info(f"run {run_id} succeeded {final.words}")
        return run_id
    if final.status is RunStatus.STOPPED:
        raise RunStopped(f"run {run_id} was stopped{final.words}")
    if final.status is RunStatus.FAILED:
        raise JobFailed(f"run {run_id} failed{final.words} (logs: `fleet logs {run_id}`)")
    raise JobFailed(f"run {run_id} ended in an unknown state: fleet lost sight of a node "
                    f"(logs: `fleet logs {run_id}`)", exit_code=final.status.exit_code)
