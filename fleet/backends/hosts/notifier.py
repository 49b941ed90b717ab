"""A detached run's `[notify]` on SSH hosts: the watcher (fleet/nodeside/notify_watch.py)
started on the master beside the run, which tells the webhook of the master's end without
fleet, where `from_master = true` lets the webhook go there. What it cannot do is said, never
left out: the local command runs on the laptop only, and the other nodes' ends are not
watched."""

from __future__ import annotations

import hashlib
import json

from fleet.config.notify import Notify, redact
from fleet.errors import FleetError
from fleet.nodeside import python_program
from fleet.nodeside.shared import nodemap
from fleet.shell import quote
from fleet.transport import Transport
from fleet.transport.group import reason

CONFIG = nodemap.NOTIFY_JSON  # in the master's run directory, until the watcher has read it


def watch_script(python: str, run_dir: str, pid: int) -> str:
    """sh text that starts the watcher in a session of its own, detached from this connection
    and outside the run's environment (a stop of the run leaves it be)."""
    program = python_program(quote(python), "notify_watch.py", run_dir, pid, flags=("-I", "-S"),
                             redirect="< /dev/null > /dev/null 2>&1")
    return f"( setsid {program}\n) < /dev/null > /dev/null 2>&1 &"


def config(cfg: Notify, run_id: str, job: str, node: str, key: str) -> bytes:
    """What the watcher reads: where to post and how, and the proof of fleet's stop records
    (a hash of the line `key=<stop key>`: the key itself never lies on the node)."""
    assert cfg.webhook is not None
    return json.dumps({"webhook": cfg.webhook, "format": cfg.format.value, "run_id": run_id,
                       "job": job, "node": node, "where": redact(cfg.webhook),
                       "proof": hashlib.sha256(f"key={key}".encode()).hexdigest()}).encode()


def start_watch(t: Transport, cfg: Notify, run_dir: str, pid: int, run_id: str, job: str,
                key: str) -> str:
    """Start the master's watcher where there is a webhook; what to say of the detached run's
    notifications (a warning where the watcher could not be started)."""
    node = t.host.name
    command = (" [notify] command runs only while fleet is attached (it is a program on this "
               "machine)" if cfg.command else "")
    if cfg.webhook is None:
        return f"warning: notify: a detached run sends no notification:{command}"
    if not cfg.from_master:  # the webhook is a secret: it leaves this machine only when asked
        return ("warning: notify: a detached run sends no notification: its webhook stays on "
                "this machine unless [notify] says `from_master = true` (the master then holds "
                f"it, to tell of the run's end){';' + command if command else ''}")
    try:
        t.write(f"{run_dir}/{CONFIG}", config(cfg, run_id, job, node, key), 0o600)
        t.run(watch_script(t.path(t.host.python), run_dir, pid), timeout=30,
              what="start the notify watcher").check(node)
    except FleetError as e:
        return f"warning: notify: the watcher on {node} could not be started: {reason(e)}"
    return (f"notify: {node} (the master) tells {redact(cfg.webhook)} when its part of the run "
            "ends (it sees its own end only; no hang watchdog without fleet)"
            + (f";{command}" if command else ""))
