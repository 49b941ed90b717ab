"""The command line: the only package that knows typer, prints errors and picks exit codes.

Commands raise FleetError subclasses; `main` is the one handler that turns them into a message
and an exit code (fleet.errors.ExitCode: 0 ok, 1 failed, 2 bad input, 3 hosts unreachable or
state unknown, 4 stopped, 5 a host not ready for the job, 6 hosts busy with another run, 7 a
node altered the data it relayed, 70 a bug in fleet, 130 interrupted), and never shows a
Python traceback unless asked (`--debug`)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys
import traceback
from types import FrameType

from fleet.cli import execute, forward, gpus, job_commands, pull, run_commands
from fleet.cli.app import app, echo
from fleet.errors import FleetError, InternalError, Interrupted

__all__ = ["app", "execute", "forward", "gpus", "job_commands", "main", "pull", "run_commands"]

# What goes around a run, after the commands the modules above added (`fleet --help` lists
# commands in the order they are added).
app.command("pull")(pull.pull)
app.command("forward")(forward.forward)
app.command("exec")(execute.execute)
# Sharing a lab's GPUs.
app.command("gpus")(gpus.gpus)
app.command("reserve")(gpus.reserve)
app.command("release")(gpus.release)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def main() -> None:
    """The one handler: every FleetError becomes its message and exit code; anything else is a
    bug in fleet (an InternalError), said in one line (with the traceback under --debug)."""
    args = sys.argv[1:]
    # fleet's own --debug comes before the command (`fleet up --debug` is the job's debug env)
    lead = list(itertools.takewhile(lambda a: a.startswith("-") and a != "--", args))
    debug = "--debug" in lead or bool(os.environ.get("FLEET_DEBUG"))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    _quiet_libraries(debug)
    try:
        try:
            app()
        except (FleetError, Interrupted):
            raise
        except Exception as e:
            raise InternalError(f"{type(e).__name__}: {e} (a bug in fleet; `fleet --debug "
                                "...` shows where)") from e
    except Interrupted as e:
        _trace(debug)
        echo(f"fleet: {e}", err=True)
        sys.exit(e.exit_code)
    except InternalError as e:
        _trace(debug)
        echo(f"fleet: internal error: {e}", err=True)
        sys.exit(e.exit_code)
    except FleetError as e:
        _trace(debug)
        echo(f"fleet: error: {e}", err=True)
        sys.exit(e.exit_code)


def _quiet_libraries(debug: bool) -> None:
    """paramiko logs what its transport thread meets (a banner read from a node whose sshd went
    away) with a traceback; without a handler Python prints that on stderr, beside fleet's own
    words about the same node. fleet says what failed in its words; --debug shows paramiko's."""
    handler: logging.Handler = logging.StreamHandler() if debug else logging.NullHandler()
    logging.getLogger("paramiko").addHandler(handler)


def _trace(debug: bool) -> None:
    if debug:
        traceback.print_exc()
