"""A fast start, guarded without timing it: `--version`, `--help` and shell completion load none
of what only a command needs (paramiko, fabric, jinja2, torch, the backends, the transports),
and Ctrl-C at any moment (while Python loads fleet, during a completion, during a command) ends
fleet with exit 130 and at most one line, never a traceback. bench/start.py times it."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fleet
from fleet.config.inventory import Host
from fleet.run import record

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("paramiko", "fabric", "invoke", "jinja2", "torch", "fleet.backends", "fleet.transport",
         "fleet.lifecycle.runner", "fleet.trust",
         # typer's coercion builds pydantic adapters (fleet.cli.coercion spares them); its help
         # module imports Markdown and rich's tracebacks (fleet.cli.helpview spares them)
         "pydantic", "pydantic_core", "markdown_it", "pygments", "rich.markdown",
         "rich.traceback",
         # what only a command loads: the GPU views, the planner (a run record is read without)
         "fleet.facts.gpus", "fleet.facts.leases", "fleet.gpuview", "fleet.plan")
# What is drawn with rich: typer's help needs it, --version, a completion and `ps` do not.
DRAWN = ("rich.console", "rich.markup")
# Runs fleet's main as the `fleet` command does, then writes the modules it loaded to a file.
PROGRAM = ("import json, os, sys\n"
           "sys.argv = ['fleet', *sys.argv[1:]]\n"
           "try:\n"
           "    from fleet.cli import main\n"
           "    main()\n"
           "finally:\n"
           "    with open(os.environ['LOADED'], 'w') as f:\n"
           "        json.dump(sorted(sys.modules), f)\n")
COMPLETE = {"_FLEET_COMPLETE": "complete_bash", "COMP_CWORD": "1", "COMP_WORDS": "fleet st"}
COMPLETE_RUN = {"_FLEET_COMPLETE": "complete_bash", "COMP_CWORD": "2",
                "COMP_WORDS": "fleet status "}
RUN_ID = "mnist-20250101-120000-49b0"
FLEET_DIR = str(Path(fleet.__file__).resolve().parent)


def env(tmp: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "FLEET_STATE_DIR": str(tmp / "state"), "NO_COLOR": "1",
            "COLUMNS": "80", "PYTHONPATH": str(ROOT), **more}


def loaded(tmp: Path, args: list[str], extra: dict[str, str] | None = None
           ) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp / "loaded.json"
    r = subprocess.run([sys.executable, "-c", PROGRAM, *args], cwd=tmp,
                       env=env(tmp, LOADED=str(out), **(extra or {})), capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    return r, set(json.loads(out.read_text()))


def heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def record_run(tmp: Path) -> None:
    rec = record.RunRecord(RUN_ID, "jobs/mnist.toml", 1.0, (record.NodeRecord(
        Host("a", "10.0.0.1"), 0, f"~/fleet/runs/{RUN_ID}/a", 0, 1),))
    d = tmp / "state" / "runs" / RUN_ID
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps(dataclasses.asdict(rec)))


@pytest.mark.parametrize("args, extra, drawn", [
    (["--version"], None, False),
    (["--help"], None, True),
    (["up", "--help"], None, True),
    (["export"], None, True),
    ([], COMPLETE, False),
    ([], COMPLETE_RUN, False),
    (["ps", "--all"], None, False),
], ids=["version", "help", "up-help", "group-help", "complete-command", "complete-run-id",
        "ps"])
def test_start_loads_nothing_a_command_alone_needs(tmp_path: Path, args: list[str],
                                                   extra: dict[str, str] | None,
                                                   drawn: bool) -> None:
    if args[:1] != ["ps"]:  # `ps` of a recorded run asks its hosts: that is its work, not its start
        record_run(tmp_path)
    r, modules = loaded(tmp_path, args, extra)
    assert r.returncode == (2 if args == ["export"] else 0) and r.stdout, r  # click: 2, no command
    assert heavy(modules, HEAVY) == []
    if not drawn:
        assert heavy(modules, DRAWN) == []
    if extra is None and args[:1] != ["ps"]:  # help draws with typer's rich, not fleet's console
        assert heavy(modules, ("fleet.console", "fleet.events", "fleet.phrases")) == [], r
    if extra == COMPLETE:
        assert r.stdout.split() == ["stop", "status"], r
    if extra == COMPLETE_RUN:
        assert r.stdout.split() == [RUN_ID], r
    if args == ["--version"]:  # answered before typer is loaded
        assert heavy(modules, ("typer", "click", "rich")) == [], r
    if args[:1] == ["ps"]:
        assert r.stdout.startswith("no run recorded here"), r


def test_help_is_typer_rich_help_and_its_stand_ins_leave(tmp_path: Path) -> None:
    """fleet.cli.helpview's stand-ins exist only while typer's help module loads: the real
    Markdown and tracebacks are what anything imports afterwards."""
    program = ("import sys\n"
               "from fleet.cli import helpview\n"
               "helpview.load()\n"
               "assert 'rich.markdown' not in sys.modules and 'markdown_it' not in sys.modules\n"
               "import typer.rich_utils as u\n"
               "assert u.Markdown is helpview.NotDrawn\n"
               "from rich.markdown import Markdown\n"
               "from rich.traceback import Traceback\n"
               "assert Markdown is not helpview.NotDrawn and Traceback is not helpview.NotDrawn\n"
               "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", program], env=env(tmp_path), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "ok\n", r
    help_text = subprocess.run([sys.executable, "-m", "fleet", "up", "--help"], cwd=tmp_path,
                               env=env(tmp_path), capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0 and "╭─ Options" in help_text.stdout, help_text

def test_a_bad_job_file_is_said_before_ssh_is_loaded(tmp_path: Path) -> None:
    """`fleet up` reads the job before it loads SSH and the run's machinery: a file that is not
    there, or not a job, is said at once (exit 2)."""
    (tmp_path / "bad.toml").write_text('script = "train.py"\nnproc_per_node = "x"\n')
    for job in ("missing.toml", "bad.toml"):
        r, modules = loaded(tmp_path, ["up", job])
        assert r.returncode == 2 and job in r.stderr, r
        assert heavy(modules, ("paramiko", "fabric", "fleet.backends", "fleet.lifecycle.runner",
                               "fleet.transport")) == [], r


def test_a_command_still_loads_what_it_needs(tmp_path: Path) -> None:
    """The guard above means something: a command that asks a backend loads it."""
    record_run(tmp_path)
    _, modules = loaded(tmp_path, ["show", "--json"])
    assert "fleet.backends" in modules and "paramiko" in modules
    # ... and no more: a run's node commands (stop, status, logs) render no template
    assert "fleet.backends.hosts.node" in modules and heavy(modules, ("jinja2",)) == []


# Ctrl-C

def silent_ssh_port() -> socket.socket:
    """A port that takes a connection and never says a word: an SSH connection waits there for
    the server's banner, as long as fleet lets it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


