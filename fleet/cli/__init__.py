"""The command line: the only package that knows typer, prints errors and picks exit codes.

Commands raise FleetError subclasses; `main` is the one handler that turns them into a message
and an exit code (fleet.errors.ExitCode: 0 ok, 1 failed, 2 bad input, 3 hosts unreachable or
state unknown, 4 stopped, 5 a host not ready for the job, 6 hosts busy with another run, 7 a
node altered the data it relayed, 70 a bug in fleet, 130 interrupted), and never shows a
Python traceback unless asked (`--debug`).

This module loads nothing but the standard library and fleet.errors, and the commands only once
`main` catches signals; a Ctrl-C before that (while Python loads fleet) is caught by the
package's own first lines (fleet/__init__.py): an interruption like any other. The
command modules import what a command needs (paramiko, jinja2, the backends) inside it, so that
`--version`, `--help` and shell completion start fast (tests/unit/test_fast_start.py)."""

from __future__ import annotations

import atexit
import gc
import itertools
import os
import signal
import sys
from types import FrameType

from fleet.errors import FleetError, InternalError, Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    """Once the command has ended, a signal (a second Ctrl-C while the message is printed, or
    while Python waits for a thread at exit) ends fleet at once, without a word."""
    os._exit(Interrupted.exit_code)


def main() -> None:
    """The one handler: every FleetError becomes its message and exit code; anything else is a
    bug in fleet (an InternalError), said in one line (with the traceback under --debug)."""
    args = sys.argv[1:]
    # fleet's own --debug comes before the command (`fleet up --debug` is the job's debug env)
    lead = list(itertools.takewhile(lambda a: a.startswith("-") and a != "--", args))
    debug = "--debug" in lead or bool(os.environ.get("FLEET_DEBUG"))
    if debug:  # what the console hides for a person's sake, it shows (torchrun's banners)
        os.environ["FLEET_DEBUG"] = "1"
    if lead and set(lead) <= {"--version", "-V", "--debug"} and set(lead) & {"--version", "-V"} \
            and "_FLEET_COMPLETE" not in os.environ:
        from fleet import __version__  # what typer's --version says, without loading typer

        print(f"fleet {__version__}")
        return
    for sig in SIGNALS:
        signal.signal(sig, _interrupt)
    quick_start()
    try:
        failure = _run(debug)
    except Interrupted as e:  # the signal came in the instant _run was leaving
        failure = e
    finally:  # a signal from here on ends fleet at once, held back while the handlers change
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        for sig in SIGNALS:
            signal.signal(sig, _exit_now)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        gc.enable()
    if failure is None:
        return
    if debug:
        import traceback

        traceback.print_exception(failure)
    if isinstance(failure, Interrupted):
        said = f"fleet: {failure}"
    elif isinstance(failure, InternalError):
        said = f"fleet: internal error: {failure}"
    else:
        said = f"fleet: error: {failure}"
    from fleet.console import printable  # here, not at the top: rich is not needed to start
    # Any text may hold what a node said (a host key's error, a stack): shown, never obeyed.
    print(printable(said, lines=True), file=sys.stderr)
    sys.exit(failure.exit_code)


def quick_start() -> None:
    """The start's share of the garbage collector, spared: what loading the command line creates
    lives until fleet exits, so no collection runs before a command does (the app's callback
    turns it back on) and none at the interpreter's exit either (everything is frozen first):
    about a tenth of a `--help`'s CPU (docs/BENCHMARKS.md, "start")."""
    gc.disable()
    atexit.unregister(gc.freeze)  # once, however often main runs in one process (tests)
    atexit.register(gc.freeze)
def program() -> None:
    """The process itself (`fleet`, `python -m fleet`): main, then out at once. Everything fleet
    keeps is written and closed by then (the run's record first of all), and every thread left
    is a daemon the interpreter would drop anyway; what Python's own finalization would add is
    freeing every module fleet loaded, about 0.3 s on a loaded machine after the last word."""
    code: int = 0
    try:
        main()
    except SystemExit as e:  # as the interpreter turns it into a status
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`fleet ps | head`): nothing to say more
            code = code or 1
    os._exit(code)


def _run(debug: bool) -> FleetError | Interrupted | None:
    """The command line's command, run; what ended it, if not its success (click's own exit,
    a SystemExit, goes through)."""
    try:
        _quiet_libraries(debug)
        from fleet.cli.commands import app
        app()
    except (FleetError, Interrupted) as e:
        return e
    except Exception as e:
        bug = InternalError(f"{type(e).__name__}: {e} (a bug in fleet; `fleet --debug ...` "
                            "shows where)")
        bug.__cause__ = e
        return bug
    return None


def _quiet_libraries(debug: bool) -> None:
    """paramiko logs what its transport thread meets (a banner read from a node whose sshd went
    away) with a traceback; without a handler Python prints that on stderr, beside fleet's own
    words about the same node. fleet says what failed in its words; --debug shows paramiko's."""
    import logging  # here: the fewer modules before main() catches signals, the better

    handler: logging.Handler = logging.StreamHandler() if debug else logging.NullHandler()
    logging.getLogger("paramiko").addHandler(handler)
