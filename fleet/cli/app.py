"""The typer application and what every command shares: its argument types and `echo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from fleet.console import printable

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Run a PyTorch distributed job across the hosts of an inventory.")

JobArg = Annotated[Path, typer.Argument(help="Job file (TOML), e.g. jobs/mnist.toml.")]
InvOpt = Annotated[Path | None, typer.Option("--inventory", "-i",
                                             help="Inventory file; overrides the job's own.")]
ExtraArgs = Annotated[list[str] | None, typer.Argument(
    help="Extra arguments for the script, after --: fleet up JOB -- --resume")]
RunArg = Annotated[str | None, typer.Argument(help="Run id (default: the latest run).")]


@app.callback()
def _options(debug: Annotated[bool, typer.Option(
        "--debug", help="Show the Python traceback of an error (for reporting a bug).")
        ] = False) -> None:
    """Run a PyTorch distributed job across the hosts of an inventory."""


def echo(text: str, err: bool = False) -> None:
    """Print for a person, on stdout (stderr with `err`): any text may hold what a node said (a
    host key's error, a run state, a stack), so control characters are shown, never obeyed."""
    print(printable(text, lines=True), file=sys.stderr if err else sys.stdout)
