"""What gets synced, the pure parts: .gitignore (git's answer in a work tree, pathspec's
elsewhere) and .fleetignore; what an earlier sync left and is removed; `fleet plan`'s summary;
the job interpreter's packages (the fact and its parser); `fleet diff` saying each change once."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import manifest, manifest_view
from fleet.backends.hosts import planview
from fleet.config.job import load_job
from fleet.config.notify import holds_notify
from fleet.facts.probe import parse_packages, parse_probe
from fleet.manifest_view import grouped, words_changed
from fleet.nodeside import python_facts
from fleet.transport import ignore, prune
from fleet.transport.sync import listing_script, parse_listing, scan
from tests.unit.test_setup_manifest import a_manifest

NS = 10**9


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


WORKDIR = {
    ".gitignore": "typo*.toml\nbuild/\n*.log\n",
    ".fleetignore": "*.bin\n!keep.log\n",
    "sub/.gitignore": "!sub.log\nlocal.py\n",
    "train.py": "print(1)\n", "typo1.toml": "", "typo2.toml": "", "build/a.o": "x",
    "big.bin": "0" * 100, "keep.log": "k", "x.log": "", "sub/local.py": "", "sub/y.py": "",
    "sub/sub.log": "",
}
SENT = [".fleetignore", ".gitignore", "keep.log", "sub/.gitignore", "sub/sub.log", "sub/y.py",
        "train.py"]


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


@pytest.mark.parametrize("in_git", [False, True])
def test_gitignore_and_fleetignore_leave_files_out_with_the_file_that_did(
        tmp_path: Path, in_git: bool) -> None:
    """In a git work tree git decides (nested .gitignore and its `!` included), elsewhere the
    .gitignore files read the same way; .fleetignore adds its own and its `!` sends a file
    .gitignore leaves out (keep.log)."""
    root = tree(tmp_path / "w", WORKDIR)
    if in_git:
        git(root, "init", "-q")
    assert (ignore.git_ignored(root) is not None) == in_git
    s = scan(root, (".git",), ignore_files=True)
    assert sorted(s.files) == SENT
    assert dict(s.ignored) == {"big.bin": ".fleetignore", "build/a.o": ".gitignore",
                               "sub/local.py": ".gitignore", "typo1.toml": ".gitignore",
                               "typo2.toml": ".gitignore", "x.log": ".gitignore"}
    # Without ignore files (a data directory) everything is sent, as before.
    assert len(scan(root, (".git",)).files) == len(WORKDIR)


def test_an_ignored_directory_is_not_walked_and_counts_once(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {".gitignore": "node_modules/\n", "a.py": "",
                                 **{f"node_modules/m{i}.js": "" for i in range(50)}})
    git(root, "init", "-q")
    s = scan(root, (".git",), ignore_files=True)
    assert sorted(s.files) == [".gitignore", "a.py"]
    assert s.ignored == (("node_modules/", ".gitignore"),)
    assert ignore.summary(s.ignored) == "1 path(s) by .gitignore"


def test_git_keeps_a_tracked_file_that_gitignore_names(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {".gitignore": "*.cfg\n", "a.cfg": "", "b.cfg": ""})
    git(root, "init", "-q")
    git(root, "add", "-f", "a.cfg")
    s = scan(root, (".git",), ignore_files=True)
    assert "a.cfg" in s.files and "b.cfg" not in s.files


def test_parse_git_ignored_keeps_names_whole_and_drops_the_workdir_itself() -> None:
    out = "build/\0odd name\nwith newline.log\0./\0"
    assert ignore.parse_git_ignored(out) == {"build/", "odd name\nwith newline.log"}
    rules = ignore.Ignores(Path("/w"), frozenset({"build/", "x.log"}), None)
    assert rules.why("build", True) == ".gitignore"
    assert rules.why("build/deep/a.o", False) == ".gitignore"
    assert rules.why("buildx/a.o", False) is None and rules.why("x.log", False) == ".gitignore"
    fleet = ignore.Ignores(Path("/w"), frozenset({"x.log"}), ignore.spec_of("*.log\n!x.log\n"))
    assert fleet.why("x.log", False) is None and fleet.why("y.log", False) == ".fleetignore"
    assert fleet.reincludes and not rules.reincludes


def test_summary_and_counted_put_gitignore_first() -> None:
    ignored = (("a.bin", ".fleetignore"), ("b.toml", ".gitignore"), ("c.toml", ".gitignore"))
    assert ignore.counted(ignored) == [(".gitignore", ["b.toml", "c.toml"]),
                                       (".fleetignore", ["a.bin"])]
    assert ignore.summary(ignored) == "2 path(s) by .gitignore, 1 by .fleetignore"


# ---- what an earlier sync left -------------------------------------------------------------
def test_the_record_reads_back_and_a_nodes_unsafe_names_are_dropped() -> None:
    now = {"a.py": (3, 5 * NS + 1), "pkg/b.py": (4, 6 * NS)}
    listing = f"#dir 0\na.py\t3\t5.000000001\n#end\n#was\n{prune.record(now).decode()}\n"
    assert prune.parse_was(listing) == now
    assert parse_listing(listing, 1) == [{"a.py": (3, 5 * NS + 1)}]  # the record is not a file
    bad = json.dumps({"../x": [1, 1], "/etc/passwd": [1, 1], "a//b": [1, 1], "ok": [1, 2],
                      "neg": [-1, 2], "t": [True, 1], "s": ["1", 2], "three": [1, 2, 3]})
    assert prune.parse_was(f"#was\n{bad}\n") == {"ok": (1, 2)}
    for garbage in ("", "#was\n", "#was\nnot json\n", "#was\n[1, 2]\n", "no mark\n{}\n"):
        assert prune.parse_was(garbage) == {}


def test_stale_files_are_those_synced_before_not_now_and_untouched_since() -> None:
    was = {"gone.py": (3, 5 * NS), "kept.py": (3, 5 * NS), "rewritten.pt": (9, 5 * NS),
           "vanished.py": (1, 1), "coarse.py": (2, 7 * NS + 123)}
    now = {"kept.py": (3, 5 * NS)}
    there = {"gone.py": (3, 5 * NS), "kept.py": (3, 5 * NS), "rewritten.pt": (9, 8 * NS),
             "coarse.py": (2, 7 * NS), "mine.txt": (1, 1)}
    # rewritten.pt: the job wrote it since (another time); coarse.py: a filesystem of seconds
    assert prune.stale(was, now, there) == ["coarse.py", "gone.py"]


def test_the_removal_script_removes_only_what_it_names_and_the_directories_left_empty(
        tmp_path: Path) -> None:
    code = tree(tmp_path / "code", {
        "old/pkg/__init__.py": "", "old/pkg/__pycache__/__init__.cpython-311.pyc": "",
        "old/pkg/__pycache__/other.cpython-311.pyc": "", "old/out.txt": "",
        "it's $(here).py": "", "__pycache__/it's $(here).cpython-311.pyc": "",
        "keep/a.py": "", "keep/gone.py": ""})
    there = {str(p.relative_to(code)): (0, 0) for p in code.rglob("*") if p.is_file()}
    rels = ["it's $(here).py", "keep/gone.py", "old/pkg/__init__.py"]
    script = prune.removal_script(str(code), rels, there)
    assert subprocess.run(["sh", "-c", script], capture_output=True).returncode == 0
    left = sorted(str(p.relative_to(code)) for p in code.rglob("*"))
    # other.pyc is not the removed file's: its directories stay, and so does the job's out.txt
    assert left == ["keep", "keep/a.py", "old", "old/out.txt", "old/pkg", "old/pkg/__pycache__",
                    "old/pkg/__pycache__/other.cpython-311.pyc"]
    entries, after = prune.entries(str(code), {"keep/a.py": (0, 0)}, rels, there)
    assert [e.dest for e in entries] == [f"{code}/.fleet-files", f"{code}/.fleet-remove.sh"]
    assert after == (f"{code}/.fleet-remove.sh",)
    assert prune.entries(str(code), {}, [], there)[1] == ()


def test_the_listing_reads_the_record_under_sh(tmp_path: Path) -> None:
    code = tree(tmp_path / "code", {"a.py": "x"})
    (code / prune.FILES).write_bytes(prune.record({"old.py": (1, NS)}))
    script = listing_script([str(code)], then=tuple(prune.listing_lines(str(code))))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout
    assert prune.parse_was(out) == {"old.py": (1, NS)}
    assert set(parse_listing(out, 1)[0]) == {"a.py", prune.FILES}
    empty = listing_script([str(tmp_path / "new")], then=tuple(prune.listing_lines(
        str(tmp_path / "new"))))
    assert prune.parse_was(subprocess.run(["sh", "-c", empty], capture_output=True,
                                          text=True).stdout) == {}


# ---- fleet plan ----------------------------------------------------------------------------
def test_plan_says_how_much_is_synced_its_largest_files_and_what_was_ignored(
        tmp_path: Path) -> None:
    root = tree(tmp_path / "w", WORKDIR)
    s = scan(root, (".git",), ignore_files=True)
    lines = planview.code_lines(s)
    assert lines == [
        f"code to sync: 7 file(s), 68 bytes from {root} (largest: .gitignore 24 bytes, "
        "sub/.gitignore 18 bytes, .fleetignore 16 bytes)",
        "  ignored by .gitignore: 5 (build/a.o, sub/local.py, typo1.toml and 2 more)",
        "  ignored by .fleetignore: 1 (big.bin)"]
    js = planview.code_json(s)
    assert js["files"] == 7 and js["bytes"] == 68
    assert {"path": "big.bin", "by": ".fleetignore"} in js["ignored"]  # type: ignore[operator]


# ---- the job interpreter's packages --------------------------------------------------------
def test_the_packages_fact_lists_this_interpreters_distributions() -> None:
    out: python_facts.Json = {}
    python_facts.packages(out)
    import pytest as installed
    assert f"pytest=={installed.__version__}" in out["packages"]
    names = [p.split("==")[0].lower().replace("_", "-") for p in out["packages"]]
    assert names == sorted(set(names))  # by name, each once
    said = subprocess.run([sys.executable, python_facts.__file__], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": ""}).stdout
    facts = parse_probe(said)
    assert f"pytest=={installed.__version__}" in facts.packages


def test_the_packages_fact_reads_what_importlib_metadata_reads(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Read from the headers alone, the list is importlib.metadata's own: the first of a name
    along sys.path, a directory's dist-info before its egg-info."""
    from importlib.metadata import distributions
    first, second = tmp_path / "a", tmp_path / "b"
    for d, name, ver, kind in ((first, "Shadow_Pkg", "2.0", "dist"), (second, "shadow-pkg",
                                "1.0", "dist"), (second, "Old.Egg", "0.3", "egg"),
                               (first, "Bare", "0.1", "dist")):
        meta = d / (f"{name}-{ver}.dist-info" if kind == "dist" else f"{name}-{ver}.egg-info")
        meta.mkdir(parents=True)
        body = f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\nSummary: x\n\nName: no\n"
        (meta / ("METADATA" if kind == "dist" else "PKG-INFO")).write_text(body)
    monkeypatch.setattr(sys, "path", [str(first), str(tmp_path / "gone"), str(second),
                                      *sys.path])
    out: python_facts.Json = {}
    python_facts.packages(out)
    seen: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        key = name.lower().replace("_", "-").replace(".", "-")
        if name and key not in seen:
            seen[key] = f"{name}=={dist.version}"
    assert out["packages"] == [seen[k] for k in sorted(seen)]
    assert "Shadow_Pkg==2.0" in out["packages"] and "Old.Egg==0.3" in out["packages"]
    assert not any(p.startswith("shadow-pkg==") for p in out["packages"])


