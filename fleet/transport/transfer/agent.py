"""How fleet.nodeside.ferry runs on a node: its modules made one program text (`program`), sent
with each command, so that a node needs nothing installed but a python."""

from __future__ import annotations

import ast
import functools
import threading
from collections.abc import Sequence
from pathlib import Path

from fleet.errors import InternalError
from fleet.nodeside import ferry
from fleet.shell import quote

PACKAGE = ferry.__name__
# The program's order: each module after every one it imports from (main, which runs, last).
MODULES = ("frames", "send", "word", "receiver", "recv", "main")
FUTURE = "from __future__ import annotations"
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
    """One program from (name, source) pairs, in their order: `doc` (a docstring's source) and
    one `from __future__ import annotations` first, then each module's body less its
    docstring, its future import and its imports from PACKAGE: the names they import are then
    defined earlier in the same text. InternalError (a bug in fleet, found before anything is
    sent) for what would make that text wrong: an import from a module not yet in it, or from
    anywhere else in fleet; a top-level name bound in two modules (the later one would quietly
    replace the other); a `__main__` block before the end; syntax a Python 3.8 cannot read."""
    owner: dict[str, tuple[str, str]] = {}  # top-level name -> (module, what binds it)
    parts = [doc, FUTURE] if doc else [FUTURE]
    for i, (name, source) in enumerate(modules):
        tree = ast.parse(source, f"{PACKAGE}.{name}")
        siblings = [n for n in tree.body if isinstance(n, ast.ImportFrom)
                    and _ours(n.module or "") and not n.level]
        for sub in ast.walk(tree):  # a node has no fleet: no other import from it may stay
            if (isinstance(sub, ast.Import) and any(_ours(a.name) for a in sub.names)) or (
                    isinstance(sub, ast.ImportFrom) and (sub.level or _ours(sub.module or ""))
                    and not any(sub is s for s in siblings)):
                raise InternalError(f"ferry.{name}: line {sub.lineno} imports from fleet")
        drop: set[int] = set()
        for n, node in enumerate(tree.body):
            if n == 0 and _docstring(node):
                drop.update(_lines(node))
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                if [a.name for a in node.names] != ["annotations"]:
                    raise InternalError(f"ferry.{name}: only `{FUTURE}` is shipped")
                drop.update(_lines(node))
            elif isinstance(node, ast.ImportFrom) and any(node is s for s in siblings):
                _check_sibling(name, node, owner)
                drop.update(_lines(node))
            else:
                if _is_main(node) and (i, n) != (len(modules) - 1, len(tree.body) - 1):
                    raise InternalError(f"ferry.{name}: a __main__ block before the program's end")
                for bound, what in _binds(node, name):
                    had = owner.setdefault(bound, (name, what))
                    if had[1] != what:  # the same import in two modules binds the same thing
                        raise InternalError(f"ferry.{name} and ferry.{had[0]} both bind {bound}")
        lines = source.splitlines(keepends=True)
        body = "".join(line for k, line in enumerate(lines, 1) if k not in drop).strip("\n")
        title = ast.get_docstring(tree) or ""
        parts.append(f"# ==== {PACKAGE}.{name}: {title.splitlines()[0] if title else ''}\n{body}")
    text = "\n\n\n".join(parts) + "\n"
    try:
        ast.parse(text, "fleet-ferry", feature_version=(3, 8))
    except SyntaxError as e:
        raise InternalError(f"ferry as one program is not Python 3.8: {e}") from e
    return text


def _docstring(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _lines(node: ast.stmt) -> range:
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def _ours(module: str) -> bool:
    return module == "fleet" or module.startswith("fleet.")


def _check_sibling(name: str, node: ast.ImportFrom, owner: dict[str, tuple[str, str]]) -> None:
    """An import from another ferry module: every name in it already bound, as itself, by that
    module (earlier in the program)."""
    sibling = (node.module or "").removeprefix(PACKAGE + ".")
    if sibling not in MODULES:
        raise InternalError(f"ferry.{name}: line {node.lineno} imports from {node.module}, "
                            "which is not one of ferry's modules")
    for a in node.names:
        if a.asname not in (None, a.name) or owner.get(a.name, ("",))[0] != sibling:
            raise InternalError(f"ferry.{name} imports {a.name} from ferry.{sibling}, which "
                                "no module before it in the program binds as that")


def _is_main(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__name__" in {
        n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}


def _binds(node: ast.stmt, module: str) -> list[tuple[str, str]]:
    """The top-level names a statement binds, each with what binds it: `import X` for an
    import (two modules may import the same thing), `def M` for anything else in module M."""
    if isinstance(node, ast.Import):
        return [((a.asname or a.name).split(".")[0], f"import {a.name}") for a in node.names]
    if isinstance(node, ast.ImportFrom):
        return [(a.asname or a.name, f"import {node.module}.{a.name}") for a in node.names]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, f"def {module}")]
    if isinstance(node, (ast.If, ast.Try, ast.For, ast.While, ast.With)):
        inner = [s for f in ("body", "orelse", "finalbody") for s in getattr(node, f, [])]
        inner += [s for h in getattr(node, "handlers", []) for s in h.body]
        targets = [node.target] if isinstance(node, ast.For) else [
            i.optional_vars for i in getattr(node, "items", []) if i.optional_vars]
        return [b for s in inner for b in _binds(s, module)] + _stored(targets, module)
    if isinstance(node, ast.Assign):
        return _stored(node.targets, module)
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return _stored([node.target], module)
    return []


def _stored(targets: Sequence[ast.expr], module: str) -> list[tuple[str, str]]:
    return [(n.id, f"def {module}") for t in targets for n in ast.walk(t)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


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
