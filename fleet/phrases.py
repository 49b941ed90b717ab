"""The words the terminal shows for a run's typed events (fleet.events) and for what the
seam returns as data: made here, at the edge, never by a backend or the runner."""

from __future__ import annotations

from fleet import events as ev
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
        return [(event.host, f"{event.label}: sent {event.files} file(s), {event.size} bytes "
                             f"({event.unchanged} unchanged, {event.seconds:.2f}s)",
                 ev.Tone.PLAIN)]
    if isinstance(event, ev.Attempt):
        return [("", f"restart: attempt {event.number}/{event.of} in {event.wait:g}s "
                     f"({event.why})", ev.Tone.PLAIN)]
    if isinstance(event, ev.Verdict) and event.words:
        if event.status is RunStatus.SUCCEEDED:
            return [("", event.words, ev.Tone.OK)]
        if event.status is RunStatus.RUNNING:  # detached: it goes on without fleet
            return [("", event.words, ev.Tone.PLAIN)]
    return []
