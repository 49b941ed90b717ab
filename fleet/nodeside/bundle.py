"""How a Python program that runs on a node is made one text from fleet's modules (`amalgamate`:
ferry's modules, or `program`: a program in fleet/nodeside with the modules of
fleet/nodeside/shared it imports), so that a node needs nothing installed but a python, and no
rule is copied between the laptop's side and the node's: the laptop imports the same modules."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path

from fleet.errors import InternalError

FUTURE = "from __future__ import annotations"


def amalgamate(doc: str, modules: Sequence[tuple[str, str]], package: str) -> str:
    """One program from (name, source) pairs, each the module `package`.name, in their order:
    `doc` (a docstring's source) and one `from __future__ import annotations` first, then each
    module's body less its docstring, its future import and its imports from the others: the
    names they import are then defined earlier in the same text. InternalError (a bug in
    fleet, found before anything is sent) for what would make that text wrong: an import from
    a module not yet in it, or from anywhere else in fleet; a top-level name bound in two
    modules (the later one would quietly replace the other); a `__main__` block before the
    end; syntax a Python 3.8 cannot read."""
    label = package.rpartition(".")[2]
    names = [name for name, _ in modules]
    owner: dict[str, tuple[str, str]] = {}  # top-level name -> (module, what binds it)
    parts = [doc, FUTURE] if doc else [FUTURE]
    for i, (name, source) in enumerate(modules):
        tree = ast.parse(source, f"{package}.{name}")
        siblings = [n for n in tree.body if isinstance(n, ast.ImportFrom)
                    and _ours(n.module or "") and not n.level]
        for sub in ast.walk(tree):  # a node has no fleet: no other import from it may stay
            if (isinstance(sub, ast.Import) and any(_ours(a.name) for a in sub.names)) or (
                    isinstance(sub, ast.ImportFrom) and (sub.level or _ours(sub.module or ""))
                    and not any(sub is s for s in siblings)):
                raise InternalError(f"{label}.{name}: line {sub.lineno} imports from fleet")
        drop: set[int] = set()
        for n, node in enumerate(tree.body):
            if n == 0 and _docstring(node):
                drop.update(_lines(node))
            elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
                if [a.name for a in node.names] != ["annotations"]:
                    raise InternalError(f"{label}.{name}: only `{FUTURE}` is shipped")
                drop.update(_lines(node))
            elif isinstance(node, ast.ImportFrom) and any(node is s for s in siblings):
                _check_sibling(package, names, name, node, owner)
                drop.update(_lines(node))
            else:
                if _is_main(node) and (i, n) != (len(modules) - 1, len(tree.body) - 1):
                    raise InternalError(f"{label}.{name}: a __main__ block before the "
                                        "program's end")
                for bound, what in _binds(node, name):
                    had = owner.setdefault(bound, (name, what))
                    if had[1] != what:  # the same import in two modules binds the same thing
                        raise InternalError(f"{label}.{name} and {label}.{had[0]} both bind "
                                        f"{bound}")
        lines = source.splitlines(keepends=True)
        body = "".join(line for k, line in enumerate(lines, 1) if k not in drop).strip("\n")
        title = ast.get_docstring(tree) or ""
        parts.append(f"# ==== {package}.{name}: {title.splitlines()[0] if title else ''}\n{body}")
    text = "\n\n\n".join(parts) + "\n"
    try:
        ast.parse(text, f"fleet-{label}", feature_version=(3, 8))
    except SyntaxError as e:
        raise InternalError(f"{label} as one program is not Python 3.8: {e}") from e
    return text


def _docstring(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _lines(node: ast.stmt) -> range:
    return range(node.lineno, (node.end_lineno or node.lineno) + 1)


def _ours(module: str) -> bool:
    return module == "fleet" or module.startswith("fleet.")


def _check_sibling(package: str, names: list[str], name: str, node: ast.ImportFrom,
                   owner: dict[str, tuple[str, str]]) -> None:
    """An import from another of the program's modules: every name in it already bound, as
    itself, by that module (earlier in the program)."""
    label = package.rpartition(".")[2]
    sibling = (node.module or "").removeprefix(package + ".")
    if sibling not in names:
        raise InternalError(f"{label}.{name}: line {node.lineno} imports from {node.module}, "
                            f"which is not one of {label}'s modules")
    for a in node.names:
        if a.asname not in (None, a.name) or owner.get(a.name, ("",))[0] != sibling:
            raise InternalError(f"{label}.{name} imports {a.name} from {label}.{sibling}, "
                                "which no module before it in the program binds as that")


def _is_main(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "__name__" in {
        n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}


def _binds(node: ast.stmt, module: str) -> list[tuple[str, str]]:
    """The top-level names a statement binds, each with what binds it: `import X` for an
    import (two modules may import the same thing), `def M` for anything else in module M."""
    if isinstance(node, ast.Import):
        # `import a.b` binds a, the same module as `import a.c` does
        return [(a.asname or a.name.split(".")[0],
                 f"import {a.name if a.asname else a.name.split('.')[0]}") for a in node.names]
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


NODESIDE = "fleet.nodeside"
SHARED = f"{NODESIDE}.shared"  # the modules a node program may import


def program(path: Path) -> str:
    """The text of the node program at `path`: as it is where it imports nothing of fleet's,
    else the shared modules it imports (each after those it imports itself) and then the
    program, made one (`amalgamate`)."""
    source = path.read_text()
    order: list[str] = []
    _needs(path.stem, source, path.parent / "shared", order, ())
    if not order:
        return source
    tree = ast.parse(source)
    doc = ast.get_source_segment(source, tree.body[0]) if tree.body and _docstring(
        tree.body[0]) else ""
    shared = path.parent / "shared"
    modules = [(f"shared.{m}", (shared / f"{m}.py").read_text()) for m in order]
    return amalgamate(doc or "", [*modules, (path.stem, source)], NODESIDE)


def _needs(name: str, source: str, shared: Path, order: list[str],
           within: tuple[str, ...]) -> None:
    """Add to `order` the shared modules `source` imports, each after those it needs."""
    for node in ast.parse(source, name).body:
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                SHARED + ".")):
            continue
        module = (node.module or "").removeprefix(SHARED + ".")
        if module in within:
            raise InternalError(f"{SHARED}.{module} imports itself, through {name}")
        if module not in order:
            path = shared / f"{module}.py"
            if not path.is_file():
                raise InternalError(f"{name}: line {node.lineno} imports {node.module}, "
                                    "which is not a module")
            _needs(module, path.read_text(), shared, order, (*within, module))
            order.append(module)
