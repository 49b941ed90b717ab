"""How fleet.nodeside.ferry runs on a node: its modules made one program text (`program`), sent
with each command, so that a node needs nothing installed but a python."""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import Sequence
from pathlib import Path

from fleet.nodeside import bundle, ferry
from fleet.shell import quote

PACKAGE = ferry.__name__
# The program's order: each module after every one it imports from (main, which runs, last).
MODULES = ("frames", "send", "word", "receiver", "recv", "main")
# The first transfer asks from one thread per node at once. functools.cache would let each of
# them make the text, and CPython 3.11's ast is not safe in two threads at a time ("SystemError:
# AST constructor recursion depth mismatch", cpython#106905): one makes it, the others wait.
_MAKING = threading.Lock()


def program() -> str:
    """ferry's modules as the one program text a node runs (see `amalgamate`); made once, on
    the first transfer, whichever thread asks first."""
    with _MAKING:
        return _program()


@functools.cache
def _program() -> str:
    here = Path(ferry.__file__).parent
    init = (here / "__init__.py").read_text()
    doc = ast.get_source_segment(init, ast.parse(init).body[0]) or ""
    return amalgamate(doc, [(m, (here / f"{m}.py").read_text()) for m in MODULES])


def amalgamate(doc: str, modules: Sequence[tuple[str, str]]) -> str:
    """ferry's modules as one program (fleet.nodeside.bundle.amalgamate)."""
    return bundle.amalgamate(doc, modules, PACKAGE)


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
    text += f"\n{program()}\nFLEET_FERRY_CODE"
    if stdin:
        text += f"\n{stdin}\nFLEET_FERRY_IN"
    return text
