"""The one quoting path: every command fleet sends to a node is built here from parts."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


class Raw(str):
    """A trusted shell fragment (an operator such as '&&' or '>'), never quoted."""


AND = Raw("&&")


def quote(value: object) -> str:
    """One shell word that the shell reads back as exactly `value`."""
    return shlex.quote(str(value))


def home_word(path: str) -> str:
    """One shell word for a node's path, a leading ~ as that node's $HOME: a script can name
    ~/fleet before fleet has learnt where the home is."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + quote(path[2:]) if path[2:] else '"$HOME"/'
    return quote(path)


def sh(*parts: object) -> str:
    """A command line: Raw parts as they are, everything else quoted as one word."""
    return " ".join(p if isinstance(p, Raw) else quote(p) for p in parts)


def join(argv: Iterable[object]) -> str:
    return " ".join(quote(a) for a in argv)


# This machine, as opposed to another that shares a directory with it (an NFS home): its name and
# boot id, as run.sh records them and as fleet compares them.
MACHINE_ID = ("$(cat /proc/sys/kernel/hostname 2>/dev/null) "
              "$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)")
