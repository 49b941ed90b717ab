"""No rule is copied between the node's side and the laptop's: a program that runs on a node is
bundled from fleet/nodeside's shared modules (fleet.nodeside.bundle), which the laptop imports
too, so no block of code stands both in fleet/nodeside/ and elsewhere in fleet/."""

from __future__ import annotations

import ast
import glob
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleet import nodeside
from fleet.errors import InternalError
from fleet.lifecycle import notify
from fleet.nodeside import bundle
from fleet.nodeside.shared import nodemap, run_end, scrub
from fleet.shell import quote

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


def node_files() -> dict[Path, str]:
    return {p.relative_to(ROOT): p.read_text() for p in sorted(NODESIDE.rglob("*.py"))}


def test_no_block_shared_between_two_node_programs() -> None:
    """Two node programs (or ferry and a program) share a module, never a copy."""
    seen: dict[str, tuple[Path, int]] = {}
    found = []
    for path, source in node_files().items():
        for h, line in windows(source).items():
            other = seen.setdefault(h, (path, line))
            if other[0] != path:
                found.append(f"{path}:{line} ~ {other[0]}:{other[1]}")
    assert not found, "a block of code stands in two node-side files:\n" + "\n".join(found)


def test_no_block_shared_between_nodeside_and_the_rest() -> None:
    every = {p.relative_to(ROOT): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    node = {p: s for p, s in every.items() if (ROOT / p).is_relative_to(NODESIDE)}
    laptop = {p: s for p, s in every.items() if p not in node}
    found = shared(node, laptop)
    assert not found, ("a block of code stands both on the node's side and the laptop's (put it "
                       "in one shared fleet/nodeside module that both import):\n"
                       + "\n".join(found))


# ---- the shared modules, from both sides --------------------------------------------------------
def test_the_node_map() -> None:
    assert nodemap.run_dir("~/fleet/", "r1", "n1") == "~/fleet/runs/r1/n1"
    assert nodemap.run_dir("/scratch", "r1") == "/scratch/runs/r1"
    assert nodemap.code_dir("/", "job-1") == "/code/job-1"
    assert nodemap.data_dir("~/fleet", "d-1") == "~/fleet/data/d-1"
    assert nodemap.data_dir("~/fleet", None) is None
    assert nodemap.runs_dir("~/fleet") == "~/fleet/runs"
    assert nodemap.run_vars("r1-a2", "r1", "n1", 2, "/w/runs/r1-a2/n1") == {
        "FLEET_RUN_ID": "r1", "FLEET_ATTEMPT_ID": "r1-a2", "FLEET_NODE": "n1",
        "FLEET_NODE_RANK": "2", "FLEET_RUN_DIR": "/w/runs/r1-a2/n1"}


def test_the_scrubs() -> None:
    assert scrub.printable("a\x1b[31mb\r\n\u202e") == "a^[[31mb^M^J<U+202E>"
    assert scrub.printable("a\nb", lines=True) == "a\nb"
    assert scrub.masked("Müller\x1b[0m\t") == "Müller?[0m?"


def pythons() -> list[str]:
    """This python, and a Python 3.8 (the oldest a node may have) where one is here."""
    old = [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8"))),
           shutil.which("python3.8")]  # pyenv's shim may name none
    return [sys.executable, *[p for p in old if p][:1]]


class Hook(http.server.BaseHTTPRequestHandler):
    """A webhook that keeps what it was sent."""

    got: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        Hook.got.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("python", pythons())
def test_the_bundled_watcher_tells_what_fleet_would(tmp_path: Path, python: str) -> None:
    """notify_watch.py as a node runs it (bundled, `-I -S`, from a here-document): its notice
    opens with the headline fleet's own notify writes for the same run (one run_end for both),
    and its traceback is found by the header fleet's failure reports use."""
    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hook.got = []
    run = tmp_path / "run"
    run.mkdir()
    (run / nodemap.NODE_LOG).write_text(f"hi\n{run_end.TRACEBACK}\nValueError: bad\x1b[0m\n")
    (run / nodemap.EXIT_CODE).write_text("1\n")
    (run / nodemap.STARTED).write_text(f"{int((run / nodemap.EXIT_CODE).stat().st_mtime) - 61}\n")
    (run / nodemap.NOTIFY_JSON).write_text(json.dumps({
        "webhook": f"http://127.0.0.1:{server.server_port}/hook", "format": "json",
        "run_id": "r1", "job": "j", "node": "n1", "where": "the hook", "proof": "x"}))
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        r = subprocess.run(["sh", "-c", nodeside.python_program(
            quote(python), "notify_watch.py", str(run), gone.pid, flags=("-I", "-S"))],
            capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    body = json.loads(Hook.got[0])
    said = body["text"].splitlines()
    notice = notify.Notice("r1", "j", notify.NoticeState.FAILED, 61, "")
    assert said[0] == notify.headline(notice) == "fleet: run r1 (j) failed after 1m 01s"
    assert said[-2:] == [f"    {run_end.TRACEBACK}", "    ValueError: bad?[0m"]
    assert not (run / nodemap.NOTIFY_JSON).exists()
    assert "failed: told the hook" in (run / nodemap.NOTIFY_LOG).read_text()


# ---- bundling --------------------------------------------------------------------------------
PY_PROGRAMS = sorted(p.name for p in NODESIDE.glob("*.py") if p.name not in (
    "__init__.py", "bundle.py"))


@pytest.mark.parametrize("name", PY_PROGRAMS)
def test_every_python_program_ships_as_one_python_3_8_text(name: str) -> None:
    text = nodeside.text(name)
    tree = ast.parse(text, feature_version=(3, 8))
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            assert not (n.module or "").startswith("fleet") and not n.level, ast.unparse(n)
        if isinstance(n, ast.Import):
            assert not any(a.name.startswith("fleet") for a in n.names), ast.unparse(n)


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_a_program_is_bundled_with_what_it_imports_in_order(tmp_path: Path) -> None:
    write_tree(tmp_path, {
        "shared/a.py": '"""a."""\nimport os\n\nA = os.sep\n',
        "shared/b.py": '"""b."""\nfrom fleet.nodeside.shared.a import A\n\nB = A * 2\n',
        "prog.py": '"""prog."""\nimport os\n\nfrom fleet.nodeside.shared.b import B\n'
                   'from fleet.nodeside.shared.a import A\n\nprint(B + A)\n',
        "plain.py": '"""plain."""\nprint(1)\n'})
    text = bundle.program(tmp_path / "prog.py")
    assert text.startswith('"""prog."""') and "from fleet" not in text
    assert text.index("A = os.sep") < text.index("B = A * 2") < text.index("print(B + A)")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", text], capture_output=True, text=True,
                       timeout=30)
    assert r.stdout == "///\n", r.stderr
    assert bundle.program(tmp_path / "plain.py") == '"""plain."""\nprint(1)\n'


@pytest.mark.parametrize(("files", "why"), [
    ({"shared/a.py": "from fleet.nodeside.shared.b import B\nA = 1\n",
      "shared/b.py": "from fleet.nodeside.shared.a import A\nB = 1\n"}, "imports itself"),
    ({}, "not a module"),
    ({"shared/a.py": "from fleet.shell import quote\nA = 1\n"}, "imports from fleet"),
    ({"shared/a.py": "A = 1\n\n\ndef main():\n    pass\n"}, "both bind main"),
])
def test_a_bundle_that_would_be_wrong_is_refused(tmp_path: Path, files: dict[str, str],
                                                 why: str) -> None:
    write_tree(tmp_path, {**files, "prog.py": "from fleet.nodeside.shared.a import A\n\n\n"
                          "def main():\n    print(A)\n"})
    with pytest.raises(InternalError, match=why):
        bundle.program(tmp_path / "prog.py")