def test_parse_packages_keeps_name_version_pairs_only() -> None:
    said = ["torch==2.14.1+cpu", "Foo_Bar==1.0rc1", "evil==1\x1b[31m", "no-version",
            "sp ace==1", 7, "==1", "x==" + "9" * 101]
    assert parse_packages(said) == ("torch==2.14.1+cpu", "Foo_Bar==1.0rc1")
    assert parse_packages("torch==1") == () and parse_packages(None) == ()


def test_the_manifest_keeps_the_list_with_its_hash_and_show_says_the_count() -> None:
    entry = manifest.packages_entry(("a==1", "b==2"))
    assert entry is not None and entry["count"] == 2 and entry["list"] == ["a==1", "b==2"]
    assert entry == manifest.packages_entry(("a==1", "b==2"))
    assert entry["sha256"] != manifest.packages_entry(("a==1", "b==3"))["sha256"]  # type: ignore[index]
    assert manifest.packages_entry(None) is None


def with_packages(m: dict, lists: dict[str, list[str]]) -> dict:  # type: ignore[type-arg]
    m = copy.deepcopy(m)
    for name, packages in lists.items():
        m["nodes"][name]["packages"] = manifest.packages_entry(tuple(packages))
    return m


def test_diff_names_package_changes_once_and_show_keeps_the_list_out(tmp_path: Path) -> None:
    base = ["torch==2.14.1", "transformers==4.40.0", "tqdm==4.66.0"]
    a = with_packages(a_manifest(tmp_path), {n: base for n in "abc"})
    b = with_packages(a_manifest(tmp_path, "j-2"), {
        "a": ["torch==2.15.0", "transformers==4.41.0", "tqdm==4.66.0", "Safe_Tensors==0.4"],
        "b": ["torch==2.14.1", "transformers==4.41.0", "tqdm==4.66.0"],
        "c": base})
    b["nodes"]["a"]["versions"]["torch"] = "2.15.0"
    assert manifest_view.diff(a, b) == [
        "a: torch 2.14.1 -> 2.15.0",  # said once, as a version, not again as a package
        "a: package Safe_Tensors (none) -> 0.4",
        "on a, b: package transformers 4.40.0 -> 4.41.0"]
    shown = "\n".join(manifest_view.show(b))
    assert "transformers" not in shown
    assert f"  packages: 4 installed (sha256 {b['nodes']['a']['packages']['sha256'][:12]}; " \
           "`fleet show --json` lists them)" in shown
    old = copy.deepcopy(a)
    del old["nodes"]["a"]["packages"]  # a run recorded before packages were: nothing to say
    assert not any("package" in line for line in manifest_view.diff(old, b) if "a:" in line)


