"""The conventions of the CLIs users know, through the real `fleet` program: --version, shell
completion of run ids, unique prefixes of run ids, help that reads well, `trust` taking a job
file, messages naming the user's own files, "did you mean" in job files, and `{args}`."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from fleet.cli.commands import app
from fleet.config import hostkeys
from fleet.config.inventory import Host, load_inventory
from fleet.config.job import load_job, with_extra_args
from fleet.errors import ConfigError, ExitCode, UsageError
from fleet.run import record
from fleet.trust import inventory_for
from tests import builders
from tests.builders import hosts_toml
from tests.conftest import InProcessCLI

FLEET = Path(sys.executable).with_name("fleet")  # the installed console script
COMMANDS = ["up", "plan", "check", "trust", "stop", "rm", "status", "ps", "logs", "show", "diff",
            "dump", "pull", "forward", "exec", "doctor", "top", "ui", "gpus", "usage", "reserve",
            "release", "submit", "sweep", "queue", "export", "export slurm"]
RUNS = {"mnist-20250101-120000-49b0": 1.0, "mnist-20250102-120000-4a11": 2.0,
        "ddp-20250103-120000-77aa": 3.0}


def fleet(*args: str, cwd: Path, env: dict[str, str] | None = None,
          program: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """fleet in-process (what it says and exits with), or the real `program` where the process
    is the point (the console script, `python -m fleet`, a real bash)."""
    ours = {"FLEET_STATE_DIR": str(cwd / "state"), "NO_COLOR": "1", "COLUMNS": "80",
            **(env or {})}
    if program is None:
        return InProcessCLI(cwd, ours)(*args, timeout=120)
    return subprocess.run([*program, *args], cwd=cwd, env={**os.environ, **ours},
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def record_runs(tmp: Path, runs: dict[str, float], parent: str = "") -> None:
    """Run records as `fleet up` writes them (with a manifest, so `fleet show` answers)."""
    for run_id, started in runs.items():
        rec = record.RunRecord(run_id, "jobs/mnist.toml", started, (record.NodeRecord(
            Host("a", "10.0.0.1"), 0, f"~/fleet/runs/{run_id}/a", 0, 1),), parent=parent)
        d = tmp / "state" / "runs" / run_id
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps(dataclasses.asdict(rec)))
        (d / "manifest.json").write_text(json.dumps({"run_id": run_id}))


def write_job(tmp: Path, body: str = "", inventory: str = "") -> Path:
    (tmp / "inv.toml").write_text(inventory or hosts_toml())
    return builders.write_job(tmp, body)


# --version

def test_version_says_the_installed_package_version(tmp_path: Path) -> None:
    want = f"fleet {importlib.metadata.version('fleet')}\n"
    assert re.fullmatch(r"fleet \d+\.\d+\.\d+\n", want)
    for flag in ("--version", "-V"):
        r = fleet(flag, cwd=tmp_path)
        assert (r.returncode, r.stdout, r.stderr) == (0, want, ""), r
    # before a command too, as eager options are
    assert fleet("-V", "up", cwd=tmp_path).stdout == want
    # from the installed console script, and under `python -m fleet`
    assert fleet("-V", cwd=tmp_path, program=[str(FLEET)]).stdout == want
    assert fleet("-V", cwd=tmp_path, program=[sys.executable, "-m", "fleet"]).stdout == want


# shell completion

def complete(tmp: Path, line: str, program: list[str] | None = None) -> list[str]:
    words = line.split(" ")
    r = fleet(cwd=tmp, program=program, env={"_FLEET_COMPLETE": "complete_bash",
                                             "COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)})
    assert r.returncode == 0, r
    return r.stdout.split()


def test_run_ids_complete_for_every_command_that_takes_one(tmp_path: Path) -> None:
    record_runs(tmp_path, RUNS)
    record_runs(tmp_path, {"mnist-20250102-120000-4a11-a2": 2.5},
                parent="mnist-20250102-120000-4a11")  # a restart's attempt: with its run
    mnist = ["mnist-20250102-120000-4a11", "mnist-20250101-120000-49b0"]  # newest first
    for command in ("stop", "rm", "status", "logs", "show", "dump", "diff"):
        assert complete(tmp_path, f"fleet {command} mn") == mnist, command
    assert complete(tmp_path, "fleet diff mnist-20250101-120000-49b0 d") == [
        "ddp-20250103-120000-77aa"]  # diff's second run too
    assert complete(tmp_path, "fleet logs -f ") == ["ddp-20250103-120000-77aa", *mnist]
    assert complete(tmp_path, "fleet show x") == []
    assert complete(tmp_path, "fleet sh") == ["show"]
    # started as `python -m fleet`, it still answers to the variable the script sets
    assert complete(tmp_path, "fleet show d", [sys.executable, "-m", "fleet"]) == [
        "ddp-20250103-120000-77aa"]


# typer finds the shell among fleet's parent processes: here a bash, as from a person's own
FROM_BASH = ["bash", "--norc", "-c", f'"{FLEET}" "$@"; exit $?', "bash"]


def test_completion_script_completes_run_ids_in_a_real_bash(tmp_path: Path) -> None:
    record_runs(tmp_path, RUNS)
    script = fleet("--show-completion", cwd=tmp_path, program=FROM_BASH)
    assert script.returncode == 0 and "_FLEET_COMPLETE" in script.stdout, script
    (tmp_path / "fleet.bash").write_text(script.stdout)
    probe = ('source fleet.bash; COMP_WORDS=(fleet show mnist); COMP_CWORD=2; '
             '_fleet_completion fleet show mnist; printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "--norc", "-c", probe], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, env={**os.environ, "FLEET_STATE_DIR": str(
                           tmp_path / "state"), "PATH": f"{FLEET.parent}:{os.environ['PATH']}"})
    assert r.stdout.split() == ["mnist-20250102-120000-4a11", "mnist-20250101-120000-49b0"], r
    home = tmp_path / "home"
    home.mkdir()
    installed = fleet("--install-completion", cwd=tmp_path, env={"HOME": str(home)},
                      program=FROM_BASH)
    assert installed.returncode == 0 and "bash completion installed in" in installed.stdout
    assert "fleet" in (home / ".bashrc").read_text()


# unique prefixes of run ids

def test_a_run_is_found_by_a_unique_start_of_its_id_or_tag(tmp_path: Path) -> None:
    record_runs(tmp_path, RUNS)
    for typed, run_id in [("49b0", "mnist-20250101-120000-49b0"), ("49", "mnist-20250101-120000"
                          "-49b0"), ("ddp", "ddp-20250103-120000-77aa"),
                          ("mnist-20250102", "mnist-20250102-120000-4a11")]:
        r = fleet("show", typed, "--json", cwd=tmp_path)
        assert r.returncode == 0 and json.loads(r.stdout)["run_id"] == run_id, (typed, r)
    r = fleet("show", "4", cwd=tmp_path)
    assert r.returncode == ExitCode.BAD_INPUT and r.stdout == "", r
    assert r.stderr == ("fleet: error: run '4' is ambiguous: 2 runs match; give more of the id:\n"
                        "  mnist-20250101-120000-49b0\n  mnist-20250102-120000-4a11\n")
    # A restart's attempt answers as its run (`fleet show` of the run shows its last attempt),
    # so a start of the run's id still names one run; the attempt's own id names it whole.
    attempt = "mnist-20250102-120000-4a11-a2"
    record_runs(tmp_path, {attempt: 2.5}, parent="mnist-20250102-120000-4a11")
    for typed in ("mnist-20250102", attempt):
        r = fleet("show", typed, "--json", cwd=tmp_path)
        assert r.returncode == 0 and json.loads(r.stdout)["run_id"] == attempt, (typed, r)
    for typed in ("zz", "a2", "mnist-20250103"):  # an attempt's tag is not its run's
        r = fleet("logs", typed, cwd=tmp_path)
        assert r.returncode == ExitCode.BAD_INPUT, r
        assert f"fleet: error: no run '{typed}' under {tmp_path / 'state' / 'runs'}" in r.stderr


def test_matches_and_the_list_of_an_ambiguous_prefix(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert record.matches("mnist-20250101-120000-49b0", "49b")
    assert record.matches("mnist-20250101-120000-49b0", "mnist-2025")
    assert not record.matches("mnist-20250101-120000-49b0", "2025")
    assert not record.matches("mnist-20250101-120000-49b0", "9b0")
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    record_runs(tmp_path, {f"job-20250101-1200{i:02}-ab{i:02}": float(i) for i in range(12)})
    with pytest.raises(UsageError) as e:
        record.load("ab")
    lines = str(e.value).splitlines()
    assert lines[0] == "run 'ab' is ambiguous: 12 runs match; give more of the id:"
    assert lines[1:] == [f"  job-20250101-1200{i:02}-ab{i:02}" for i in range(2, 12)] + [
        "  (and 2 older)"]


# --help

def helps(tmp: Path) -> dict[str, str]:
    return {c: fleet(*c.split(), "--help", cwd=tmp).stdout for c in ["", *COMMANDS]}


def test_help_shows_no_value_for_plain_flags_and_no_markup_eaten(tmp_path: Path) -> None:
    for command, text in helps(tmp_path).items():
        assert "Usage: fleet" in text, command
        assert "<bool>" not in text, f"fleet {command} --help:\n{text}"
    logs = fleet("logs", "--help", cwd=tmp_path).stdout
    assert re.search(r"--follow\s+-f\s+Keep following a live run", logs), logs
    assert "With [restart]: only this attempt" in logs, logs  # not read as rich markup


def test_command_summaries_are_whole_sentences_at_80_columns(tmp_path: Path) -> None:
    text = fleet("--help", cwd=tmp_path).stdout
    panel = text[text.index("─ Commands ─"):].splitlines()[1:]
    rows = [line.strip("│ ") for line in panel if line.startswith("│")]
    names = [row.split()[0] for row in rows]
    assert names == COMMANDS[:-1], text  # one line each: no summary spills onto a second
    for row in rows:
        assert row.endswith("."), row
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        first = (command.help or "").strip().split("\n\n")[0]
        assert "\n" not in first and first.endswith(".") and len(first) <= 66, (name, first)
        assert re.search(rf"^│ {name}\s+{re.escape(first)}\s+│$", text, re.M), (name, text)


# trust takes a job file

def test_trust_finds_the_inventory_of_a_job_or_takes_an_inventory(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    inv = tmp_path / "inv.toml"
    other = tmp_path / "other.toml"
    other.write_text('[slurm]\nlogin = "localhost"\n')
    assert inventory_for(job) == inv
    assert inventory_for(job, other) == other
    assert inventory_for(inv) == inv and inventory_for(other) == other
    with pytest.raises(UsageError, match="is an inventory: give -i only with a job file"):
        inventory_for(inv, other)
    odd = tmp_path / "odd.toml"
    odd.write_text('hostz = 1\n')
    with pytest.raises(ConfigError, match=r"odd\.toml: neither a job file .* nor an inventory"):
        inventory_for(odd)
    job.write_text('inventory = "inv.toml"\nscirpt = "train.py"\n')
    with pytest.raises(ConfigError, match="scirpt: unknown key; did you mean script"):
        inventory_for(job)


def test_trust_takes_a_job_file_as_every_command_does(tmp_path: Path) -> None:
    """A job on a Slurm cluster whose login node is this machine: no key to ask for, so the
    command shows the job file led to its cluster's inventory without a host."""
    job = write_job(tmp_path, inventory='[slurm]\nlogin = "localhost"\n')
    for args in ([str(job)], ["job.toml"], ["inv.toml"]):
        r = fleet("trust", *args, cwd=tmp_path)
        assert r.returncode == 0, r
        assert r.stdout == "the login node is this machine: no host key to trust\n"
    r = fleet("trust", "train.py", cwd=tmp_path)
    assert r.returncode == ExitCode.BAD_INPUT and "train.py: not valid TOML" in r.stderr, r
    help_text = " ".join(re.sub("[│╭╮╰╯─]", " ", fleet("trust", "--help", cwd=tmp_path).stdout)
                         .split())
    assert "a job has `script` (or `module`, `command`), an inventory `[[hosts]]` or `[slurm]`" \
        in help_text, help_text


