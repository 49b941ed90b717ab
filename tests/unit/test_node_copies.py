"""No rule is copied between the node's side and the laptop's: a program that runs on a node is
bundled from fleet/nodeside's shared modules (fleet.nodeside.bundle), which the laptop imports
too, so no block of code stands both in fleet/nodeside/ and elsewhere in fleet/."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fleet"
NODESIDE = PACKAGE / "nodeside"
WINDOW = 6  # lines in a row that make a shared block


def _docstring_lines(tree: ast.AST) -> set[int]:
    """The lines of every docstring (a module's, a class's, a function's)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            out.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return out


def _import_lines(tree: ast.AST) -> set[int]:
    """The lines of every import: two modules that need the same standard library share them
    and no rule."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
            for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}


def normalised(source: str) -> list[tuple[int, str]]:
    """(line number, text stripped) of the lines that are code: no blank line, no comment-only
    line, no docstring, no import."""
    tree = ast.parse(source)
    skip = _docstring_lines(tree) | _import_lines(tree)
    return [(n, line.strip()) for n, line in enumerate(source.splitlines(), 1)
            if n not in skip and line.strip() and not line.strip().startswith("#")]


def windows(source: str) -> dict[str, int]:
    """Each run of WINDOW code lines, by its hash, with the line it starts at."""
    lines = normalised(source)
    out: dict[str, int] = {}
    for i in range(len(lines) - WINDOW + 1):
        run = "\n".join(text for _, text in lines[i:i + WINDOW])
        out.setdefault(hashlib.sha256(run.encode()).hexdigest(), lines[i][0])
    return out


def shared(node: dict[Path, str], laptop: dict[Path, str]) -> list[str]:
    """`node.py:N ~ laptop.py:M` for every block of WINDOW code lines in both groups."""
    seen: dict[str, tuple[Path, int]] = {}
    for path, source in laptop.items():
        for h, line in windows(source).items():
            seen.setdefault(h, (path, line))
    return [f"{path}:{line} ~ {seen[h][0]}:{seen[h][1]}" for path, source in node.items()
            for h, line in windows(source).items() if h in seen]


def test_detector_finds_a_copied_block() -> None:
    """The check below can fail: a function copied into a node program, under other comments
    and blank lines, is found; one that only shares its imports is not."""
    rule = ("import os\nimport sys\nimport time\nimport json\nimport re\nimport math\n\n"
            "def ended(run_dir, pid):\n    \"\"\"A docstring.\"\"\"\n"
            "    if os.path.exists(os.path.join(run_dir, 'exit_code')):\n        return True\n"
            "    try:\n        os.kill(pid, 0)\n    except ProcessLookupError:\n"
            "        return True\n    return False\n")
    copy = "# a program\n\n" + rule.replace("    try:", "\n    # why\n    try:")
    assert shared({Path("node.py"): copy}, {Path("laptop.py"): rule})
    imports_only = rule.split("\n\n")[0] + "\n\nX = 1\n"
    assert not shared({Path("node.py"): imports_only}, {Path("laptop.py"): rule})


def test_no_block_shared_between_nodeside_and_the_rest() -> None:
    every = {p.relative_to(ROOT): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    node = {p: s for p, s in every.items() if (ROOT / p).is_relative_to(NODESIDE)}
    laptop = {p: s for p, s in every.items() if p not in node}
    found = shared(node, laptop)
    assert not found, ("a block of code stands both on the node's side and the laptop's (put it "
                       "in one shared fleet/nodeside module that both import):\n"
                       + "\n".join(found))
