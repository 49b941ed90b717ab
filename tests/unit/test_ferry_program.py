"""ferry's modules made one program for the nodes (fleet.transport.transfer.agent.program): it
compiles for Python 3.8, keeps no import of fleet, finds every name a module imports from
another defined before it, binds no name twice; the checks refuse a program that breaks these;
and the program itself, run the way a node runs it, sends, receives, relays and hashes."""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fleet.errors import InternalError
from fleet.nodeside import ferry
from fleet.shell import quote
from fleet.transport.transfer import agent
from fleet.transport.transfer.agent import LOADER, MODULES, PACKAGE, amalgamate, program

HERE = Path(ferry.__file__).parent
KEY = "ab" * 16
MTIME = 1_700_000_000_123_456_789


def sources() -> list[tuple[str, ast.Module]]:
    return [(m, ast.parse((HERE / f"{m}.py").read_text())) for m in MODULES]


def siblings(tree: ast.Module) -> list[tuple[str, str]]:
    """(module, name) of each import from another ferry module."""
    return [(n.module.rpartition(".")[2], a.name) for n in tree.body
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("fleet")
            for a in n.names]


def defined(tree: ast.Module) -> set[str]:
    """The top-level names a module defines itself (not by an import)."""
    out: set[str] = set()
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            out |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
    return out


# ---- the program's text -------------------------------------------------------------------------
def test_the_program_is_every_ferry_module_once_main_last() -> None:
    files = {p.stem for p in HERE.glob("*.py")} - {"__init__"}
    assert sorted(MODULES) == sorted(files) and len(set(MODULES)) == len(MODULES)
    assert MODULES[-1] == "main"


def test_the_program_compiles_for_python_3_8_with_no_fleet_left() -> None:
    text = program()
    compile(text, "fleet-ferry", "exec")
    tree = ast.parse(text, feature_version=(3, 8))
    assert isinstance(tree.body[0], ast.Expr)  # the package's docstring: the stream's format
    future = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
              and n.module == "__future__"]
    assert len(future) == 1 and tree.body[1] is future[0]
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            assert not any(a.name.startswith("fleet") for a in n.names), ast.unparse(n)
        if isinstance(n, ast.ImportFrom):
            assert not n.level and not (n.module or "").startswith("fleet"), ast.unparse(n)
    last = tree.body[-1]
    assert isinstance(last, ast.If) and "__main__" in ast.unparse(last.test)
    assert ast.unparse(last.body[0]) == "run_to_exit(sys.argv[1:])"
    assert "FLEET_FERRY_CODE" not in text.splitlines()  # it would end the here-document
    assert text.endswith("\n")


def test_every_name_imported_from_another_module_is_defined_by_an_earlier_one() -> None:
    before: dict[str, set[str]] = {}
    for name, tree in sources():
        for module, imported in siblings(tree):
            assert module in before, f"{name} imports from {module}, which comes later"
            assert imported in before[module], f"{name}: {module} does not define {imported}"
        before[name] = defined(tree)
    text = program()
    for name, tree in sources():  # ... and in the program, before the module that uses it
        at = text.index(f"# ==== {PACKAGE}.{name}:")
        for module, imported in siblings(tree):
            starts = text.index(f"# ==== {PACKAGE}.{module}:")
            assert starts < at and imported in defined(ast.parse(text[starts:at])), imported


def test_no_two_modules_bind_the_same_top_level_name() -> None:
    """The program has one namespace: a name two modules define, or that one defines and
    another imports from elsewhere, would quietly be the later one's in both."""
    owner: dict[str, str] = {}
    imports: dict[str, str] = {}
    for name, tree in sources():
        for n in tree.body:
            if isinstance(n, ast.Import):
                for a in n.names:
                    assert imports.setdefault(a.asname or a.name, a.name) == a.name
            elif isinstance(n, ast.ImportFrom) and n.module != "__future__" and not (
                    n.module or "").startswith("fleet"):
                for a in n.names:
                    what = f"{n.module}.{a.name}"
                    assert imports.setdefault(a.asname or a.name, what) == what
        for d in defined(tree):
            assert owner.setdefault(d, name) == name, f"{d}: both {owner[d]} and {name}"
    assert not set(owner) & set(imports), set(owner) & set(imports)


def test_the_package_exports_what_its_callers_use() -> None:
    used = set()
    root = HERE.parent.parent.parent
    for path in [*root.glob("fleet/**/*.py"), *root.glob("tests/**/*.py"),
                 *root.glob("bench/*.py")]:
        if HERE not in path.parents:
            used |= set(re.findall(r"\bferry\.([A-Za-z_]\w*)", path.read_text()))
    assert {u for u in used if not u.startswith("__")} - set(MODULES) <= set(ferry.__all__)


# ---- the checks refuse a program that would be wrong --------------------------------------------
DOC = '"""doc"""'
A = '"""a"""\nfrom __future__ import annotations\n\nimport os\n\nX = 1\n\n\ndef f() -> int:\n' \
    '    return X\n'


