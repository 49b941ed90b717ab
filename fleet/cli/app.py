"""The typer application and what every command shares: its argument types (run ids completed
in the shell), `--version`, help as a person reads it, and `echo`."""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from fleet import __version__
from fleet.cli.coercion import lighten
from fleet.config.given import forget
from fleet.errors import UsageError
from fleet.nodeside.shared.scrub import printable
from fleet.timespan import parse_duration

if TYPE_CHECKING:  # types only: the CLI loads what a command needs when it runs
    from fleet.config.job import Job
    from fleet.config.select import Selection

PROG = "fleet"


COMPLETE_VAR = f"_{PROG.upper()}_COMPLETE"  # set by the shell's completion script


class FleetGroup(TyperGroup):
    """fleet's command group: named `fleet` however it was started (`python -m fleet` too: the
    shell's completion asks `_FLEET_COMPLETE`), its help tidied once before it is read, its
    parameters taken without pydantic where they are plain (fleet.cli.coercion)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("prog_name", PROG)
        given = kwargs.pop("args", args[0] if args else None)
        argv = sys.argv[1:] if given is None else list(given)
        forget()  # the files named are this command line's own
        if COMPLETE_VAR not in os.environ and shows_help(self, argv):  # rich, only for help
            from fleet.cli import helpview

            helpview.load()
            tidy(self)
        lighten(self)
        return super().main(optional_values(argv), *args[1:], **kwargs)


def shows_help(group: Any, argv: list[str]) -> bool:
    """Whether this command line may show help (`--help`, or a group named without its
    command: `fleet`, `fleet export`): only then is the help tidied, which loads rich."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    if "--help" in words:
        return True
    command = group
    for word in (w for w in words if not w.startswith("-")):
        command = getattr(command, "commands", {}).get(word)
        if command is None:  # a command's own argument
            return False
    return hasattr(command, "commands")


WAIT_FOREVER = "forever"


def optional_values(argv: list[str]) -> list[str]:
    """`fleet up --wait` takes a value or none (`--wait JOB`, `--wait 2h JOB`, `--wait=2h`),
    which click cannot say: a bare `--wait` becomes `--wait=forever`, one followed by a duration
    takes it. Only `up`'s; words after `--` are the job's, left as they are."""
    command = next((w for w in argv if not w.startswith("-")), None)
    if command != "up":
        return argv
    out: list[str] = []
    i = 0
    while i < len(argv):
        word, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        i += 1
        if word == "--":
            return out + argv[i - 1:]
        if word != "--wait":
            out.append(word)
        elif value is not None and parse_duration(value) is not None:
            out.append(f"--wait={value}")
            i += 1
        elif value is not None and value.replace(".", "", 1).isdigit():
            raise UsageError(f"--wait {value}: give its unit (--wait {value}s, {value}m, "
                             f"{value}h)")
        else:
            out.append(f"--wait={WAIT_FOREVER}")
    return out


def tidy(command: Any) -> None:
    """Help as written, for every command and parameter: a flag shows no `<bool>` value (it
    takes none), text is never read as rich markup (`[restart]` stays), and a paragraph's line
    breaks are the source's, not the terminal's (rich wraps it to the width)."""
    if getattr(command, "_fleet_tidy", False):
        return
    command._fleet_tidy = True
    command.help = _prose(command.help)
    ctx = typer.Context(command)
    for param in [*command.params, command.get_help_option(ctx)]:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
        if isinstance(param, TyperOption | TyperArgument) and param.help:
            param.help = _prose(param.help)
    for sub in getattr(command, "commands", {}).values():
        tidy(sub)


def _prose(text: str | None) -> str | None:
    if not text:
        return text
    from rich.markup import escape  # here: a shell's completion, which shows no help, skips it

    paragraphs = text.strip().split("\n\n")
    return escape("\n\n".join(" ".join(p.split()) for p in paragraphs))


def _version(value: bool) -> None:
    if not value:
        return
    # The package's own (pyproject.toml reads it from there): no search of the installed
    # distributions, which costs a start more than the rest of --version.
    print(f"{PROG} {__version__}")
    raise typer.Exit()


