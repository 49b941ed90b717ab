"""The testbed's stand-in nvidia-smi (tests/fake_nvidia_smi.py) answers as the real one does:
its csv queries, -L, -i, its failures, and GPU processes that are real processes of this
machine (a dead one is not listed and holds no memory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_nvidia_smi import default_uuid

PROGRAM = Path(__file__).resolve().parents[1] / "fake_nvidia_smi.py"
H100 = "NVIDIA H100 80GB HBM3"


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def smi(tmp_path: Path, state: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    env = {**os.environ, "TB_NVIDIA_SMI_STATE": str(path)}
    return subprocess.run([sys.executable, "-I", str(PROGRAM), *args], capture_output=True,
                          text=True, timeout=30, env=env)


@pytest.fixture
def two_gpus() -> dict[str, Any]:
    """GPU 1 used by this test process (18432 MiB) and by one that has ended (5000 MiB);
    GPU 0 only by the one that ended."""
    gone = dead_pid()
    return {"gpus": [{"name": H100, "memory_total_mib": 81559, "utilization": 35},
                     {"name": H100, "memory_total_mib": 81559, "utilization": 87,
                      "uuid": "GPU-1b2c3d4e-0000-1111-2222-333344445555"}],
            "apps": [{"gpu": 1, "pid": os.getpid(), "used_mib": 18432},
                     {"gpu": 1, "pid": gone, "used_mib": 5000},
                     {"gpu": 0, "pid": gone, "used_mib": 7000}],
            "driver": "550.54.15"}


def test_query_gpu_with_units_and_header(tmp_path: Path, two_gpus: dict[str, Any]) -> None:
    r = smi(tmp_path, two_gpus, "--query-gpu=index,uuid,name,memory.used,memory.total,"
            "memory.free,utilization.gpu,driver_version,pci.bus_id,count", "--format=csv")
    assert r.returncode == 0, r.stdout
    u0 = default_uuid(0)
    assert r.stdout == (
        "index, uuid, name, memory.used [MiB], memory.total [MiB], memory.free [MiB], "
        "utilization.gpu [%], driver_version, pci.bus_id, count\n"
        f"0, {u0}, {H100}, 0 MiB, 81559 MiB, 81559 MiB, 0 %, 550.54.15, 00000000:18:00.0, 2\n"
        "1, GPU-1b2c3d4e-0000-1111-2222-333344445555, NVIDIA H100 80GB HBM3, 18432 MiB, "
        "81559 MiB, 63127 MiB, 87 %, 550.54.15, 00000000:19:00.0, 2\n")
    assert r.stderr == ""


def test_query_gpu_noheader_nounits_and_id(tmp_path: Path, two_gpus: dict[str, Any]) -> None:
    fields = "--query-gpu=index,memory.used,memory.total,utilization.gpu"
    r = smi(tmp_path, two_gpus, fields, "--format=csv,noheader,nounits")
    assert (r.returncode, r.stdout) == (0, "0, 0, 81559, 0\n1, 18432, 81559, 87\n")
    r = smi(tmp_path, two_gpus, fields, "--format=csv,noheader")
    assert r.stdout == "0, 0 MiB, 81559 MiB, 0 %\n1, 18432 MiB, 81559 MiB, 87 %\n"
    r = smi(tmp_path, two_gpus, "-i", "1", fields, "--format=csv,nounits")
    assert r.stdout == ("index, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
                        "1, 18432, 81559, 87\n")
    r = smi(tmp_path, two_gpus, "--id=0", "--query-gpu=name", "--format=csv,noheader")
    assert r.stdout == f"{H100}\n"
    r = smi(tmp_path, two_gpus, "-i", "2", fields, "--format=csv")
    assert (r.returncode, r.stdout) == (6, "No devices were found\n")


def test_query_compute_apps_lists_live_processes_only(tmp_path: Path,
                                                      two_gpus: dict[str, Any]) -> None:
    argv0 = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
    me, u1 = os.getpid(), "GPU-1b2c3d4e-0000-1111-2222-333344445555"
    r = smi(tmp_path, two_gpus, "--query-compute-apps=gpu_uuid,pid,used_memory",
            "--format=csv,noheader,nounits")
    assert (r.returncode, r.stdout) == (0, f"{u1}, {me}, 18432\n")
    r = smi(tmp_path, two_gpus, "--query-compute-apps=pid,process_name,used_gpu_memory,"
            "gpu_bus_id,gpu_name", "--format=csv")
    assert r.stdout == ("pid, process_name, used_gpu_memory [MiB], gpu_bus_id, gpu_name\n"
                        f"{me}, {argv0}, 18432 MiB, 00000000:19:00.0, {H100}\n")
    r = smi(tmp_path, two_gpus, "-i", "0", "--query-compute-apps=pid", "--format=csv")
    assert r.stdout == "pid\n"


def test_no_process_on_any_gpu(tmp_path: Path, two_gpus: dict[str, Any]) -> None:
    """The real one prints the header alone, or nothing with noheader."""
    two_gpus["apps"] = [{"gpu": 0, "pid": dead_pid(), "used_mib": 100}]
    query = "--query-compute-apps=gpu_uuid,pid,used_memory"
    r = smi(tmp_path, two_gpus, query, "--format=csv")
    assert (r.returncode, r.stdout) == (0, "gpu_uuid, pid, used_gpu_memory [MiB]\n")
    r = smi(tmp_path, two_gpus, query, "--format=csv,noheader,nounits")
    assert (r.returncode, r.stdout) == (0, "")


def test_list_gpus(tmp_path: Path, two_gpus: dict[str, Any]) -> None:
    for flag in ("-L", "--list-gpus"):
        r = smi(tmp_path, two_gpus, flag)
        assert (r.returncode, r.stdout) == (0, (
            f"GPU 0: {H100} (UUID: {default_uuid(0)})\n"
            f"GPU 1: {H100} (UUID: GPU-1b2c3d4e-0000-1111-2222-333344445555)\n"))
    assert default_uuid(0) != default_uuid(1)
    assert len(default_uuid(0)) == len("GPU-") + 36


def test_plain_summary(tmp_path: Path, two_gpus: dict[str, Any]) -> None:
    r = smi(tmp_path, two_gpus)
    assert r.returncode == 0
    assert "Driver Version: 550.54.15" in r.stdout
    assert "18432MiB / 81559MiB" in r.stdout and f" {os.getpid()} " in r.stdout


@pytest.mark.parametrize("fail,text,code", [
    ("no-driver", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                  "driver. Make sure that the latest NVIDIA driver is installed and running.\n", 9),
    ("version-mismatch", "Failed to initialize NVML: Driver/library version mismatch\n"
                         "NVML library version: 550.54\n", 18)])
def test_driver_failures(tmp_path: Path, two_gpus: dict[str, Any], fail: str, text: str,
                         code: int) -> None:
    two_gpus["fail"] = fail
    for args in (["--query-gpu=index", "--format=csv"], ["-L"], []):
        r = smi(tmp_path, two_gpus, *args)
        assert (r.returncode, r.stdout, r.stderr) == (code, text, "")


def test_bad_arguments(tmp_path: Path, two_gpus: dict[str, Any]) -> None:
    r = smi(tmp_path, two_gpus, "--query-gpu=index,fan.speedy", "--format=csv")
    assert (r.returncode, r.stdout) == (2, 'Field "fan.speedy" is not a valid field to query.\n\n')
    r = smi(tmp_path, two_gpus, "--query-compute-apps=pid,memory.used", "--format=csv")
    assert (r.returncode, r.stdout) == (2, 'Field "memory.used" is not a valid field to query.\n\n')
    invalid = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
    for args in (["-q"], ["--query-gpu=index"], ["-L", "--format=csv"],
                 ["--query-gpu=index", "--format=xml"],
                 ["--query-gpu=index", "--query-compute-apps=pid", "--format=csv"]):
        r = smi(tmp_path, two_gpus, *args)
        assert (r.returncode, r.stdout) == (2, invalid), args