@pytest.mark.parametrize(("modules", "why"), [
    ([("frames", A), ("send", "import os\n\ndef f():\n    pass\n")], "both bind f"),
    ([("frames", A), ("send", "X = 2\n")], "both bind X"),
    ([("frames", A), ("send", "from sys import path as os\n")], "both bind os"),
    ([("frames", A), ("send", "def os():\n    pass\n")], "both bind os"),
    ([("frames", "from fleet.nodeside.ferry.send import Y\n"), ("send", "Y = 1\n")],
     "no module before it"),
    ([("frames", A), ("send", "from fleet.nodeside.ferry.frames import os2\n")],
     "no module before it"),
    ([("frames", A), ("send", "from fleet.nodeside.ferry.frames import X as Z\n")],
     "no module before it"),
    ([("frames", A), ("send", "from fleet.shell import quote\n")], "not one of ferry's"),
    ([("frames", A), ("send", "def g():\n    from fleet.nodeside.ferry.frames import X\n")],
     "imports from fleet"),
    ([("frames", A), ("send", "from .frames import X\n")], "imports from fleet"),
    ([("frames", A), ("send", "import fleet.shell\n")], "imports from fleet"),
    ([("frames", A + "if __name__ == '__main__':\n    f()\n"), ("send", "Y = 1\n")],
     "__main__ block"),
    ([("frames", "from __future__ import division\n")], "only"),
    ([("frames", "match = 1\nmatch match:\n    case 1:\n        pass\n")], "3.8"),
])
def test_amalgamate_refuses(modules: list[tuple[str, str]], why: str) -> None:
    with pytest.raises(InternalError, match=why):
        amalgamate(DOC, modules)


def test_amalgamate_keeps_a_stdlib_import_two_modules_share_and_drops_the_siblings() -> None:
    text = amalgamate(DOC, [("frames", A), ("send", '"""s"""\nimport os\n\nfrom '
                            'fleet.nodeside.ferry.frames import X, f\n\nY = f() + X\n')])
    assert text.startswith('"""doc"""\n\n\nfrom __future__ import annotations\n\n\n# ==== ')
    assert "fleet.nodeside.ferry.frames import" not in text and text.count("import os") == 2
    ns: dict[str, object] = {"__name__": "x"}
    exec(compile(text, "t", "exec"), ns)
    assert ns["Y"] == 2


