"""Word of a run's end (`[notify]`): the message from what fleet knows once the final state is
decided, sent to a webhook (Slack, ntfy or plain JSON) and/or given to a local command. Each
is bounded in time (TIMEOUT_S); a notification that fails is a warning, never the run's exit
code. A detached run's word comes from the watcher on its master (fleet/nodeside/notify_watch.py),
which builds the same message from what the master knows."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from enum import Enum

from fleet.config.notify import Format, Notify, redact
from fleet.console import Console, Meaning, printable
from fleet.errors import Interrupted, RunStopped
from fleet.nodeside import notify_watch
from fleet.nodeside.shared import run_end

TIMEOUT_S = 10.0  # one webhook POST (all of it: connect, TLS, answer), or the local command
TRACE_LINES = 30  # of the first failure's report, the message keeps at most this many lines


class NoticeState(Enum):
    """How a run ended, as its notice says it. Its word goes out as it is (the headline, the
    JSON body's `state`, FLEET_STATE); a detached run's watcher on its master
    (fleet/nodeside/notify_watch.py) sends the same words."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    HUNG = "hung"  # the watchdog found no output for hang_timeout
    STOPPED = "stopped"  # by a person, `fleet stop` or a signal to fleet
    UNKNOWN = "unknown"  # fleet lost sight of a node


@dataclass(frozen=True)
class Notice:
    """What a run's end says: `state` how it ended; `said`
    fleet's own last words on it; `failure` the first failing rank's report (where, which rank,
    its traceback's last lines); `hang` the watchdog's verdict; `stragglers` the lines of the
    ranks the straggler watch named, in order."""

    run_id: str
    job: str
    state: NoticeState
    seconds: float
    said: str
    failure: tuple[str, ...] = ()
    hang: str | None = None
    stragglers: tuple[str, ...] = ()


@dataclass
class Told:
    """What the runner learns of a run for its end's notice, as it goes: its id once prepared
    (a restart's first attempt's), its last attempt's first failure and hang verdict, and the
    final state's words once decided (conclude); the stragglers named in any attempt."""

    job: str
    started: float
    run_id: str = ""
    detached: bool = False  # fleet does not see its end: the master's watcher tells
    state: NoticeState | None = None  # None: not decided yet
    said: str = ""
    failure: tuple[str, ...] = ()
    hang: str | None = None
    stragglers: list[str] = field(default_factory=list)


def notice(told: Told, exc: BaseException | None, now: float) -> Notice | None:
    """The notice for `fleet up`'s end, with `exc` the error it ends with (None: success);
    None where there is nothing to tell (no run was prepared, or it was detached)."""
    if not told.run_id or told.detached:
        return None
    state, said = told.state, told.said
    if exc is not None and not said:  # it ended before the final state was decided
        said = str(exc)
        state = NoticeState.STOPPED if isinstance(exc, (Interrupted, RunStopped)) else \
            NoticeState.HUNG if told.hang else NoticeState.FAILED
    return Notice(told.run_id, told.job, state or NoticeState.SUCCEEDED, now - told.started,
                  said, told.failure, told.hang, tuple(told.stragglers))


def tell(cfg: Notify, told: Told, exc: BaseException | None, console: Console) -> None:
    """Send the notice of `fleet up`'s end, if `[notify]` asks for one; never raises."""
    n = notice(told, exc, time.time()) if cfg.wanted else None
    if n is None:
        return
    try:
        send(cfg, n, console)
    except Exception as e:  # word of the end must never change it
        console.info(f"warning: notify: not sent ({type(e).__name__}: {e})", Meaning.WARN)


def headline(n: Notice) -> str:
    return run_end.headline(n.run_id, n.job, n.state.value, n.seconds)


def message(n: Notice) -> str:
    """The text every notifier sends: the headline, fleet's last words, the hang verdict, the
    stragglers named, the first failure's report (its last TRACE_LINES lines)."""
    lines = [headline(n), n.said]
    if n.hang and n.hang not in n.said:
        lines.append(f"hang: {n.hang}")
    lines += [f"straggler: {printable(line)}" for line in n.stragglers]
    failure = [printable(line) for line in n.failure]  # a node's words: shown, never obeyed
    if len(failure) > TRACE_LINES:
        failure = [failure[0], f"    ... ({len(failure) - TRACE_LINES} line(s) left out)",
                   *failure[-(TRACE_LINES - 1):]]
    return "\n".join(lines + failure)


def request(url: str, fmt: Format, n: Notice) -> urllib.request.Request:
    """The webhook's POST for the notice, in the format asked for."""
    text = message(n)
    if fmt is Format.NTFY:
        # ntfy takes the body as the message; a header must be latin-1 (the run id is ASCII).
        title = headline(n).encode("latin-1", "replace").decode("latin-1")
        return urllib.request.Request(url, text.encode(), method="POST", headers={
            "Title": title, "Content-Type": "text/plain; charset=utf-8"})
    body: dict[str, object] = {"text": text}
    if fmt is Format.JSON:
        body.update(run=n.run_id, job=n.job, state=n.state.value, seconds=round(n.seconds, 1),
                    said=n.said, failure=list(n.failure), hang=n.hang,
                    stragglers=list(n.stragglers))
    return urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                  headers={"Content-Type": "application/json"})


def post(url: str, fmt: Format, n: Notice) -> str | None:
    """POST the notice; None where the webhook took it, else why not (never the URL whole).
    The whole send is bounded by TIMEOUT_S (the node-side watcher's post, shared)."""
    return notify_watch.post(request(url, fmt, n), TIMEOUT_S)


def env(n: Notice) -> dict[str, str]:
    """What the local command finds in its environment, beside the message on its stdin."""
    return {"FLEET_RUN": n.run_id, "FLEET_JOB": n.job, "FLEET_STATE": n.state.value,
            "FLEET_SECONDS": str(int(n.seconds)), "FLEET_SUMMARY": headline(n)}


def run_command(argv: tuple[str, ...], n: Notice) -> str | None:
    """Run the local command with the message on its stdin; None where it exited 0."""
    try:
        r = subprocess.run(argv, input=message(n), text=True, env={**os.environ, **env(n)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"it was still running after {TIMEOUT_S:g}s and was killed"
    except OSError as e:
        return f"it could not be started ({e.strerror or e})"
    if r.returncode != 0:
        err = r.stderr.strip().splitlines()
        return f"it exited {r.returncode}" + (f" ({err[-1][:200]})" if err else "")
    return None


def send(cfg: Notify, n: Notice, console: Console) -> None:
    """Send the notice where `[notify]` says; each failure is a warning line."""
    if cfg.webhook is not None:
        where = redact(cfg.webhook)
        with console.waiting(f"notify: telling {where} (at most {TIMEOUT_S:g} s)"):
            why = post(cfg.webhook, cfg.format, n)
        if why is None:
            console.info(f"notify: told {where} that run {n.run_id} {n.state.value}")
        else:
            console.info(f"warning: notify: {where} was not told: {why}", Meaning.WARN)
    if cfg.command:
        with console.waiting(f"notify: running `{cfg.command[0]}` (at most {TIMEOUT_S:g} s)"):
            why = run_command(cfg.command, n)
        if why is None:
            console.info(f"notify: ran `{cfg.command[0]}`")
        else:
            console.info(f"warning: notify: the command `{cfg.command[0]}` failed: {why}",
                         Meaning.WARN)
