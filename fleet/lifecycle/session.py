"""One command's session with the run: where its events go (the terminal, or JSON lines with
--json) and, with --json, its end said as a last event (an Error, with fleet's exit code) before
the one error handler (fleet.cli.main) says it in words and exits with that code."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from fleet import events as ev
from fleet.console import Console
from fleet.errors import ExitCode, FleetError, Interrupted
from fleet.run.jsonl import JsonLines


@dataclass
class Session:
    """The console every event of the command goes through, and the sink behind it (None:
    the terminal draws them)."""

    console: Console
    sink: ev.Sink | None = None

    @classmethod
    def for_command(cls, as_json: bool) -> Session:
        if not as_json:
            return cls(Console())
        sink = JsonLines(sys.stdout)
        return cls(Console(sink=sink), sink)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.sink is None or exc is None:
            return
        if isinstance(exc, FleetError | Interrupted):
            self.sink.emit(ev.Error(str(exc), int(exc.exit_code)))
        elif isinstance(exc, Exception) and not hasattr(exc, "exit_code"):
            # A bug (the handler says it as an internal error); the command line's own exit
            # (typer.Exit, with its exit_code) was said by the command, a Verdict.
            self.sink.emit(ev.Error(f"{type(exc).__name__}: {exc}", int(ExitCode.INTERNAL)))
