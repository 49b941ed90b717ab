"""How fleet.nodeside.ferry runs on a node: the program itself, sent with each command, so that
a node needs nothing installed but a python."""

from __future__ import annotations

from pathlib import Path

from fleet.nodeside import ferry
from fleet.shell import quote

AGENT = Path(ferry.__file__).read_text()
# The node's python runs the agent from file descriptor 3 (a here-document): its command line
# stays short (`ps` shows this, not the whole program) and its stdin free for the stream.
LOADER = ("import os,sys;sys.argv[0]='fleet-ferry';"
          "exec(compile(os.fdopen(3,encoding='utf-8').read(),'fleet-ferry','exec'))")


def agent(python: str, args: str, stdin: str = "") -> str:
    """The sh command that runs the agent with these (already quoted) arguments, a
    here-document as its stdin where given."""
    text = f"{quote(python)} -c {quote(LOADER)} {args} 3<<'FLEET_FERRY_CODE'"
    if stdin:
        text += " <<'FLEET_FERRY_IN'"
    text += f"\n{AGENT}\nFLEET_FERRY_CODE"
    if stdin:
        text += f"\n{stdin}\nFLEET_FERRY_IN"
    return text