# ---- fleet diff says each change once ------------------------------------------------------
def test_one_added_argument_is_said_once_for_every_node(tmp_path: Path) -> None:
    a, b = a_manifest(tmp_path), copy.deepcopy(a_manifest(tmp_path, "j-2"))
    for name in b["nodes"]:
        b["nodes"][name]["argv"] = b["nodes"][name]["argv"] + ["--resume"]
    # c's home differs (/hc): its command differs in every path, the change does not
    assert a["nodes"]["c"]["argv"][-1].startswith("/hc/")
    assert manifest_view.diff(a, b) == ["on every node (3): command: … train.py {+--resume+}"]


def test_grouped_names_the_nodes_a_change_holds_for() -> None:
    per = {"a": ["x", "y"], "b": ["x"], "c": ["x", "z"]}
    assert grouped(per, every=True) == ["on every node (3): x", "a: y", "c: z"]
    assert grouped(per, every=False) == ["on a, b, c: x", "a: y", "c: z"]
    assert grouped({"a": ["y"], "b": ["y"], "c": []}, every=True) == ["on a, b: y"]
    assert grouped({}, every=True) == []


@pytest.mark.parametrize(("old", "new", "said"), [
    ("p -m run --lr 0.1 t.py", "p -m run --lr 0.1 t.py --resume", "… t.py {+--resume+}"),
    ("p -m run --lr 0.1 t.py", "p -m run --lr 0.2 t.py", "… --lr [-0.1-]{+0.2+} …"),
    ("p -m run t.py", "q -m run t.py", "[-p-]{+q+} …"),
    ("p -m run t.py", "p run t.py", "p [--m-] …"),
    ("p a b c d e f", "p X b c d e f Y", "p [-a-]{+X+} … f {+Y+}"),
    ("p /h/a/t.py --x", "p /h/a/t.py --y", "… t.py [---x-]{+--y+}"),
    ("p a b", "p a b", ""),
])
def test_words_changed_reads_like_git_word_diff(old: str, new: str, said: str) -> None:
    assert words_changed(old.split(), new.split()) == said


