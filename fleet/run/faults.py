"""Fault points for the end-to-end fault tests: `FLEET_FAULT=<phase>:<action>` makes fleet hurt
itself at that phase boundary of `fleet up` (or, for `preflight-listening`, in the port checks
once a test listener runs; for `upload-listed`, in each node's upload between its listing and
its bundle). Without the variable, a point does nothing.

Actions: kill (SIGKILL itself), int (one SIGINT), int2 (two SIGINTs 5 ms apart, as `timeout` or
a terminal multiplexer sends them), term (SIGTERM), raise (an unexpected exception), pause (say
so on stderr and wait, at most 120 s, until the file named by FLEET_FAULT_RESUME exists: the test
then cuts a link or kills an sshd)."""

from __future__ import annotations

import os
import signal
import sys
import time
from enum import Enum


class Phase(Enum):
    """Where `fleet up` is; a fault test can strike at each boundary."""

    CONNECT = "connect"
    PROBE = "probe"
    PREFLIGHT = "preflight"
    UPLOAD = "upload"
    SETUP = "setup"  # struck from the setup's first line of output (hosts.setup)
    MASTER_START = "master-start"
    WORKER_START = "worker-start"
    STREAM = "stream"
    STOP = "stop"


class Action(Enum):
    """What a fault point does (FLEET_FAULT's word after the colon)."""

    KILL = "kill"
    INT = "int"
    INT2 = "int2"
    TERM = "term"
    RAISE = "raise"
    PAUSE = "pause"


def point(phase: str) -> None:
    spec = os.environ.get("FLEET_FAULT", "")
    if not spec:
        return
    want, _, word = spec.partition(":")
    if want != phase:
        return
    try:
        action = Action(word)
    except ValueError:
        # A test's typo must fail the test, not leave the fault out and pass.
        raise RuntimeError(f"FLEET_FAULT={spec!r}: {word!r} is none of "
                           f"{', '.join(a.value for a in Action)}") from None
    me = os.getpid()
    if action is Action.KILL:
        os.kill(me, signal.SIGKILL)
    elif action is Action.INT:
        os.kill(me, signal.SIGINT)
    elif action is Action.INT2:
        os.kill(me, signal.SIGINT)
        time.sleep(0.005)
        os.kill(me, signal.SIGINT)
    elif action is Action.TERM:
        os.kill(me, signal.SIGTERM)
    elif action is Action.RAISE:
        raise RuntimeError(f"injected fault at {phase}")
    elif action is Action.PAUSE:
        print(f"fleet: fault point {phase} reached", file=sys.stderr, flush=True)
        resume = os.environ.get("FLEET_FAULT_RESUME", "")
        deadline = time.monotonic() + 120
        while resume and not os.path.exists(resume) and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(0.05)  # let a signal sent to itself arrive here, at the boundary
