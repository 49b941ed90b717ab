"""Node setup and run manifests, the pure parts (and the setup script under a real sh): when
setup runs again, what it runs with, and what `fleet show` / `fleet diff` say."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
from pathlib import Path

import pytest

from fleet import manifest, manifest_view
from fleet.backends.hosts.setup import (
    MARKER,
    Action,
    Decision,
    decide,
    setup_hash,
    setup_script,
)
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job, load_job
from fleet.errors import ConfigError
from fleet.plan import make_plan
from tests.unit.test_config import job_file, write


def job_in(tmp_path: Path, **kw: object) -> Job:
    (tmp_path / "req.txt").write_text("greet==1.0\n")
    base = dict(path=tmp_path / "j.toml", name="j", inventory=tmp_path / "inv.toml",
                workdir=tmp_path, script="train.py", setup="pip install -r req.txt\n",
                setup_inputs=("req.txt",))
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


def plan_for(job: Job, storage: list[list[str]] | None = None,  # type: ignore[no-untyped-def]
             run_id: str = "j-1"):
    inv = Inventory(Path("/inv.toml"), (Host("a", "10.0.0.1"), Host("b", "10.0.0.2"),
                                        Host("c", "10.0.0.3")))
    return make_plan(inv, job, run_id, master_addr="10.0.0.1", homes={"a": "/h", "b": "/h",
                                                                      "c": "/hc"},
                     storage=storage)


def test_setup_hash_follows_its_text_and_its_inputs_content(tmp_path: Path) -> None:
    job = job_in(tmp_path)
    first = setup_hash(job)
    assert first == setup_hash(job) and first is not None
    assert setup_hash(dataclasses.replace(job, setup="pip install -r req.txt -U\n")) != first
    (tmp_path / "req.txt").write_text("greet==1.1\n")
    assert setup_hash(job) != first
    assert setup_hash(dataclasses.replace(job, setup=None, setup_inputs=())) is None


def test_setup_runs_once_per_filesystem_and_only_when_changed(tmp_path: Path) -> None:
    job = job_in(tmp_path)
    wanted = setup_hash(job)
    p = plan_for(job, storage=[["a", "b"], ["c"]])  # a and b share an NFS home
    def words(decisions: dict[str, Decision]) -> dict[str, str]:
        return {name: d.text for name, d in decisions.items()}

    assert words(decide(p, {})) == {"a": "run", "b": "shared with a", "c": "run"}
    assert [d.action for d in decide(p, {}).values()] == [Action.RUN, Action.SHARED, Action.RUN]
    assert words(decide(p, {"a": wanted or "", "c": "old"})) == {
        "a": "skipped (unchanged since it last succeeded here)",
        "b": "skipped (unchanged since it last succeeded on a, shared)", "c": "run"}
    forced = decide(p, {"a": wanted or "", "c": wanted or ""}, force=True)["c"]
    assert forced.text == "run (--setup)" and forced.action is Action.RUN
    assert decide(p, None)["a"].text.startswith("runs unless it already succeeded here")
    assert decide(p, None)["a"].action is Action.UNASKED


def test_setup_script_runs_in_the_jobs_directory_with_its_env_and_stops_at_a_failure(
        tmp_path: Path) -> None:
    job = job_in(tmp_path, setup='echo "$GREETING from $(pwd) with $FLEET_PYTHON"\n'
                                 "tr '\\0' '\\n' < /proc/$$/environ | grep '^FLEET_ATTEMPT_ID='\n"
                                 "false\necho never\n")
    p = plan_for(job)
    node = dataclasses.replace(p.nodes[0], code_dir=str(tmp_path / "code"),
                               run_dir=str(tmp_path / "run"))
    (tmp_path / "code").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "env.sh").write_text("export GREETING='hi there'\n")
    (tmp_path / "code" / MARKER).write_text("an older setup\n")
    r = subprocess.run(["sh", "-s"], input=setup_script(node, job, "/opt/py/bin/python", "j-1"),
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert r.stdout == (f"hi there from {tmp_path / 'code'} with /opt/py/bin/python\n"
                        "FLEET_ATTEMPT_ID=j-1\n")  # where a stop finds it
    assert not (tmp_path / "code" / MARKER).exists()  # a half-done setup is not a good one


@pytest.mark.parametrize("body, key, message", [
    ('setup = " "\n', "setup", "must not be empty"),
    ('setup_inputs = ["req.txt"]\n', "setup_inputs", "only used with setup"),
    ('setup = "true"\nsetup_inputs = ["nope.txt"]\n', "setup_inputs[0]", "file not found"),
    ('setup = "true"\nsetup_inputs = ["../x.txt"]\n', "setup_inputs[0]", "inside the workdir"),
    ('python = ""\n', "python", "interpreter's path"),
])
def test_setup_keys_errors(tmp_path: Path, body: str, key: str, message: str) -> None:
    (tmp_path / "work").mkdir()
    write(tmp_path, "x.txt", "")
    path = job_file(tmp_path / "work", body)
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert e.value.key == key and message in str(e.value)


def test_the_jobs_python_is_relative_to_its_directory_on_the_node(tmp_path: Path) -> None:
    p = plan_for(job_in(tmp_path, python=".venv/bin/python"))
    assert p.nodes[0].python == f"{p.nodes[0].code_dir}/.venv/bin/python"
    assert p.nodes[0].argv[0] == p.nodes[0].python
    assert plan_for(job_in(tmp_path)).nodes[0].argv[0] == "python3"


# ---- manifests -------------------------------------------------------------------------------
def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                    *args], check=True, capture_output=True)


def test_git_info_commit_dirty_diff_untracked(tmp_path: Path) -> None:
    assert manifest.git_info(tmp_path)["commit"] is None
    (tmp_path / "train.py").write_text("print(1)\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "one")
    clean = manifest.git_info(tmp_path)
    assert len(clean["commit"]) == 40 and not clean["dirty"] and clean["diff"] == ""
    (tmp_path / "train.py").write_text("print(2)\n")
    (tmp_path / "new.py").write_text("")
    dirty = manifest.git_info(tmp_path)
    assert dirty["dirty"] and "+print(2)" in dirty["diff"] and dirty["untracked"] == ["new.py"]


def a_manifest(tmp_path: Path, run_id: str = "j-1",  # type: ignore[type-arg]
               **env: str) -> dict:
    p = plan_for(job_in(tmp_path, env={"LR": "0.1", "API_TOKEN": "s3cret", **env}),
                 run_id=run_id)
    p = dataclasses.replace(p, versions={"a": {"python": "3.11.7", "torch": "2.14.1"}})
    return manifest.build(p, {"a": "abc"}, {"commit": "c1", "dirty": False, "diff": ""},
                          {"train.py": "h1"}, None)


def test_manifest_masks_secrets_and_shows_what_ran(tmp_path: Path) -> None:
    m = a_manifest(tmp_path)
    text = manifest.dumps(m)
    assert "s3cret" not in text and '"API_TOKEN": "***"' in text
    lines = manifest_view.show(m)
    assert lines[1] == "code: commit c1, clean; 1 file(s) synced"
    assert any(line.startswith("[a] node rank 0, 10.0.0.1, 1 process(es); python 3.11.7, "
                               "torch 2.14.1") for line in lines)
    assert "  env LR=0.1" in lines and "  setup: abc" in lines


def test_diff_names_code_files_env_versions_and_hosts(tmp_path: Path) -> None:
    a = a_manifest(tmp_path)
    b = copy.deepcopy(a_manifest(tmp_path, "j-2", LR="0.2"))
    b["code"] = {"commit": "c1", "dirty": True, "diff": "-x\n+y\n"}
    b["files"] = {"train.py": "h2", "new.py": "h3"}
    b["nodes"]["a"]["versions"]["torch"] = "2.15.0"
    b["nodes"]["a"]["setup"] = "def"
    del b["nodes"]["c"]
    assert manifest_view.diff(a, b) == [
        "code: clean -> dirty (2 diff lines)", "file new.py: added", "file train.py: changed",
        "host c: only in j-1", "a: setup abc -> def", "on a, b: env LR 0.1 -> 0.2",
        "a: torch 2.14.1 -> 2.15.0"]
    assert manifest_view.diff(a, a) == []


def test_diff_replaces_the_run_id_only_where_it_stands_alone(tmp_path: Path) -> None:
    """The code dir `<job>-<8 hex>` can begin with the run id's text (`j-1` + `c1eb3c5`):
    only the id itself (a path part, the rdzv id) is the run's, so nothing differs."""
    a = a_manifest(tmp_path, "j-1")
    b = copy.deepcopy(a_manifest(tmp_path, "j-2"))
    for m, rid in ((a, "j-1"), (b, "j-2")):
        m["nodes"]["a"]["argv"] = ["python3", f"/h/fleet/runs/{rid}/a/x", "--rdzv-id", rid,
                                   "/h/fleet/code/j-1c1eb3c5/train.py"]
    assert manifest_view.diff(a, b) == []
    b["nodes"]["a"]["argv"][-1] = "/h/fleet/code/j-2c1eb3c5/train.py"
    assert manifest_view.diff(a, b) == [
        "a: command: … RUN [-/h/fleet/code/j-1c1eb3c5/train.py-]{+/h/fleet/code/j-2c1eb3c5/"
        "train.py+}"]
