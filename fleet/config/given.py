"""The files this command line named (set by the CLI as it reads its arguments), so that the
advice for an unknown host key names what the user gave; read from any thread that connects.
Apart from fleet.config.hostkeys, which loads paramiko: reading the arguments does not."""

from __future__ import annotations

import shlex

_GIVEN: dict[str, str] = {}


def given(kind: str, path: str) -> None:
    """The command line named this file: kind "job" (or an inventory file in its place),
    "inventory" (-i, which a job's command takes over the job's own)."""
    _GIVEN[kind] = path


def forget() -> None:
    """A new command line: what an earlier one named (in this same process: tests run the CLI
    in-process) is not this one's file."""
    _GIVEN.clear()


def trust_command() -> str:
    """The command that records an unknown key, with the file this command line was given
    (`fleet trust jobs/mnist.toml --accept`)."""
    path = _GIVEN.get("inventory") or _GIVEN.get("job")
    if path is None:  # a command on a recorded run: no file was named
        return "`fleet trust JOB --accept` (JOB: the run's job file or inventory)"
    return f"`fleet trust {shlex.quote(path)} --accept`"