# messages name the user's files

def test_the_trust_command_named_is_the_file_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.config import given
    monkeypatch.setattr(given, "_GIVEN", {})
    assert hostkeys.trust_command() == ("`fleet trust JOB --accept` (JOB: the run's job file or "
                                        "inventory)")
    hostkeys.given("job", "jobs/my job.toml")
    assert hostkeys.trust_command() == "`fleet trust 'jobs/my job.toml' --accept`"
    hostkeys.given("inventory", "inventory/lab.toml")  # -i wins: the job's own is not used
    assert hostkeys.trust_command() == "`fleet trust inventory/lab.toml --accept`"


def test_a_command_line_does_not_name_the_file_an_earlier_one_gave(tmp_path: Path) -> None:
    """In one process (tests run the CLI in-process), the second command's advice names its own
    file, not the -i of the one before (CI saw another test's cluster.toml named)."""
    from typer.testing import CliRunner

    from fleet.cli.app import app
    from fleet.config import given
    job, other = write_job(tmp_path), tmp_path / "other.toml"
    CliRunner().invoke(app, ["plan", str(job), "-i", str(other)])
    assert given.trust_command() == f"`fleet trust {other} --accept`"
    CliRunner().invoke(app, ["plan", str(job)])
    assert given.trust_command() == f"`fleet trust {job} --accept`"