def interrupted(tmp: Path, args: list[str], after: float,
                extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    p = subprocess.Popen([sys.executable, "-m", "fleet", *args], cwd=tmp,
                         env=env(tmp, **(extra or {})), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    time.sleep(after)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def said_once(r: subprocess.CompletedProcess[str]) -> None:
    frames = re.findall(r'File "([^"]+)"', r.stderr)
    if "init_import_site" in r.stderr or (frames and not any(
            f.startswith(FLEET_DIR) for f in frames)):
        # Python itself was still starting (site, io, runpy, a meta path finder of the venv's
        # such as setuptools' _distutils_hack finding `fleet`): no line of fleet had run
        return
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) <= 1, r
    assert r.returncode in (0, 130, -signal.SIGINT), r  # -SIGINT: before Python took signals


def test_ctrl_c_while_fleet_starts_and_while_a_command_waits(tmp_path: Path) -> None:
    """`fleet exec` to a host that never answers: SIGINT from the first instants of Python's
    start to the wait for the host's banner."""
    with silent_ssh_port() as s:
        port = s.getsockname()[1]
        inv = tmp_path / "inv.toml"
        inv.write_text(f'[[hosts]]\nname = "a"\naddress = "127.0.0.1"\nport = {port}\n'
                       'transport = "ssh"\n')
        codes = []
        for after in (0.01, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 3.0):
            r = interrupted(tmp_path, ["exec", str(inv), "--", "true"], after)
            said_once(r)
            # the host never answers: nothing but the signal ends it
            assert r.returncode != 0 or "init_import_site" in r.stderr, r
            codes.append(r.returncode)
        assert codes[-1] == 130 and "fleet: interrupted (SIGINT)" in r.stderr, r


def test_ctrl_c_during_a_completion(tmp_path: Path) -> None:
    record_run(tmp_path)
    for after in (0.01, 0.05, 0.1, 0.2, 0.3, 0.5):
        said_once(interrupted(tmp_path, [], after, COMPLETE_RUN))
