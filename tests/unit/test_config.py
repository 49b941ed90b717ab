"""Inventory and job files: every mistake names the file and the key, and nothing connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.config.inventory import load_inventory
from fleet.config.job import load_job
from fleet.errors import ConfigError
from tests.builders import hosts_toml, write_hosts, write_job
from tests.conftest import JOBS, InProcessCLI

GOOD_INV = hosts_toml({"a": "10.0.0.1"})


def write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def job_file(tmp: Path, body: str = "", script: bool = True) -> Path:
    write_hosts(tmp / "inv.toml", {"a": "10.0.0.1"})
    return write_job(tmp, body, script_text="print('hi')\n" if script else None)


@pytest.mark.parametrize("text, key, message", [
    ('[[hosts]]\nname = "a"\naddress = "x"\nusr = "root"\n', "hosts[0].usr", "unknown key"),
    ('[[hosts]]\nname = "a"\n', "hosts[0].address", "required key is missing"),
    ('[[hosts]]\nname = "a"\naddress = "x"\nport = "22"\n', "hosts[0].port", "must be an integer"),
    ('[[hosts]]\nname = "a"\naddress = "x"\nport = 70000\n', "hosts[0].port", "between 1"),
    ('[[hosts]]\nname = "a"\naddress = "x"\n[[hosts]]\nname = "a"\naddress = "y"\n',
     "hosts[1].name", "duplicate host name 'a'"),
    ('[[hosts]]\nname = "a b"\naddress = "x"\n', "hosts[0].name", "not a valid host name"),
    ('[[hosts]]\nname = "a"\naddress = "-oProxyCommand=sh"\n', "hosts[0].address",
     "not a host name or IP"),
    ('[[hosts]]\nname = "a"\naddress = "x"\nenv = { "BAD-NAME" = "1" }\n',
     "hosts[0].env.BAD-NAME", "not a valid environment variable name"),
    ('[defaults]\ntransport = "telnet"\n[[hosts]]\nname = "a"\naddress = "x"\n',
     "defaults.transport", 'must be "ssh" or "local"'),
    ('[defaults]\nuser = 3\n' + GOOD_INV, "defaults.user", "must be a string"),
    ('hosts = 3\n', "hosts", "array of tables"),
    ('[defaults]\n', "hosts", "at least one"),
])
def test_inventory_errors_name_file_and_key(tmp_path: Path, text: str, key: str,
                                            message: str) -> None:
    path = write(tmp_path, "inv.toml", text)
    with pytest.raises(ConfigError) as e:
        load_inventory(path)
    assert e.value.key == key
    assert str(e.value).startswith(f"{path}: {key}: ")
    assert message in str(e.value)


def test_malformed_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "inv.toml", '[[hosts]\nname = "a"\n')
    with pytest.raises(ConfigError, match=r"inv\.toml: not valid TOML: .*line 1"):
        load_inventory(path)


def test_defaults_apply_and_hosts_override(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "inv.toml", """
[defaults]
user = "alice"
port = 2222
env = { A = "1", B = "2" }
[[hosts]]
name = "n1"
address = "10.0.0.1"
[[hosts]]
name = "n2"
address = "10.0.0.2"
port = 22
env = { B = "3" }
"""))
    n1, n2 = inv.hosts
    assert (n1.user, n1.port, n1.env) == ("alice", 2222, {"A": "1", "B": "2"})
    assert (n2.user, n2.port, n2.env) == ("alice", 22, {"A": "1", "B": "3"})
    assert n1.transport == "ssh"


def test_localhost_gets_local_transport_and_this_python(tmp_path: Path) -> None:
    import sys
    inv = load_inventory(write(tmp_path, "i.toml", '[[hosts]]\nname="l"\naddress="localhost"\n'))
    assert inv.hosts[0].transport == "local"
    assert inv.hosts[0].python == sys.executable


@pytest.mark.parametrize("body, key, message", [
    ('nproc_per_node = 0\n', "nproc_per_node", "at least 1"),
    ('nproc_per_node = "many"\n', "nproc_per_node", "positive integer or one of"),
    ('args = "--epochs 1"\n', "args", "list of strings"),
    ('[rendezvous]\nbackend = "etcd"\n', "rendezvous.backend", "must be one of static, c10d"),
    ('[rendezvous]\nport = 0\n', "rendezvous.port", "between 1 and 65535"),
    ('[rendezvous]\nprot = 1\n', "rendezvous.prot", "unknown key"),
    ('[env]\nX = [1]\n', "env.X", "string or number"),
    ('scirpt = "x"\n', "scirpt", "unknown key"),
    ('data = "nowhere"\n', "data", "directory not found"),
    ('name = "../evil"\n', "name", "not a valid job name"),
    ('launcher = "mpirun"\n', "launcher", "must be one of torchrun, legacy, accelerate, command"),
    ('launcher = "command"\ncommand = []\n', "command", "must not be empty"),
    ('launcher = "command"\ncommand = ["x", "{nodes}"]\n', "command[1]",
     "unknown placeholder {nodes}"),
    ('args = ["{oops"]\n', "args[0]", "bad placeholder"),
    ('launcher = "accelerate"\nnproc_per_node = "gpu"\n', "nproc_per_node", "must be a number"),
])
def test_job_errors_name_file_and_key(tmp_path: Path, body: str, key: str, message: str) -> None:
    path = job_file(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert e.value.key == key and message in str(e.value), str(e.value)


def test_missing_script(tmp_path: Path) -> None:
    path = job_file(tmp_path, script=False)
    with pytest.raises(ConfigError, match=r"job\.toml: script: file not found"):
        load_job(path)


def test_script_outside_workdir(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = job_file(tmp_path, 'workdir = "sub"\n')
    path.write_text(path.read_text().replace('script = "train.py"', 'script = "../train.py"'))
    with pytest.raises(ConfigError, match="must lie inside the workdir"):
        load_job(path)


def test_shipped_jobs_and_inventories_load() -> None:
    for job in JOBS.glob("*.toml"):
        j = load_job(job)
        load_inventory(j.inventory)
    for inv in (JOBS.parent / "inventory").glob("*.toml"):
        load_inventory(inv)


def test_cli_reports_config_errors_without_connecting(fleet_cli: InProcessCLI,
                                                     tmp_path: Path) -> None:
    # The host would hang a connection attempt for its timeout: a quick exit shows none was made.
    (tmp_path / "train.py").write_text("")
    write(tmp_path, "inv.toml", '[[hosts]]\nname = "a"\naddress = "10.213.255.254"\n'
                                'connect_timeout = 30.0\nbogus = 1\n')
    job = write(tmp_path, "job.toml", 'inventory = "inv.toml"\nscript = "train.py"\n')
    for command in ("up", "plan"):
        r = fleet_cli(command, str(job), timeout=20)
        assert r.returncode == 2, r.stderr
        assert f"{tmp_path / 'inv.toml'}: hosts[0].bogus: unknown key" in r.stderr
        assert "connected" not in r.stderr


def test_cli_missing_inventory(fleet_cli: InProcessCLI, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    job = write(tmp_path, "job.toml", 'inventory = "nope.toml"\nscript = "train.py"\n')
    r = fleet_cli("up", str(job))
    assert r.returncode == 2
    assert "nope.toml: inventory file not found" in r.stderr



def test_plan_json_connects_to_nothing(fleet_cli: InProcessCLI) -> None:
    import json
    r = fleet_cli("plan", "--json", str(JOBS / "mnist.toml"), "--", "--resume")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    node = plan["nodes"][0]
    assert (node["host"], node["node_rank"], node["master_addr"]) == ("local", 0, "127.0.0.1")
    assert node["argv"][-3:] == ["--epochs", "1", "--resume"]
    assert node["env"]["FLEET_RUN_ID"] == plan["run_id"]
    assert "connected" not in r.stderr


def test_plan_of_ssh_aliases_shows_no_name_as_master_address(fleet_cli: InProcessCLI,
                                                            tmp_path: Path) -> None:
    """Without --probe the master's IP is unknown: said as such, never the alias itself (which
    means nothing on the nodes); each node's one rank is "rank 2", not "ranks 2-2"."""
    (tmp_path / "train.py").write_text("")
    write(tmp_path, "inv.toml", '[[hosts]]\nname = "gpu-a"\naddress = "gpu-a"\n'
                                '[[hosts]]\nname = "gpu-b"\naddress = "gpu-b"\n')
    job = write(tmp_path, "job.toml", 'inventory = "inv.toml"\nscript = "train.py"\n'
                                      'nproc_per_node = 1\n')
    r = fleet_cli("plan", str(job), timeout=20)
    assert r.returncode == 0, r.stderr
    assert "--master-addr gpu-a" not in r.stdout and "at gpu-a:" not in r.stdout, r.stdout
    assert "--master-addr '<IP of gpu-a>'" in r.stdout, r.stdout
    assert "note: the master address is <IP of gpu-a>: 'gpu-a' is a name" in r.stdout
    assert "processes: 1, rank 1 of world size 2" in r.stdout, r.stdout


def test_missing_mnist_data_names_the_command_that_makes_it(tmp_path: Path) -> None:
    """The hint is a command a person can paste: make_mnist.py with the folder the job wants."""
    job = tmp_path / "mnist.toml"
    job.write_text((JOBS / "mnist.toml").read_text().replace('"data"', '"no-data-yet"'))
    (tmp_path / "mnist.py").write_text("")
    with pytest.raises(ConfigError) as e:
        load_job(job)
    assert f"`python jobs/make_mnist.py {tmp_path / 'no-data-yet'}` makes one" in str(e.value)