def complete_run(incomplete: str) -> list[tuple[str, str]]:
    """The shell's completion of a run id: the recorded runs (newest first) whose id starts with
    what is typed (a shell completes the start of a word), each with its job and start time."""
    from fleet.run import record

    runs, _ = record.all_runs()
    return [(r.run_id, f"{Path(r.job).name}, {_when(r.started)}") for r in reversed(runs)
            if not r.parent and r.run_id.startswith(incomplete)]


def _when(started: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(started))


def job_given(ctx: typer.Context, value: Path | None) -> Path | None:
    """A command's job (or inventory) file: what the advice for an unknown host key names."""
    _given(ctx, "job", value)
    return value


def inventory_given(ctx: typer.Context, value: Path | None) -> Path | None:
    """An inventory file named beside a job (-i) or instead of one: the advice names it."""
    _given(ctx, "inventory", value)
    return value


def _given(ctx: typer.Context, kind: str, value: Path | None) -> None:
    # Shell completion parses the line too, and connects to nothing: no advice to give.
    if value is not None and not ctx.resilient_parsing:
        from fleet.config.given import given

        given(kind, str(value))


app = typer.Typer(cls=FleetGroup, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run a PyTorch distributed job across the hosts of an inventory.")

JobArg = Annotated[Path, typer.Argument(metavar="JOB", callback=job_given,
                                        help="Job file (TOML), e.g. jobs/mnist.toml.")]
InvOpt = Annotated[Path | None, typer.Option("--inventory", "-i", metavar="INVENTORY",
                                             callback=inventory_given,
                                             help="Inventory file; overrides the job's own.")]
ExtraArgs = Annotated[list[str] | None, typer.Argument(
    metavar="[-- ARGS...]",
    help="Arguments for the script, after --: added after the job's args (fleet up JOB -- "
         "--resume), or in the place of the word \"{args}\" where the job's args hold it.")]
NodeOpt = Annotated[list[str] | None, typer.Option(
    "--node", metavar="NODE",
    help="Only this host of the inventory (repeat for more); default: every host. A run's "
         "master is the first host left, in the inventory's order.")]
ExcludeOpt = Annotated[list[str] | None, typer.Option(
    "--exclude", "-x", metavar="NODE",
    help="Leave this host of the inventory out (repeat for more), as pdsh -x does.")]
RUN_HELP = "Run id, or a unique start of it or of its tag (49b0)"
RunArg = Annotated[str | None, typer.Argument(
    metavar="RUN", autocompletion=complete_run, help=f"{RUN_HELP}; default: the latest run.")]


@app.callback()
def _options(debug: Annotated[bool, typer.Option(
        "--debug", help="Show the Python traceback of an error (for reporting a bug).")
        ] = False,
        version: Annotated[bool, typer.Option(
            "--version", "-V", callback=_version, is_eager=True,
            help="Show fleet's version and exit.")] = False) -> None:
    """Run a PyTorch distributed job across the hosts of an inventory."""
    gc.enable()  # the command runs: collections as usual (fleet.cli.quick_start)


def selection(node: list[str] | None, exclude: list[str] | None) -> Selection:
    """--node and --exclude as fleet.config.select has them."""
    from fleet.config.select import Selection

    return Selection(tuple(node or ()), tuple(exclude or ()))


def selected(job: Job, node: list[str] | None, exclude: list[str] | None) -> Job:
    """The job, on the hosts --node and --exclude leave, checked at once: a Slurm cluster, a
    name the inventory does not hold, or no host left is a UsageError before anything is
    connected to."""
    from fleet.config.select import validate

    sel = selection(node, exclude)
    validate(job.inventory, sel)
    return dataclasses.replace(job, selection=sel) if sel else job


def echo(text: str, err: bool = False) -> None:
    """Print for a person, on stdout (stderr with `err`): any text may hold what a node said (a
    host key's error, a run state, a stack), so control characters are shown, never obeyed."""
    print(printable(text, lines=True), file=sys.stderr if err else sys.stdout)