# ---- the program, run the way a node runs it ----------------------------------------------------
def pythons() -> list[object]:
    """This python, and a Python 3.8 (the oldest a node may have) where one is here."""
    old = [shutil.which("python3.8"), *sorted(glob.glob(os.path.expanduser(
        "~/.pyenv/versions/3.8*/bin/python3.8")))]
    for py in old:
        if py and subprocess.run([py, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                                 capture_output=True).returncode == 0:
            return [sys.executable, pytest.param(py, id="python3.8")]
    return [sys.executable, pytest.param("python3.8", id="python3.8", marks=pytest.mark.skip(
        reason="no Python 3.8 here"))]


def put(path: Path, content: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    os.chmod(path, mode)
    os.utime(path, ns=(MTIME, MTIME))


FILES = {"big.bin": os.urandom(2 * ferry.BLOCK + 5), "d/e/small.txt": b"hello\n", "empty": b""}


def loaded(python: str, args: str, code: Path) -> list[str]:
    """The node's command line, the program on fd 3 from a file (agent's here-document carries
    no binary stdin)."""
    return ["sh", "-c", f"{quote(python)} -c {quote(LOADER)} {args} 3< {quote(str(code))}"]


def reports(out: bytes, mark: str) -> list[dict[str, object]]:
    lines = out.decode().split("\n")
    return [json.loads(line) for line in lines[lines.index(mark) + 1:] if line]


@pytest.mark.parametrize("python", pythons())
def test_the_program_sends_and_receives_a_tree_and_hashes_it(tmp_path: Path, python: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    for rel, content in FILES.items():
        put(src / rel, content, 0o640 if rel == "empty" else 0o644)
    code = tmp_path / "ferry-program.py"
    code.write_text(program())
    rels = json.dumps([*FILES, "missing"])
    sent = subprocess.run(["sh", "-c", agent.agent(python, f"send {quote(str(src))} FERRY-1",
                                                   rels)], capture_output=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    stream = sent.stdout[sent.stdout.index(b"\nFERRY-1\n") + 9:]
    ctl = json.dumps({"key": KEY, "roots": [str(dst)], "me": 0})
    go = json.dumps({"source": "stdin", "forward": False})
    got = subprocess.run(loaded(python, "recv FERRY-2", code), capture_output=True, timeout=60,
                         input=f"{ctl}\n{go}\n".encode() + stream)
    assert got.returncode == 0, got.stderr
    said = reports(got.stdout, "FERRY-2")
    assert said[-1] == {"done": {"files": 3, "bytes": sum(map(len, FILES.values())),
                                 "failed": False}}
    assert sorted(tuple(r["ok"]) for r in said if "ok" in r) == sorted(  # type: ignore[arg-type]
        (0, rel, hashlib.sha256(c).hexdigest()) for rel, c in FILES.items())
    for rel, content in FILES.items():
        st = os.stat(dst / rel)
        assert (dst / rel).read_bytes() == content and st.st_mtime_ns == MTIME
        assert st.st_mode & 0o777 == (0o640 if rel == "empty" else 0o644)
    assert not list(dst.rglob("*.fleet-part"))
    held = subprocess.run(["sh", "-c", agent.agent(python, f"hash {quote(str(dst))}", rels)],
                          capture_output=True, text=True, timeout=60)
    assert held.returncode == 0, held.stderr
    lines = sorted(held.stdout.splitlines())
    assert lines == sorted(f"{json.dumps(rel)}\tfile\t{len(c)}\t{hashlib.sha256(c).hexdigest()}\t"
                           f"{''.join(ferry.hash_file(str(src / rel))[2])}"
                           for rel, c in FILES.items())
    usage = subprocess.run(loaded(python, "", code), capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ferry hash")


class Node:
    """One `ferry recv` started as a node starts it, its reports read in a thread."""

    def __init__(self, python: str, code: Path, mark: str, listen: str = "") -> None:
        self.proc = subprocess.Popen(loaded(python, f"recv {mark} {listen}", code),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.lines: queue.Queue[dict[str, object]] = queue.Queue()
        self.mark = mark
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        started = False
        for line in self.proc.stdout:
            if started and line.strip():
                self.lines.put(json.loads(line))
            started = started or line.strip() == self.mark.encode()

    def tell(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def said(self, key: str) -> dict[str, object]:
        while True:
            r = self.lines.get(timeout=30)
            if key in r:
                return r


@pytest.mark.parametrize("python", pythons())
def test_the_program_relays_from_one_node_to_the_next_as_fleet_vouches(tmp_path: Path,
                                                                        python: str) -> None:
    """Two receivers on this machine: the first fed on its stdin and passing every frame on
    over the relay link (HMAC both ways), the second writing only what fleet's word agrees
    with. The frames come from this machine's own ferry: one engine on both ends."""
    code = tmp_path / "ferry-program.py"
    code.write_text(program())
    for rel, content in FILES.items():
        put(tmp_path / "src" / rel, content)
    frames: list[bytes] = []
    shas = {}
    for rel, content in FILES.items():
        shas[rel] = ferry.send_file(frames.append, 0, rel, str(tmp_path / "src" / rel),
                                    len(content), MTIME, 0o644, None, [0, 1])
    frames.append(ferry.frame(b"Z", b""))
    first, second = Node(python, code, "FERRY-A"), Node(python, code, "FERRY-B", "127.0.0.1")
    try:
        port = second.said("port")["port"]
        second.tell(json.dumps({"key": KEY, "roots": [str(tmp_path / "b")], "me": 1}).encode()
                    + b"\n")
        first.tell(json.dumps({"key": KEY, "roots": [str(tmp_path / "a")], "me": 0,
                               "next": ["127.0.0.1", port]}).encode() + b"\n")
        assert first.said("linked")["linked"] is True
        second.tell(json.dumps({"source": "socket", "forward": False}).encode() + b"\n")
        first.tell(json.dumps({"source": "stdin", "forward": True}).encode() + b"\n")
        first.tell(b"".join(frames))
        word = [{"file": [0, rel, len(FILES[rel]), 0o644, MTIME, None, [0, 1]]} for rel in shas]
        word += [{"sha": [0, rel, sha]} for rel, sha in shas.items()] + [{"end": True}]
        second.tell(b"".join(json.dumps(w).encode() + b"\n" for w in word))
        for node in (first, second):
            assert node.said("done")["done"] == {"files": 3, "bytes": sum(map(len,
                                                                               FILES.values())),
                                                 "failed": False}
        # Each ends once done, its stdin still open (as fleet waits for it): the relayed one's
        # reader of fleet's word, blocked on that stdin, holds no exit back.
        for node in (first, second):
            node.proc.wait(timeout=30)
    finally:
        for node in (first, second):
            if node.proc.stdin:
                node.proc.stdin.close()
            node.proc.wait(timeout=30)
    for node in (first, second):
        assert node.proc.returncode == 0 and node.proc.stderr
        err = node.proc.stderr.read().decode()
        assert "Fatal Python error" not in err and "could not acquire lock" not in err, err
    for side in ("a", "b"):
        for rel, content in FILES.items():
            assert (tmp_path / side / rel).read_bytes() == content


def test_the_program_is_made_once_whichever_threads_ask_at_once() -> None:
    """The first transfer asks from one thread per node at once: one thread makes the text
    (CPython 3.11's ast is not safe in two threads at a time), every thread gets it."""
    import threading

    from fleet.transport.transfer import agent

    def ask(start: threading.Barrier, got: list[str], errors: list[BaseException]) -> None:
        start.wait(timeout=30)
        try:
            got.append(agent.program())
        except BaseException as e:  # the test reports what a thread met
            errors.append(e)

    for _ in range(5):
        agent._program.cache_clear()
        got: list[str] = []
        errors: list[BaseException] = []
        start = threading.Barrier(8)
        threads = [threading.Thread(target=ask, args=(start, got, errors)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors and len(got) == 8 and len(set(got)) == 1
        assert agent._program.cache_info().misses == 1  # made once
