"""Programs that run on nodes, each a file here that ruff, mypy and a unit test under `sh` see,
and how a command carries one: a shell program as sh text with its arguments, a Python program
(standard library only, Python 3.8+, bundled with the modules of fleet/nodeside/shared it
imports: fleet.nodeside.bundle) from a here-document. Also the files a run directory's site/
holds for the job's python processes (sitecustomize.py, fleet_local_rank.py)."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

from fleet.shell import quote, sh

HERE = Path(__file__).parent
PY_END = "FLEET_PY_CODE"  # ends the here-document that carries a Python program
# Nodes are asked from one thread each: one makes a Python program's text (CPython 3.11's ast is
# not safe in two threads at a time, cpython#106905), the others wait for it.
_MAKING = threading.Lock()


def text(name: str) -> str:
    """A program's text, as shipped: a Python program bundled with the shared modules it
    imports (fleet.nodeside.bundle)."""
    with _MAKING:
        return _text(name)


@functools.cache
def _text(name: str) -> str:
    if name.endswith(".py"):
        from fleet.nodeside import bundle  # ast, only once a Python program is sent

        body = bundle.program(HERE / name).rstrip("\n")
    else:
        body = (HERE / name).read_text().rstrip("\n")
    if PY_END in body.splitlines():
        raise ValueError(f"{name} holds the line {PY_END}, which would end its here-document")
    return body


def loader(name: str) -> str:
    """What `python -c` runs: the program `name` read from file descriptor 3 (the here-document
    python_program and shell_program open there). The command line stays short, so that `ps`
    shows this and the program's arguments, not the program; its stdin stays free."""
    stem = "fleet-" + name.rsplit(".", 1)[0].replace("_", "-")
    return (f"import os,sys;sys.argv[0]={stem!r};"
            f"exec(compile(os.fdopen(3,encoding='utf-8').read(),{stem!r},'exec'))")


def _code(name: str) -> str:
    return f"3<<'{PY_END}'\n{text(name)}\n{PY_END}"


def python_program(interpreter: str, name: str, *args: object, flags: tuple[str, ...] = (),
                   redirect: str = "") -> str:
    """sh text that runs the Python program `name` with the node's `interpreter` (a shell word:
    quote() or home_word() it), each of `args` quoted as one word, `redirect` (trusted:
    "2>&1") after them. Its text follows on lines of its own: nothing may be appended to the
    command's line."""
    parts = " ".join([interpreter, *map(quote, flags), "-c", quote(loader(name)),
                      *map(quote, args)])
    return f"{parts}{' ' + redirect if redirect else ''} {_code(name)}"


def shell_program(name: str, *args: object, python: str = "",
                  uses: tuple[str, ...] = ()) -> str:
    """sh text that runs the shell program `name` with `args` (each quoted as one word, a
    fleet.shell.Raw word as it is: "$HOME"/fleet). It runs in the shell that carries it, as a
    brace group (no process of its own: whoever ends that shell ends it), so its `exit` ends
    that shell too: where more must follow, put it in a subshell. `set --` is a builtin: the
    arguments never show in a process's argv. `uses`: files of shell functions it calls,
    defined before it. With `python`, that Python program's text is open on file descriptor 3
    for the interpreter the shell program starts with `-c` and loader(python) (an argument)."""
    body = "\n".join(["{", f"set -- {sh(*args)}", *map(text, uses), text(name), "}"])
    return f"{body} {_code(python)}" if python else body