def test_needed_names_the_jobs_files_an_ignore_file_leaves_out() -> None:
    ignored = (("train.py", ".gitignore"), ("conf/", ".fleetignore"))
    assert ignore.needed(ignored, ("train.py", "conf/req.txt", "ok.py", "")) == [
        ("train.py", ".gitignore"), ("conf/req.txt", ".fleetignore")]
    assert ignore.needed((("confx/", ".gitignore"),), ("conf/req.txt",)) == []


@pytest.mark.parametrize(("text", "holds"), [
    ('script = "t.py"\n[notify]\nwebhook = "https://h/T0K3N"\n', True),
    ('notify = { command = ["true"] }\n', True),
    ('notify.webhook = "https://h/x"\n', True),
    ('"\\u006eotify" = { webhook = "https://h/x" }\n', True),  # a quoted key, escaped
    ("[notify]\n", False),  # empty: it turns word off, and holds nothing
    ('script = "t.py"\n[env]\nNOTIFY = "1"\n', False),
    ('[tool.x]\nnotify = "y"\n', False),  # not fleet's (not at the top)
    ('[notify]\nwebhook = "https://h/x"\nbroken = \n', True),  # not TOML: judged by its lines
    ('  [ notify ]\nwebhook = "https://h/x"\n=\n', True),
    ('# notify = no\nx = \n', False),
])
def test_holds_notify(text: str, holds: bool) -> None:
    assert holds_notify(text) is holds


