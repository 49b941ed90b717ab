"""The commands about a recorded run: status, ps, logs, stop, rm, show, diff, dump; each asks
the backend that ran it (the run record says which)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Annotated

import typer

from fleet import waits
from fleet.cli.app import RUN_HELP, RunArg, app, complete_run, echo, inventory_given
from fleet.errors import FleetError, NotEveryNode


@app.command()
def stop(run_id: RunArg = None) -> None:
    """Stop a run on every host.

    SIGTERM, then SIGKILL after a grace period."""
    from fleet import backends
    from fleet.console import Console
    from fleet.lifecycle import answers, attempts
    from fleet.run import record as state

    run = state.load(run_id)
    attempts.request_stop(run)  # with [restart]: no attempt after this one
    console = Console()
    with waits.shown_by(console.hosts_waiting):
        with contextlib.suppress(FleetError):  # the attempt its nodes started, stopped too
            backends.for_record(run).take_healed(run)
        every = attempts.records(run)
        for rec in reversed(every[:-1]):  # an earlier attempt's lost node may still run its part
            backend = backends.for_record(rec)
            if not backend.state(rec).status.is_terminal:
                backend.cancel(rec, console)
    backends.for_record(every[-1]).cancel(every[-1], console)  # the attempt under way
    answers.keep_seen(every[0], every[-1], "fleet stop")


@app.command()
def rm(run_id: Annotated[str, typer.Argument(metavar="RUN", autocompletion=complete_run,
                                             help=f"{RUN_HELP}.")],
       forget: Annotated[bool, typer.Option(
           "--forget", help="Drop only the local record, asking no host (hosts that are gone "
                            "for good); says which hosts and run directories may keep what "
                            "the run left.")] = False) -> None:
    """Remove a finished run, from the nodes and from here.

    Its directory on every node and its local record."""
    from fleet import backends
    from fleet.console import Console
    from fleet.lifecycle import attempts
    from fleet.run import record as state

    console = Console()
    rec = state.load(run_id)
    every = attempts.records(rec)
    if forget:
        from fleet.cli import run_answers

        run_answers.forget(rec, every, console)
        return
    for one in reversed(every):  # the first attempt's record, the run's own, goes last
        try:
            backends.for_record(one).delete(one, console)
        except NotEveryNode as e:
            raise NotEveryNode(f"{e}; if those hosts are gone for good, `fleet rm --forget "
                               f"{rec.run_id}` drops the local record alone and says what "
                               "may be left where") from None
        shutil.rmtree(one.dir, ignore_errors=True)
    console.info(f"run {rec.run_id} removed" + (f" ({len(every)} attempts)"
                                                if len(every) > 1 else ""))


@app.command()
def status(run_id: RunArg = None,
           as_json: Annotated[bool, typer.Option(
               "--json", help="The same as one JSON object: the run's state, its exit code, "
                              "each node's outcome (docs/EVENTS.md).")] = False) -> None:
    """Show each node's state for a run.

    A run whose end fleet saw is said from its local record alone (no host asked); a live
    one's nodes are asked at once, a few seconds each at most. Exits 0 if it runs or succeeded,
    1 failed, 3 unknown (a node could not be asked), 4 stopped."""
    from fleet.cli import run_answers

    code = run_answers.status(run_id, as_json)
    if code:
        raise typer.Exit(code)


@app.command()
def ps(all_runs: Annotated[bool, typer.Option("--all", help="Every recorded run, "
                                               "not only the last 10.")] = False,
       hosts: Annotated[Path | None, typer.Option(
           "--hosts", callback=inventory_given,
           help="Instead: the runs alive on the hosts of this inventory, whoever "
                "started them.")] = None) -> None:
    """List the recorded runs, newest last, each with its state.

    A finished run's state is its record's; only live runs are asked, all at once."""
    from fleet.cli import listing
    from fleet.run import record as state

    if hosts is not None:
        code = listing.alive(hosts)
        if code:
            raise typer.Exit(code)
        return
    runs, damaged = state.all_runs()
    for path, why in damaged.items():
        echo(f"fleet: skipping a damaged run record {path} ({why})", err=True)
    listing.runs(runs, all_runs)


@app.command()
def logs(run_id: RunArg = None,
         follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following a live "
                                              "run; at its end, say its state and exit with "
                                              "its code (as `fleet status`).")] = False,
         node: Annotated[str | None, typer.Option("--node", help="Only this host.")] = None,
         rank: Annotated[int | None, typer.Option("--rank", help="Only this global rank.")] = None,
         attempt: Annotated[int | None, typer.Option(
             "--attempt", help="With [restart]: only this attempt (default: every one, in "
                               "order).")] = None,
         merge: Annotated[bool, typer.Option("--merge", help="Every host's lines in one stream, "
                                             "by when each was written (each node's clock "
                                             "offset taken off).")] = False,
         tail: Annotated[int | None, typer.Option("--tail", min=0, help="Only the last N lines "
                                                  "of each host (of the stream, with --merge); "
                                                  "-f follows on from them.")] = None,
         since: Annotated[str | None, typer.Option("--since", help="Only lines written at or "
                                                   "after this: 30s, 10m, 2h, 1d back, or an "
                                                   "ISO time (2026-11-24T10:00).")] = None,
         as_json: Annotated[bool, typer.Option(
             "--json", help="Events on stdout, one JSON object a line (docs/EVENTS.md): each "
                            "log line, and with -f the run's verdict.")] = False,
         ) -> None:
    """Print a run's logs from the nodes.

    From the start; -f follows a live run to its end, then says the run's state and exits with
    its code (0 succeeded, 1 failed, 3 unknown, 4 stopped)."""
    from fleet.lifecycle.session import Session

    with Session.for_command(as_json) as session:
        from fleet.cli import run_views

        code = run_views.logs(session.console, run_id, follow, node, rank, attempt, merge,
                              tail, since)
    if code:
        raise typer.Exit(code)


@app.command()
def show(run_id: RunArg = None,
         as_json: Annotated[bool, typer.Option("--json", help="The manifest as JSON.")] = False,
         ) -> None:
    """Show exactly what a run ran.

    Job and inventory, each node's env, command and versions, the code's commit and diff, the
    synced files' hashes, setup (on Slurm: the job id, the script's env and command, the
    nodes)."""
    from fleet import manifest as fleet_manifest
    from fleet import manifest_view
    from fleet.lifecycle import answers, attempts
    from fleet.run import outcomes, verdict
    from fleet.run import record as state

    rec = state.load(run_id)
    m = answers.shown(rec)
    if as_json:
        print(fleet_manifest.dumps(m), end="")
        return
    for line in manifest_view.show(m):
        echo(line)
    seen = outcomes.seen(attempts.records(rec)[-1].dir)
    if seen:
        echo("as fleet saw the nodes:")
        echo("\n".join(outcomes.lines(seen)))
    if kept := verdict.read(rec.dir):
        echo(f"as fleet saw the run end: {kept.status.value} (exit {kept.code}), by {kept.by} "
             f"at {kept.when()}")
    found = attempts.load(rec)
    if found:
        echo("attempts:")
        echo("\n".join(attempts.lines(*found)))


@app.command("diff")
def diff_runs(run_a: Annotated[str, typer.Argument(
                  metavar="RUN_A", autocompletion=complete_run,
                  help=f"The earlier run: {RUN_HELP[0].lower()}{RUN_HELP[1:]}.")],
              run_b: Annotated[str, typer.Argument(
                  metavar="RUN_B", autocompletion=complete_run, help="The later run.")]
              ) -> None:
    """Show what changed between two runs.

    Code, files, hosts, env, commands, versions, setup."""
    from fleet.lifecycle import answers
    from fleet.run import record as state

    for line in answers.diff(state.load(run_a), state.load(run_b)):
        echo(line)


@app.command()
def dump(run_id: RunArg = None) -> None:
    """Print every rank's Python stack in a running run.

    On every node, grouped (the rank that is different named first); the run goes on. Kept in
    the run's record too."""
    from fleet import backends
    from fleet.console import Console
    from fleet.run import hang
    from fleet.run import record as state

    rec = state.load(run_id)
    with waits.shown_by(Console().hosts_waiting):
        lines, problems = backends.for_record(rec).dump(rec)
    for line in lines + problems:
        echo(line)
    saved = hang.save(rec.dir, f"fleet dump of run {rec.run_id}", lines + problems)
    echo(f"(kept in {saved})", err=True)
    if problems:
        raise typer.Exit(3)
