"""The whole application: every command on fleet.cli.app's `app`, in the order `fleet --help`
lists them. Loading it stays cheap (no paramiko, jinja2 or backend): each command imports what
it needs when it runs."""

from __future__ import annotations

from fleet.cli import (
    doctor,
    execute,
    forward,
    gpus,
    job_commands,
    leases,
    pull,
    queue,
    run_commands,
    top,
    ui,
    usage,
)
from fleet.cli.app import app

__all__ = ["app", "doctor", "execute", "forward", "gpus", "job_commands", "leases", "pull",
           "queue", "run_commands", "top", "ui", "usage"]

# What goes around a run, after the commands the modules above added.
app.command("pull")(pull.pull)
app.command("forward")(forward.forward)
app.command("exec")(execute.execute)
app.command("doctor")(doctor.doctor)
app.command("top")(top.top)
app.command("ui")(ui.ui)
# Sharing a lab's GPUs.
app.command("gpus")(gpus.gpus)
app.command("usage")(usage.usage)
app.command("reserve")(leases.reserve)
app.command("release")(leases.release)
# Queued runs, placed on free GPUs by the hosts themselves.
app.command("submit")(queue.submit)
app.command("sweep")(queue.sweep)
app.command("queue")(queue.queue)
