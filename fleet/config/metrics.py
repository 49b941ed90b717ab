"""`[metrics]` in a job: values the job prints in its log that `fleet ui` plots per rank, each a
name and a regular expression whose group `v` is the number (`loss = "loss (?P<v>[0-9.e+-]+)"`).
The page runs them in the browser: a pattern must mean the same there as here."""

from __future__ import annotations

import re

from fleet.config.schema import Table

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MOST = 16  # metrics a job may name
LONGEST = 300  # characters of one pattern
# Python-only syntax a browser's RegExp reads otherwise or not at all: a named back-reference,
# inline flags, conditionals, possessive quantifiers and atomic groups, \A \Z.
PYTHON_ONLY = re.compile(r"\(\?P=|\(\?[aiLmsux-]+[:)]|\(\?\(|\(\?>|[*+?}]\+|\\[AZ]")


def take_metrics(t: Table) -> dict[str, str]:
    """The job's `[metrics]` table: name -> pattern, each checked (it compiles, has one group
    named `v`, uses no syntax only Python reads)."""
    out: dict[str, str] = {}
    for name in list(t.data):
        pattern = t.take(name, str)
        if not NAME.fullmatch(name):
            raise t.error(name, "a metric's name is letters, digits, `_`, `.` or `-`, "
                                "starting with a letter or `_` (at most 64)")
        if len(out) == MOST:
            raise t.error(name, f"at most {MOST} metrics")
        if not pattern or len(pattern) > LONGEST:
            raise t.error(name, f"must be a regular expression of 1 to {LONGEST} characters")
        try:
            compiled = re.compile(pattern)
        except re.error as e:
            raise t.error(name, f"is not a regular expression: {e}") from None
        if "v" not in compiled.groupindex:
            raise t.error(name, "must name the value's group v: (?P<v>[0-9.e+-]+)")
        if found := PYTHON_ONLY.search(pattern):
            raise t.error(name, f"uses {found.group(0)!r}, which the page's JavaScript reads "
                                "otherwise: write the pattern without it")
        out[name] = pattern
    return out
