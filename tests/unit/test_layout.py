"""The package's shape (docs/ARCHITECTURE.md): every module imports on its own (no import cycle,
none hidden behind a package's __init__), no two of fleet's packages import each other (however
far round, and however late: an import inside a function counts), modules are small enough to
read in one go, and the CLI never branches on the backend."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fleet"
MAX_LINES = 350


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The fleet modules a module imports when it is loaded (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found.add(sub if sub in known else node.module)
            for child in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, child, None)
                if isinstance(inner, list) and node is not None and \
                        not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    visit([n for n in inner if isinstance(n, ast.stmt)])

    visit(tree.body)
    return {m for m in found if m in known}


def with_parents(name: str, known: set[str]) -> set[str]:
    """Importing a.b.c loads a and a.b first: their __init__ modules are edges too."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known


def every_import(path: Path, known: set[str]) -> set[str]:
    """The fleet modules a module imports at all: at load, inside functions, for types."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                         else node.module for a in node.names)
    return {m for m in found if m in known}


def package(name: str) -> str:
    """fleet's own first-level package (or top-level module) a module belongs to."""
    return ".".join(name.split(".")[:2])


def test_no_package_cycle() -> None:
    """fleet's packages form layers: a package that another imports never imports it back,
    directly or through others."""
    mods = modules()
    known = set(mods)
    edges: dict[str, dict[str, tuple[str, str]]] = {}
    for m, p in mods.items():
        for i in every_import(p, known):
            if package(i) != package(m) and package(m) != "fleet":
                edges.setdefault(package(m), {}).setdefault(package(i), (m, i))
    # Whether b reaches a, with the path: any such pair is a cycle between packages.
    def path(a: str, b: str) -> list[str] | None:
        seen, todo = {a}, [[a]]
        while todo:
            route = todo.pop()
            for n in edges.get(route[-1], {}):
                if n == b:
                    return route + [n]
                if n not in seen:
                    seen.add(n)
                    todo.append(route + [n])
        return None

    for a, outs in sorted(edges.items()):
        for b, (m, i) in sorted(outs.items()):
            back = path(b, a)
            assert back is None, (f"package cycle: {m} imports {i}, and "
                                  + " -> ".join(back) + " leads back")


def test_no_import_cycle() -> None:
    mods = modules()
    known = set(mods)
    graph = {m: set().union(*(with_parents(i, known) for i in imports(p, known))) - {m}
             for m, p in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1 and not m.startswith(n + "."):
                cycle = stack[stack.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_every_module_imports_on_its_own() -> None:
    """Each module imported first, in a process where no other fleet module is loaded yet: a
    cycle that an entry point's import order happens to hide shows here."""
    names = [m for m in modules() if m not in ("fleet.__main__",)]
    program = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    for m in [m for m in sys.modules if m == 'fleet' or m.startswith('fleet.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as e:\n"
        "        print(f'{name}: {type(e).__name__}: {e}')\n")
    r = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)  # a hang guard, not a timing: 90 s alone at load 17
    assert r.returncode == 0 and not r.stdout, r.stdout + r.stderr


def test_modules_are_small() -> None:
    big = {str(p.relative_to(ROOT)): n for p in modules().values()
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"


def test_the_cli_never_branches_on_the_backend() -> None:
    """The commands ask fleet.backends for the backend; none names one to decide what to do."""
    for path in (PACKAGE / "cli").glob("*.py"):
        text = path.read_text()
        for word in ("is_cluster", "backend.name", "slurm_run", "load_cluster", '== "slurm"',
                     '== "hosts"'):
            assert word not in text, f"{path.name}: {word}"



def seam_crossings(path: Path) -> list[str]:
    """Each import in a module of anything under fleet.backends but the package itself: a
    backend (hosts, slurm) or one of the package's modules (base, checks), at load, inside a
    function or for types, written `import fleet.backends.x`, `from fleet.backends.x import y`
    or `from fleet.backends import x` (x a module there); and any relative import."""
    seam = PACKAGE / "backends"
    inside = {p.stem for p in seam.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in seam.iterdir() if (p / "__init__.py").exists()}
    assert {"base", "checks", "hosts", "slurm"} <= inside  # what the test looks for exists
    crossed = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            names = [f"{'.' * node.level}{node.module or ''}"]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                     if node.module == "fleet.backends" and a.name in inside]
        crossed += [f"{path.name}:{node.lineno}: {name}" for name in names
                    if name.startswith((".", "fleet.backends."))]
    return crossed


def test_the_cli_imports_only_the_seam() -> None:
    """fleet.cli reaches the backends through `fleet.backends` alone (what it needs of the
    seam, it re-exports): never a backend's module, nor the seam's own modules."""
    crossed = [c for p in sorted((PACKAGE / "cli").rglob("*.py")) for c in seam_crossings(p)]
    assert crossed == [], "the CLI crosses the seam:\n" + "\n".join(crossed)


def test_a_crossing_is_seen(tmp_path: Path) -> None:
    """Every way of crossing is found (a check that cannot fail proves nothing), and the one
    allowed import is not."""
    bad = {"import fleet.backends.base\n": "fleet.backends.base",
           "def f() -> None:\n    from fleet.backends.hosts import planview\n":
               "fleet.backends.hosts",
           "from fleet.backends import checks\n": "fleet.backends.checks",
           "if TYPE_CHECKING:\n    from fleet.backends.base import Backend\n":
               "fleet.backends.base",
           "from ..backends import base\n": "..backends"}
    for i, (text, name) in enumerate(bad.items()):
        (tmp_path / f"m{i}.py").write_text(text)
        assert [c.split(": ")[1] for c in seam_crossings(tmp_path / f"m{i}.py")] == [name], text
    (tmp_path / "ok.py").write_text("from fleet import backends\n"
                                    "from fleet.backends import Options, for_inventory\n")
    assert seam_crossings(tmp_path / "ok.py") == []
