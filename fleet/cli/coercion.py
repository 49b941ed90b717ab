"""Values of fleet's plain parameters (a word, a path, a list of words) taken as typer would,
without the pydantic adapter typer builds for every parameter it processes, given or not.

Building those adapters loads pydantic, which costs a command's start more than the rest of the
parsing (docs/BENCHMARKS.md, "start"). A parameter of another type (a number, a range), and
any value this module does not expect, goes to typer's own coercion, built the first time it is
needed; tests/unit/test_fast_start.py checks that every parameter of every command gets the
same value both ways."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Light:
    """A parameter's coercion: the plain cases here, the rest by typer's own."""

    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self._typer: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        many = param.multiple or param.nargs == -1
        if value is None:  # not given: no coercion at all, as typer's own (and no adapter)
            return () if many else None
        annotation = self.descriptor.annotation
        if self.descriptor.file_annotation is not None or self.descriptor.is_choice:
            return self.typers().coerce(value, param=param, ctx=ctx)
        if annotation is str and not many and isinstance(value, str):
            return value
        if annotation == list[str] and many and isinstance(value, list | tuple) \
                and all(isinstance(v, str) for v in value):
            return list(value)
        if annotation is Path and not many and isinstance(value, str) \
                and self.descriptor.parameter_info.path_type is None:
            from typer._param_types import coerce_cli_path

            # typer's own checks of the path, given a Path (so that it builds no adapter)
            return coerce_cli_path(Path(value), self.descriptor.parameter_info, path_type=Path,
                                   param=param, ctx=ctx)
        return self.typers().coerce(value, param=param, ctx=ctx)

    def typers(self) -> Any:
        """typer's own coercion of this parameter (pydantic), built once."""
        if self._typer is None:
            from typer._coercion import build_runtime_param

            self._typer = build_runtime_param(self.descriptor)
        return self._typer


def lighten(command: Any) -> None:
    """Give every parameter of the command and its subcommands the light coercion; a typer
    without the lazy coercion this relies on is left as it is."""
    from typer import Context

    help_option = command.get_help_option(Context(command))  # made once, kept by the command
    for param in [*command.params, *([help_option] if help_option else [])]:
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", False) is not None:
            continue
        param._runtime_param = Light(descriptor)
    for sub in getattr(command, "commands", {}).values():
        lighten(sub)