# job files: did you mean

@pytest.mark.parametrize("body, key, message", [
    ("nproc_per_nod = 2\n", "nproc_per_nod", "unknown key; did you mean nproc_per_node?"),
    ("[rendevous]\nport = 1234\n", "rendevous", "unknown key; did you mean rendezvous?"),
    ("[rendezvous]\nprot = 1\n", "rendezvous.prot", "unknown key; did you mean port?"),
    ("[watchdog]\nhang_timout = 5\n", "watchdog.hang_timout",
     "unknown key; did you mean hang_timeout?"),
    ("zzz = 1\n", "zzz", "unknown key (known keys here: args, data, debug, doctor, env, exclude, "),
])
def test_unknown_job_keys_say_the_likely_fix(tmp_path: Path, body: str, key: str,
                                             message: str) -> None:
    job = write_job(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_job(job)
    assert (e.value.key, str(e.value).startswith(f"{job}: {key}: {message}")) == (key, True), e


@pytest.mark.parametrize("text, key, message", [
    ('inventory = "inv.toml"\nscirpt = "train.py"\n', "scirpt", "did you mean script?"),
    ('inventroy = "inv.toml"\nscript = "train.py"\n', "inventroy", "did you mean inventory?"),
    ('inventory = "inv.toml"\n', "script", "required key is missing (or give module)"),
])
def test_a_misspelled_required_job_key_is_named_as_the_mistake(tmp_path: Path, text: str,
                                                                key: str, message: str) -> None:
    write_job(tmp_path)
    (tmp_path / "job.toml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_job(tmp_path / "job.toml")
    assert e.value.key == key and str(e.value).endswith(message), str(e.value)


@pytest.mark.parametrize("text, key, message", [
    ('[[hosts]]\nname = "a"\nadress = "x"\n', "hosts[0].adress",
     "unknown key; did you mean address?"),
    ('[[hosts]]\nname = "a"\naddress = "x"\nidentiy = "k"\n', "hosts[0].identiy",
     "unknown key; did you mean identity?"),
    ('[[host]]\nname = "a"\naddress = "x"\n', "host", "unknown key; did you mean hosts?"),
    ('[defaults]\nuser = "x"\n', "hosts", "required: at least one [[hosts]] table"),
])
def test_inventory_keys_say_the_likely_fix(tmp_path: Path, text: str, key: str,
                                          message: str) -> None:
    path = tmp_path / "inv.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_inventory(path)
    assert e.value.key == key and str(e.value) == f"{path}: {key}: {message}"


def test_cli_says_did_you_mean_naming_file_and_key(tmp_path: Path) -> None:
    job = write_job(tmp_path, "nproc_per_nod = 2\n")
    for command in ("plan", "up", "check", "trust"):
        r = fleet(command, "job.toml", cwd=tmp_path)
        assert r.returncode == ExitCode.BAD_INPUT, r
        assert r.stderr == ("fleet: error: job.toml: nproc_per_nod: unknown key; did you mean "
                            "nproc_per_node?\n"), (command, r.stderr)
    job.write_text('inventory = "inv.toml"\nscirpt = "train.py"\n')
    r = fleet("plan", str(job), cwd=tmp_path)
    assert r.stderr == f"fleet: error: {job}: scirpt: unknown key; did you mean script?\n", r


# {args}: the command line's arguments in their place

def commands_of(plan_out: str) -> list[str]:
    return [line.split("command:", 1)[1].strip() for line in plan_out.splitlines()
            if line.strip().startswith("command:")]


def test_args_placeholder_takes_the_command_lines_arguments(tmp_path: Path) -> None:
    write_job(tmp_path, 'args = ["{args}", "--epochs", "{nnodes}"]\n')
    r = fleet("plan", "job.toml", "--", "configs/big.yaml", "20", cwd=tmp_path)
    assert r.returncode == 0, r
    cmds = commands_of(r.stdout)
    assert len(cmds) == 2 and all(c.endswith("/train.py' configs/big.yaml 20 --epochs 2")
                                  for c in cmds), r.stdout
    bare = commands_of(fleet("plan", "job.toml", cwd=tmp_path).stdout)
    assert all(c.endswith("/train.py' --epochs 2") for c in bare), bare
    braces = commands_of(fleet("plan", "job.toml", "--", "{nnodes}", cwd=tmp_path).stdout)
    assert all(c.endswith("/train.py' '{nnodes}' --epochs 2") for c in braces), braces  # literal
    # without {args}, the words still go after the job's own (as before)
    write_job(tmp_path, 'args = ["--epochs", "1"]\n')
    cmds = commands_of(fleet("plan", "job.toml", "--", "--resume", cwd=tmp_path).stdout)
    assert all(c.endswith("/train.py' --epochs 1 --resume") for c in cmds), cmds


def test_args_placeholder_in_a_job(tmp_path: Path) -> None:
    job = load_job(write_job(tmp_path, 'args = ["a", "{args}", "--n", "{node_rank}"]\n'))
    assert (job.args, job.args_at) == (("a", "--n", "{node_rank}"), 1)
    once = with_extra_args(job, ["x", "{y}"])
    assert once.args == ("a", "x", "{{y}}", "--n", "{node_rank}")
    assert with_extra_args(once, ["z"]).args == ("a", "x", "{{y}}", "z", "--n", "{node_rank}")
    assert with_extra_args(job, []).args == ("a", "--n", "{node_rank}")
    plain = load_job(write_job(tmp_path, 'args = ["a"]\n'))
    assert (plain.args_at, with_extra_args(plain, ["b"]).args) == (None, ("a", "b"))
    for body, key, message in [
            ('args = ["{args}", "{args}"]\n', "args[1]", "{args} may stand once in args"),
            ('args = ["--x={args}"]\n', "args[0]", "it is a word of its own in args"),
            ('launcher = "command"\ncommand = ["run", "{args}"]\n', "command[1]",
             "a word of its own in args")]:
        with pytest.raises(ConfigError) as e:
            load_job(write_job(tmp_path, body))
        assert e.value.key == key and message in str(e.value), str(e.value)
