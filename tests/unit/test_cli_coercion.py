"""fleet.cli.coercion takes every parameter of every command as typer's own coercion (pydantic)
would: the same value for what a person types, the same refusal for what is wrong, and nothing
built for a parameter not given."""

from __future__ import annotations

from typing import Any

import pytest
import typer
import typer.main
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from fleet.cli.coercion import Light, lighten
from fleet.cli.commands import app

GROUP = typer.main.get_command(app)


def every_param() -> list[tuple[str, Any]]:
    group = GROUP
    lighten(group)
    out: list[tuple[str, Any]] = []

    def walk(command: Any, path: str) -> None:
        for p in command.params:
            out.append((f"{path} {p.name}", p))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}".strip())
    walk(group, "")
    return out


PARAMS = every_param()


def samples(annotation: Any, many: bool) -> list[Any]:
    if many:
        return [(), ("a", "b/c"), ["x"]]
    if annotation is bool:
        return ["true", "0"]
    if annotation in (int, float):
        return ["3", "-1", "nope", "2.5"]
    return ["node1", "jobs/mnist.toml", "jobs", "", "a b"]  # paths that exist, and do not


@pytest.mark.parametrize("where, param", PARAMS, ids=[w for w, _ in PARAMS])
def test_every_parameter_is_taken_as_typer_takes_it(where: str, param: Any) -> None:
    light = param._runtime_param
    assert isinstance(light, Light), where
    assert light._typer is None  # nothing built yet
    many = param.multiple or param.nargs == -1
    ctx = typer.Context(GROUP)
    assert light.coerce(None, param, ctx) == (() if many else None)
    assert light._typer is None, f"{where}: a parameter not given builds no adapter"
    own = build_runtime_param(param.type_descriptor)
    for value in samples(param.type_descriptor.annotation, many):
        try:
            expected: Any = own.coerce(value, param=param, ctx=ctx)
        except BadParameter as e:
            expected = ("refused", str(e))
        try:
            got: Any = light.coerce(value, param, ctx)
        except BadParameter as e:
            got = ("refused", str(e))
        assert (got, type(got)) == (expected, type(expected)), f"{where} {value!r}"
