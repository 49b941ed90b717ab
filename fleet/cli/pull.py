"""`fleet pull`: a run's outputs from the nodes that hold them to this machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleet.cli.app import RUN_HELP, complete_run
from fleet.errors import NotEveryNode, PullFailed, UsageError

if TYPE_CHECKING:
    from fleet.transport.transfer.pull import Pulled


def pull(run_id: Annotated[str | None, typer.Argument(
             metavar="RUN", autocompletion=complete_run,
             help=f"{RUN_HELP}; default: the latest run (name it to give PATHs).")] = None,
         paths: Annotated[list[str] | None, typer.Argument(
             metavar="[PATH...]", show_default=False,
             help="Files or directories under the job's directory on the node; default: the "
                  "job's `outputs`.")] = None,
         to: Annotated[Path | None, typer.Option(
             "--to", metavar="DIR", help="Where they go; default: ./<run id>/. fleet up never "
                                         "syncs it (it holds a .fleet-pulled mark).")] = None,
         every: Annotated[bool, typer.Option(
             "--all", help="From every node, each into DIR/<node>/ (default: the master "
                           "only).")] = False,
         ) -> None:
    """Copy a run's outputs from the nodes to here.

    Streamed and verified; files already here (same size and sha256) are not fetched again,
    and a pull that was interrupted resumes where it stopped. The destination gets a
    `.fleet-pulled` mark first: a later `fleet up` leaves the folder out of the sync (results
    pulled into the job's folder are never sent to every node again)."""
    from fleet import backends
    from fleet import manifest as fleet_manifest
    from fleet.config.outputs import output_path
    from fleet.console import Console, Meaning, printable
    from fleet.lifecycle import attempts
    from fleet.run import record as state
    from fleet.transport.group import reason
    from fleet.transport.ignore import PULLED, mark_pulled
    from fleet.transport.transfer.pull import Pulled

    try:
        rels = [output_path(p) for p in paths or []]
    except ValueError as e:
        raise UsageError(str(e)) from None
    rec = state.load(run_id)
    last = attempts.records(rec)[-1]  # a restarted run's outputs are where its last attempt ran
    dest = to if to is not None else Path.cwd() / rec.run_id
    if dest.is_symlink() and not dest.exists() or dest.exists() and not dest.is_dir():
        raise UsageError(f"--to {dest}: not a directory")
    made = not dest.exists()
    try:
        mark_pulled(dest, rec.run_id)
    except OSError as e:
        raise UsageError(f"--to {dest}: cannot write its {PULLED} mark: {e.strerror}") from None
    console = Console()
    try:
        results = backends.for_record(last).pull(last, console, rels, dest, every)
    finally:
        if made and [p.name for p in dest.iterdir()] == [PULLED]:  # nothing came: leave none
            (dest / PULLED).unlink()
            dest.rmdir()
    failed = unreachable = 0
    for host, r in results.items():
        if isinstance(r, Exception):
            unreachable += 1
            console.phase(host, f"not pulled: {reason(r)}", Meaning.FAIL)
            continue
        for note in r.notes:
            console.phase(host, printable(note), Meaning.WARN)
        for problem in r.problems:
            console.phase(host, printable(problem), Meaning.FAIL)
        failed += bool(r.problems)
        console.phase(host, summary(r), Meaning.FAIL if r.problems else Meaning.OK)
    fleet_manifest.record_pulled(last.dir, {h: (r.dest, r.files) for h, r in results.items()
                                            if isinstance(r, Pulled) and r.files})
    if failed:
        raise PullFailed(f"run {rec.run_id}: {failed} node(s) did not give all that was asked")
    if unreachable:
        raise NotEveryNode(f"run {rec.run_id}: {unreachable} node(s) could not be asked")


def summary(r: Pulled) -> str:
    """`2 file(s) fetched into DIR (61.0 MB: 30.0 MB sent, 31.0 MB already here); 1 unchanged`."""
    from fleet.transport.transfer import human

    size = sum(r.files.values())
    fetched = (f"{r.fetched} file(s) fetched" if r.fetched else "nothing fetched")
    moved = f"{human(r.received)} sent"
    if r.kept:
        moved += f", {human(r.kept)} already here from an earlier pull"
    words = f"{fetched} into {r.dest} ({moved})"
    if r.unchanged:
        words += f"; {r.unchanged} file(s) unchanged, not fetched again"
    return f"{words}; {len(r.files)} file(s), {human(size)} in place"
