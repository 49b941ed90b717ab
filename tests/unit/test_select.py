"""`--node` and `--exclude`: which hosts of an inventory a command works on (pure), and the same
choice on every command that takes a job (through the CLI, nothing connected to)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.config.inventory import Host, Inventory
from fleet.config.select import Selection, hosts, narrowed, selected
from fleet.errors import UsageError
from tests.conftest import InProcessCLI

INV = Inventory(Path("inv.toml"), (Host("a", "10.0.0.1"), Host("b", "10.0.0.2"),
                                   Host("c", "10.0.0.3")), spares=(Host("s", "10.0.0.4"),))


def names(inv: Inventory) -> tuple[list[str], list[str]]:
    return [h.name for h in inv.hosts], [h.name for h in inv.spares]


def test_the_first_host_left_is_the_master_and_spares_stay_spares() -> None:
    assert selected(INV, Selection()) is INV
    assert names(selected(INV, Selection(exclude=("a",)))) == (["b", "c"], ["s"])
    assert names(selected(INV, Selection(node=("c", "b")))) == (["b", "c"], [])  # inventory order
    assert names(selected(INV, Selection(node=("c", "s")))) == (["c"], ["s"])
    assert names(selected(INV, Selection(exclude=("s", "b")))) == (["a", "c"], [])
    assert names(selected(INV, Selection(node=("a", "b"), exclude=("a",)))) == (["b"], [])


@pytest.mark.parametrize(("sel", "words"), [
    (Selection(exclude=("zz",)), "--exclude: no host named zz in inv.toml; its hosts: a, b, c, s"),
    (Selection(node=("a", "y", "x")), "--node: no host named y, x in inv.toml; its hosts: "),
    (Selection(exclude=("a", "b", "c")), "--exclude a --exclude b --exclude c leaves no host of "
                                         "inv.toml to run the job on (its hosts: a, b, c); s "
                                         "only replace a host in a restart"),
    (Selection(node=("s",)), "--node s leaves no host of inv.toml"),
])
def test_an_unknown_name_or_no_host_left_is_an_error(sel: Selection, words: str) -> None:
    with pytest.raises(UsageError) as e:
        selected(INV, sel)
    assert words in str(e.value)


def test_exec_and_trust_may_work_on_spares_alone() -> None:
    assert names(narrowed(INV, Selection(node=("s",)))) == ([], ["s"])
    assert [h.name for h in hosts(INV, Selection(node=("s",)))] == ["s"]
    assert [h.name for h in hosts(INV, Selection(exclude=("a", "b")))] == ["c", "s"]
    with pytest.raises(UsageError, match="--exclude: no host named q"):
        hosts(INV, Selection(exclude=("q",)))


def files(tmp: Path) -> Path:
    (tmp / "train.py").write_text("print('hi')\n")
    (tmp / "inv.toml").write_text("".join(
        f'[[hosts]]\nname = "{n}"\naddress = "10.0.0.{i}"\n' for i, n in enumerate("abc", 1)))
    (tmp / "job.toml").write_text('inventory = "inv.toml"\nscript = "train.py"\n')
    return tmp / "job.toml"


def test_plan_runs_on_the_hosts_left_with_the_first_as_master(
        tmp_path: Path, fleet_cli: InProcessCLI) -> None:
    job = files(tmp_path)
    r = fleet_cli("plan", str(job), "--exclude", "a", "--json")
    assert r.returncode == 0, r.stderr
    nodes = json.loads(r.stdout)["nodes"]
    assert [(n["host"], n["node_rank"]) for n in nodes] == [("b", 0), ("c", 1)]
    assert {n["master_addr"] for n in nodes} == {"10.0.0.2"}
    r = fleet_cli("plan", str(job), "--node", "c", "--json")
    assert [n["host"] for n in json.loads(r.stdout)["nodes"]] == ["c"]


@pytest.mark.parametrize("command", ["up", "plan", "check"])
def test_every_job_command_refuses_a_bad_choice_before_connecting(
        tmp_path: Path, fleet_cli: InProcessCLI, command: str) -> None:
    job = files(tmp_path)
    r = fleet_cli(command, str(job), "-x", "nope")
    assert r.returncode == 2 and "--exclude: no host named nope in " in r.stderr, r.stderr
    assert "its hosts: a, b, c" in r.stderr
    r = fleet_cli(command, str(job), "-x", "a", "-x", "b", "--exclude", "c")
    assert r.returncode == 2 and "leaves no host of" in r.stderr, r.stderr
    assert not (tmp_path / ".fleet").exists() or not any((tmp_path / ".fleet").iterdir())


@pytest.mark.parametrize("command", [("trust",), ("gpus",), ("exec",)])
def test_the_other_commands_that_take_a_job_refuse_an_unknown_name(
        tmp_path: Path, fleet_cli: InProcessCLI, command: tuple[str, ...]) -> None:
    job = files(tmp_path)
    tail = ["--", "hostname"] if command == ("exec",) else []
    r = fleet_cli(*command, str(job), "--exclude", "nope", *tail)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--exclude: no host named nope in " in r.stderr and "its hosts: a, b, c" in r.stderr


def test_a_slurm_cluster_has_no_hosts_to_choose(tmp_path: Path, fleet_cli: InProcessCLI) -> None:
    job = files(tmp_path)
    (tmp_path / "cluster.toml").write_text('[slurm]\nlogin = "hpc.example.org"\nnodes = 2\n')
    r = fleet_cli("check", str(job), "-i", str(tmp_path / "cluster.toml"), "--node", "a")
    assert r.returncode == 2 and "is a Slurm cluster" in r.stderr, r.stderr
