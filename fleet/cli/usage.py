"""`fleet usage`: GPU-hours per user, host and job over a window, from this machine's records
(fleet.run.usage), never a host asked. fleet.cli adds it to the app beside `fleet gpus`."""

from __future__ import annotations

import json
import textwrap
import time
from typing import TYPE_CHECKING, Annotated

import typer

from fleet.cli.app import echo
from fleet.errors import UsageError

if TYPE_CHECKING:
    from fleet.run.usage import Row, Usage

WIDTH = 80
NAME_MAX = 28  # a name's column (the JSON has it whole): the table stays within 80 columns


def usage(since: Annotated[str, typer.Option(
              "--since", metavar="DURATION",
              help="The window, back from now: 30d, 12h, 90m.")] = "30d",
          as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")
                             ] = False) -> None:
    """Show GPU-hours by user, host and job, from this machine's records.

    A run's part on a node counts its GPUs (the inventory's `gpus` for that host, else a
    CUDA_VISIBLE_DEVICES in its env, as the run's record keeps them) from the run's start to
    its end as fleet saw it; only the part inside the window counts. A run still running counts
    to now, and is said to. Where neither names the GPUs, fleet never recorded how many the run
    used: that part is named as unknown, never guessed. Queued runs (fleet sweep, fleet
    submit) count as their sweep's record has them."""
    from fleet.run.usage import as_json as usage_json
    from fleet.run.usage import usage as measure
    from fleet.timespan import parse_duration

    seconds = parse_duration(since)
    if seconds is None or seconds <= 0:
        raise UsageError(f"--since {since!r}: a duration back from now (30d, 12h, 90m)")
    found = measure(seconds, time.time())
    if as_json:
        print(json.dumps(usage_json(found)), flush=True)
        return
    for line in lines(found, since):
        echo(line)


def lines(u: Usage, since: str) -> list[str]:
    """The three tables (by user, host and job), the total and the footnotes."""
    from fleet.console import Console
    from fleet.run.record import state_dir

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))

    out = textwrap.wrap(f"GPU-hours, last {since}: {when(u.since)} to {when(u.until)}, "
                        "from records here", WIDTH)
    if not u.total.runs:
        out.append("no run recorded here ran in that window")
    console, state = Console(), str(state_dir().parent)
    for title, rows in (("USER", u.users), ("HOST", u.hosts), ("JOB", u.jobs)):
        if rows:
            out += ["", console.table((title, "GPU-HOURS", "RUNS", "NOTE"),
                                      [_row(r) for r in rows])]
    t = u.total
    if t.runs:
        running = f", {len(t.running)} still running (counted to now)" if t.running else ""
        out += ["", f"total: {t.gpu_hours:.2f} GPU-hours in {_runs(len(t.runs))}{running}"]
    notes = []
    if t.unknown:
        notes.append(f"unknown GPUs: {_runs(len(t.unknown))} ran {t.unknown_node_hours:.2f} "
                     "node-hours on hosts where fleet recorded no GPU count (no `gpus` chosen "
                     "there), not counted: set `gpus` for those hosts to count them")
    if u.not_counted:
        notes.append(f"not counted: {_runs(len(u.not_counted))} on Slurm, whose GPUs fleet does "
                     f"not record ({', '.join(u.not_counted)})")
    out += [line for n in notes for line in textwrap.wrap(
        n, WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)]
    if u.damaged:  # one line, whatever its length: paths are not broken
        out.append(f"damaged records skipped (under {state}): "
                   f"{', '.join(sorted(_under(p, state) for p in u.damaged))}")
    return out


def _under(path: str, root: str) -> str:
    return path[len(root) + 1:] if path.startswith(root + "/") else path


def _row(r: Row) -> list[str]:
    name = r.name if len(r.name) <= NAME_MAX else r.name[:NAME_MAX - 3] + "..."
    notes = ([f"{len(r.running)} running"] if r.running else []) + (
        [f"{len(r.unknown)} GPU count unknown"] if r.unknown else [])
    return [name or "?", f"{r.gpu_hours:.2f}", str(len(r.runs)), ", ".join(notes)]


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"