def test_a_toml_file_with_a_notify_is_never_synced(tmp_path: Path) -> None:
    """The job file, a sibling job's and a fleet config file alike: their webhook would reach
    every node (mode 644 in the code directory); .fleetignore cannot send them."""
    root = tree(tmp_path / "w", {
        "job.toml": 'script = "t.py"\n[notify]\nwebhook = "https://h/T0K3N"\n',
        "jobs/other.TOML": 'notify = { webhook = "https://h/T0K3N" }\n',
        "quiet.toml": 'script = "t.py"\n[notify]\n', "pyproject.toml": "[project]\n",
        "notes.txt": "[notify]\nwebhook = 1\n", "t.py": "", ".fleetignore": "!job.toml\n"})
    s = scan(root, (), ignore_files=True)
    assert sorted(s.files) == [".fleetignore", "notes.txt", "pyproject.toml", "quiet.toml", "t.py"]
    assert sorted(s.ignored) == [("job.toml", "[notify]"), ("jobs/other.TOML", "[notify]")]
    assert ignore.counted(s.ignored) == [("[notify]", ["job.toml", "jobs/other.TOML"])]
    # nor from a directory synced without ignore files (the data)
    assert scan(root, ()).files == s.files


@pytest.mark.parametrize("name", ["nightly", "job[1].cfg", "j*b?.cfg", "!job#.cfg"])
def test_a_job_file_not_named_toml_with_a_notify_is_never_synced(tmp_path: Path,
                                                                 name: str) -> None:
    """By its real path: neither a name a pattern would read as a glob nor a link to it sends
    it, from the workdir or from the data directory."""
    (tmp_path / "t.py").write_text("")
    (tmp_path / "inv.toml").write_text("")
    job = tmp_path / name
    job.write_text('name = "j"\ninventory = "inv.toml"\nscript = "t.py"\n'
                   '[notify]\nwebhook = "https://h/x"\n')
    (tmp_path / "alias").symlink_to(name)
    loaded = load_job(job)
    assert loaded.unsent == (str(job.resolve()),)
    code = scan(loaded.workdir, loaded.exclude, ignore_files=True, never=loaded.unsent)
    assert sorted(code.files) == ["inv.toml", "t.py"]
    assert sorted(code.ignored) == sorted([("alias", "[notify]"), (name, "[notify]")])
    d = scan(tmp_path, (), never=loaded.unsent)  # as the data is scanned: no ignore files
    assert sorted(d.files) == ["inv.toml", "t.py"]
    job.write_text('name = "j"\ninventory = "inv.toml"\nscript = "t.py"\n')
    assert load_job(job).unsent == ()


def test_the_data_directory_sends_no_toml_file_with_a_notify(tmp_path: Path) -> None:
    data = tree(tmp_path / "data", {"hook.toml": '[notify]\nwebhook = "https://h/T0K3N"\n',
                                    "ok.toml": "x = 1\n"})
    (data / "alias").symlink_to("hook.toml")
    (data / "ok-alias").symlink_to("ok.toml")
    d = scan(data, ())
    assert sorted(d.files) == ["ok-alias", "ok.toml"]
    assert sorted(d.ignored) == [("alias", "[notify]"), ("hook.toml", "[notify]")]


def test_a_link_to_a_toml_file_with_a_notify_is_judged_by_its_target(tmp_path: Path) -> None:
    root = tree(tmp_path / "w", {"sibling.toml": '[notify]\nwebhook = "https://h/T0K3N"\n'})
    (root / "alias.cfg").symlink_to("sibling.toml")
    assert scan(root, (), ignore_files=True).files == {}
