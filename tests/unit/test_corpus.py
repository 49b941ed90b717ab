"""A corpus of malformed and hostile inventory and job files, each through the real CLI: a clear
message naming the file and the key, a non-zero exit, and no connection opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import InProcessCLI

# An address no test ever creates; with a 30 s connect timeout a connection attempt would show.
HOST = '[[hosts]]\nname = "a"\naddress = "10.213.255.254"\nconnect_timeout = 30.0\n'
JOB = 'inventory = "inv.toml"\nscript = "train.py"\n'

CORPUS: list[tuple[str, str, str, str]] = [  # (inventory, job, file, key)
    # inventory
    ("[[hosts]\n", JOB, "inv.toml", ""),
    (HOST + 'bogus = 1\n', JOB, "inv.toml", "hosts[0].bogus"),
    (HOST + 'port = "22"\n', JOB, "inv.toml", "hosts[0].port"),
    (HOST + "port = -1\n", JOB, "inv.toml", "hosts[0].port"),
    (HOST + HOST, JOB, "inv.toml", "hosts[1].name"),
    ('[[hosts]]\nname = "a$(reboot)"\naddress = "x"\n', JOB, "inv.toml", "hosts[0].name"),
    ('[[hosts]]\nname = "a"\naddress = "x; rm -rf /"\n', JOB, "inv.toml", "hosts[0].address"),
    ('[[hosts]]\nname = "a"\naddress = "-oProxyCommand=touch x"\n', JOB, "inv.toml",
     "hosts[0].address"),
    ('[[hosts]]\nname = "a"\naddress = "x\\ny"\n', JOB, "inv.toml", "hosts[0].address"),
    ('[[hosts]]\nname = "../../etc"\naddress = "x"\n', JOB, "inv.toml", "hosts[0].name"),
    (HOST + 'env = { "A;B" = "1" }\n', JOB, "inv.toml", "hosts[0].env.A;B"),
    (HOST + 'env = { "A" = { x = 1 } }\n', JOB, "inv.toml", "hosts[0].env.A"),
    (HOST + 'interface = "eth0; reboot"\n', JOB, "inv.toml", "hosts[0].interface"),
    (HOST + 'host_key = "ssh-ed25519 not-base64!"\n', JOB, "inv.toml", "hosts[0].host_key"),
    (HOST + 'transport = "rsh"\n', JOB, "inv.toml", "hosts[0].transport"),
    (HOST + 'python = ""\n', JOB, "inv.toml", "hosts[0].python"),
    (HOST + 'user = "root\\u0000"\n', JOB, "inv.toml", "hosts[0].user"),
    ('[defaults]\nconnect_timeout = 0\n' + HOST, JOB, "inv.toml", "defaults.connect_timeout"),
    ('hosts = "a"\n', JOB, "inv.toml", "hosts"),
    ("", JOB, "inv.toml", "hosts"),
    # job
    (HOST, JOB + "[rendezvous\n", "job.toml", ""),
    (HOST, JOB + "scirpt = 1\n", "job.toml", "scirpt"),
    (HOST, 'inventory = "inv.toml"\n', "job.toml", "script"),
    (HOST, 'inventory = "inv.toml"\nscript = "../../etc/passwd"\n', "job.toml", "script"),
    (HOST, 'inventory = "missing.toml"\nscript = "train.py"\n', "missing.toml", ""),
    (HOST, JOB + "nproc_per_node = -2\n", "job.toml", "nproc_per_node"),
    (HOST, JOB + "nproc_per_node = true\n", "job.toml", "nproc_per_node"),
    (HOST, JOB + 'args = ["ok", 3]\n', "job.toml", "args"),
    (HOST, JOB + 'args = ["{master_addr}", "{evil.__class__}"]\n', "job.toml", "args[1]"),
    (HOST, JOB + '[env]\n"X Y" = "1"\n', "job.toml", "env.X Y"),
    (HOST, JOB + '[rendezvous]\nbackend = "etcd-v2"\n', "job.toml", "rendezvous.backend"),
    (HOST, JOB + "[rendezvous]\nport = 99999\n", "job.toml", "rendezvous.port"),
    (HOST, JOB + "[rendezvous]\ntimeout = 0\n", "job.toml", "rendezvous.timeout"),
    (HOST, JOB + 'name = "a/b"\n', "job.toml", "name"),
    (HOST, JOB + 'workdir = "nowhere"\n', "job.toml", "workdir"),
    (HOST, JOB + 'templates = "nowhere"\n', "job.toml", "templates"),
    (HOST, JOB + 'launcher = "slurm"\n', "job.toml", "launcher"),
    (HOST, JOB + 'secret_env = "KEY"\n', "job.toml", "secret_env"),
]


@pytest.mark.parametrize("inventory, job, file, key", CORPUS,
                         ids=[f"{i:02d}-{c[3] or c[2]}" for i, c in enumerate(CORPUS)])
def test_bad_input_names_file_and_key_and_connects_nowhere(fleet_cli: InProcessCLI,
                                                           tmp_path: Path, inventory: str,
                                                           job: str, file: str,
                                                           key: str) -> None:
    (tmp_path / "inv.toml").write_text(inventory)
    (tmp_path / "job.toml").write_text(job)
    (tmp_path / "train.py").write_text("print('never runs')\n")
    r = fleet_cli("up", str(tmp_path / "job.toml"), timeout=20)
    assert r.returncode == 2, r.stdout + r.stderr
    where = f"{tmp_path / file}: {key}: " if key else f"{tmp_path / file}: "
    assert r.stderr.startswith(f"fleet: error: {where}"), r.stderr
    assert "connected" not in r.stderr and "Traceback" not in r.stderr


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 30
