"""A small checked reader for TOML tables: every error names the file and the key."""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fleet.errors import ConfigError

T = TypeVar("T")
_MISSING: Any = object()
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", float: "a number"}


def load_toml(path: Path, what: str) -> dict[str, Any]:
    """Read one TOML file, turning a missing file or a syntax error into a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(path, None, f"{what} file not found") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(path, None, f"cannot read {what} file: {e}") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"not valid TOML: {e}") from e


class Table:
    """One TOML table being read: take() each known key, then done() rejects the rest."""

    def __init__(self, path: Path, data: dict[str, Any], prefix: str = "") -> None:
        self.path, self.data, self.prefix = path, data, prefix
        self._seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def error(self, name: str | None, message: str) -> ConfigError:
        return ConfigError(self.path, self.key(name) if name else self.prefix.rstrip(".") or None,
                           message)

    def has(self, name: str) -> bool:
        return name in self.data

    def take(self, name: str, kind: type[T], default: Any = _MISSING) -> T:
        """The value of a scalar key, of exactly this type (bool is not an int here)."""
        self._seen.add(name)
        if name not in self.data:
            if default is _MISSING:
                raise self.missing(name)
            return default  # type: ignore[no-any-return]
        value = self.data[name]
        if type(value) is not kind and not (kind is float and type(value) is int):
            raise self.error(name, f"must be {_TYPE_NAMES.get(kind, kind.__name__)}, "
                                   f"not {_describe(value)}")
        if isinstance(value, str) and "\0" in value:
            raise self.error(name, "must not contain a NUL character")
        return value  # type: ignore[return-value]

    def take_str_list(self, name: str, default: list[str] | None = None) -> list[str]:
        self._seen.add(name)
        value = self.data.get(name, _MISSING)
        if value is _MISSING:
            if default is None:
                raise self.missing(name)
            return list(default)
        if not isinstance(value, list) or not all(type(v) is str for v in value):
            raise self.error(name, f"must be a list of strings, not {_describe(value)}")
        if any("\0" in v for v in value):
            raise self.error(name, "must not contain a NUL character")
        return list(value)

    def take_env(self, name: str) -> dict[str, str]:
        """An environment table: NAME = scalar; numbers and booleans become their text."""
        sub = self.table(name)
        env: dict[str, str] = {}
        for key, value in sub.data.items():
            sub._seen.add(key)
            if not ENV_NAME.match(key):
                raise sub.error(key, "is not a valid environment variable name")
            if type(value) is bool:
                env[key] = "1" if value else "0"
            elif type(value) in (str, int, float):
                if "\0" in str(value):
                    raise sub.error(key, "must not contain a NUL character")
                env[key] = str(value)
            else:
                raise sub.error(key, f"must be a string or number, not {_describe(value)}")
        return env

    def table(self, name: str) -> Table:
        self._seen.add(name)
        value = self.data.get(name, {})
        if not isinstance(value, dict):
            raise self.error(name, f"must be a table, not {_describe(value)}")
        return Table(self.path, value, f"{self.key(name)}.")

    def tables(self, name: str) -> list[Table]:
        self._seen.add(name)
        value = self.data.get(name, _MISSING)
        if value is _MISSING:
            raise self.missing(name, f"required: at least one [[{self.key(name)}]] table")
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.error(name, f"must be an array of tables ([[{self.key(name)}]])")
        return [Table(self.path, v, f"{self.key(name)}[{i}].") for i, v in enumerate(value)]

    def missing(self, name: str, message: str = "required key is missing") -> ConfigError:
        """The error for a required key that is not there: where a key not read yet looks like
        a misspelling of it (`scirpt`), that key is the mistake, named with its likely fix (no
        known key of fleet's files is that close to a required one)."""
        unread = [k for k in self.data if k not in self._seen]
        close = difflib.get_close_matches(name, unread, n=1)
        if close:
            return self.error(close[0], f"unknown key; did you mean {name}?")
        return self.error(name, message)

    def done(self) -> None:
        """Every key of the table has been read: any other is a mistake, said with the known
        key it most looks like, else with the keys known here."""
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(self._seen), n=1)
            if close:
                raise self.error(unknown[0], f"unknown key; did you mean {close[0]}?")
            known = ", ".join(sorted(self._seen))
            raise self.error(unknown[0], f"unknown key (known keys here: {known})")


# ---- forward: a node's port reached from this machine (fleet forward, the job's `forward`) --
@dataclass(frozen=True)
class PortSpec:
    """PORT[:LOCALPORT]: a port on the node, and the one on this machine's 127.0.0.1 that
    reaches it (0: a free one, picked when the listener opens)."""

    port: int
    local: int = 0

    def __str__(self) -> str:
        return f"{self.port}:{self.local}" if self.local else str(self.port)


def parse_port_spec(text: str) -> PortSpec:
    """`6006` or `6006:16006`; ValueError says what is wrong."""
    node, sep, local = text.strip().partition(":")
    words = [node, local] if sep else [node]
    if not all(w.isdigit() for w in words):
        raise ValueError(f"{text!r} is not PORT or PORT:LOCALPORT (e.g. 6006 or 6006:16006)")
    ports = [int(w) for w in words]
    for p in ports:
        if not 0 < p < 65536:
            raise ValueError(f"{text!r}: a port is between 1 and 65535, not {p}")
    return PortSpec(*ports)


def take_forwards(t: Table, name: str) -> tuple[PortSpec, ...]:
    """A list of ports (6006) or "PORT:LOCALPORT" strings, no local port twice."""
    t._seen.add(name)
    value = t.data.get(name, [])
    if not isinstance(value, list):
        raise t.error(name, f"must be a list of ports (6006) or \"PORT:LOCALPORT\" strings, "
                            f"not {_describe(value)}")
    specs = []
    for i, v in enumerate(value):
        if type(v) is not int and type(v) is not str:
            raise t.error(f"{name}[{i}]", f"must be a port or a \"PORT:LOCALPORT\" string, "
                                          f"not {_describe(v)}")
        try:
            specs.append(parse_port_spec(str(v)))
        except ValueError as e:
            raise t.error(f"{name}[{i}]", str(e)) from None
    locals_ = [s.local for s in specs if s.local]
    if len(set(locals_)) < len(locals_):
        raise t.error(name, "a local port is named twice")
    return tuple(specs)


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"{type(value).__name__} {value!r}"
