"""The words the terminal shows for a run's typed events (fleet.events) and for what the
seam returns as data: made here, at the edge, never by a backend or the runner."""

from __future__ import annotations

from fleet import events as ev
from fleet.reports import Detached, Forgotten, Stopped
from fleet.sizes import short
from fleet.states import RunStatus


def terminal_words(event: ev.Event) -> list[tuple[str, str, ev.Tone]]:
    """What the terminal says of an event: (host or "", words, tone) per line; none for what
    it shows otherwise (a log Line) or not at all (a Phase, the watchdog's clock, an error,
    which the command's error handler says)."""
    if isinstance(event, ev.Note):
        return [(event.host, event.words, event.tone)]
    if isinstance(event, ev.NodeStarted):
        pid = "" if event.pid is None else f" (pid {event.pid})"
        return [(event.host, f"started master{pid}" if event.master else f"started{pid}",
                 ev.Tone.PLAIN)]
    if isinstance(event, ev.Transfer):
        return [(event.host, f"{event.label}: sent {event.files} file(s), {short(event.size)} "
                             f"({event.unchanged} unchanged, {event.seconds:.2f}s)",
                 ev.Tone.PLAIN)]
    if isinstance(event, ev.Attempt):
        return [("", f"restart: attempt {event.number}/{event.of} in {event.wait:g}s "
                     f"({event.why})", ev.Tone.PLAIN)]
    if isinstance(event, ev.Straggler):
        return [("", f"straggler: {event.line}", ev.Tone.WARN)]
    if isinstance(event, ev.Verdict) and event.words:
        if event.status is RunStatus.SUCCEEDED:
            return [("", event.words, ev.Tone.OK)]
        if event.status is RunStatus.RUNNING:  # detached: it goes on without fleet
            return [("", event.words, ev.Tone.PLAIN)]
    return []


ENDING = {ev.Ending.TORCHRUN_WORKERS: "torchrun still ending its workers",
          ev.Ending.TORCHRUN: "torchrun still ending",
          ev.Ending.WORKERS: "{n} worker(s) still ending",
          ev.Ending.WRAPPER: "run.sh recording how torchrun ended",
          ev.Ending.OTHER: "{n} process(es) of the run still ending",
          ev.Ending.CONNECTING: "connecting",
          ev.Ending.RECORDING: "recording the stop",
          ev.Ending.SIGNALLING: "signalling the run's processes"}
OWN_STEPS = (ev.Ending.CONNECTING, ev.Ending.RECORDING, ev.Ending.SIGNALLING)  # before SIGTERM


def wait_words(event: ev.Event) -> str | None:
    """The words of a wait under way that an event changes (a spinner's line on a terminal),
    or None: `stopping: 3/4 nodes done; node2: torchrun still ending its workers (SIGTERM 2 s
    ago)`."""
    if not isinstance(event, ev.Stopping):
        return None
    head = f"stopping: {event.done}/{event.total} nodes done"
    if not event.host or event.ending is None:
        return head
    what = ENDING[event.ending].format(n=event.count)
    if event.ending in OWN_STEPS:
        return f"{head}; {event.host}: {what} ({event.since:.0f} s)"
    return f"{head}; {event.host}: {what} (SIGTERM {event.since:.0f} s ago)"


def stopped(s: Stopped) -> str:
    """What a teardown's stop achieved, for the person (and `Interrupted`'s message)."""
    if s.job:
        if s.problems:
            return (f"Slurm job {s.job} could not be cancelled ({dict(s.problems)['slurm']}); "
                    f"finish with `fleet stop {s.run_id}`")
        return f"Slurm job {s.job} was cancelled" + (f" ({s.state})" if s.state else "")
    if not s.problems:
        return "the job was stopped on every node"
    names = ", ".join(n for n, _ in s.problems)
    return (f"the job could not be stopped on {names} (it may still run there); finish the "
            f"stop with `fleet stop {s.run_id}` once it answers")


def halted(s: Stopped) -> str:
    """What the watchdog's stop did, for the verdict of a hung run."""
    if s.problems:
        return stopped(s)
    return f"Slurm job {s.job} was cancelled" if s.job else "it was stopped on every node"


def forgotten(f: Forgotten) -> str:
    if f.maybe_queued:
        return (f"sbatch gave no job id: Slurm may still have queued the job (`squeue --name "
                f"{f.maybe_queued}` on the login node); its directory {f.kept} and this run's "
                "record are kept for it")
    if f.scheduler:
        return f"nothing had been submitted to {f.scheduler}"
    return "nothing had been started on any node"


def detached(d: Detached) -> str:
    follow = f"follow it with `fleet logs -f {d.run_id}`"
    if not d.job:
        return f"run {d.run_id} started; {follow}"
    if d.queued:
        where = f"Slurm job {d.job} had not started after {d.waited:.0f}s"
    elif d.started < d.of:
        where = f"{d.started} of {d.of} node(s) had started after {d.waited:.0f}s"
    else:
        where = f"every node ({d.of}) started"
    return f"run {d.run_id} submitted, {where}; {follow}"
