"""typer's rich help and usage errors, loaded without what fleet never draws: Markdown (with
markdown_it) and rich's tracebacks (with pygments), which typer's help module imports first
and which cost a `--help` more than drawing the help itself (docs/BENCHMARKS.md, "start").

fleet's help is rich markup, escaped (fleet.cli.app.tidy), never Markdown (the app keeps typer's
"rich" markup mode), and typer's pretty tracebacks are off: the two names typer's help module
takes from those modules are never called. They are stand-ins while that module loads, and the
real modules stay importable by anything else."""

from __future__ import annotations

import sys
import types
from typing import Any, NoReturn

# module: the names typer's help module imports from it
SPARED = {"rich.markdown": ("Markdown",), "rich.traceback": ("Traceback",)}


class NotDrawn:
    """What fleet's help never draws: called, it says so instead of drawing something else."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._refuse()

    @classmethod
    def from_exception(cls, *args: Any, **kwargs: Any) -> NoReturn:
        cls._refuse()

    @staticmethod
    def _refuse() -> NoReturn:
        raise RuntimeError("fleet's help draws neither Markdown nor rich tracebacks "
                           "(fleet.cli.helpview)")


def load() -> None:
    """Load typer's help module (typer.rich_utils) with stand-ins for the modules it would draw
    Markdown and tracebacks with; those modules, if already loaded, are used as they are."""
    if "typer.rich_utils" in sys.modules:
        return
    placed = {}
    for name, names in SPARED.items():
        if name not in sys.modules:
            stand_in = types.ModuleType(name, "a stand-in while typer's help loads")
            for attr in names:
                setattr(stand_in, attr, NotDrawn)
            sys.modules[name] = placed[name] = stand_in
    try:
        import typer.rich_utils  # noqa: F401
    finally:
        for name, stand_in in placed.items():  # the real module for whoever imports it later
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
