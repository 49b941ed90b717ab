"""The facts' parsers against output recorded from real machines (tests/fixtures/): what a node
really prints, not what a test author thought it prints."""

from __future__ import annotations

from pathlib import Path

from fleet.facts.failure import parse_kernel_log
from fleet.facts.gpus import parse_gpus
from fleet.facts.probe import PythonState, parse_probe

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_gpus_of_an_h200_with_one_torch_process() -> None:
    f = parse_gpus(recorded("gpus/h200-one-process.txt"))
    assert f.smi and f.error == "" and f.me == "root" and f.now > 1.7e9
    (gpu,) = f.gpus
    assert (gpu.index, gpu.name, gpu.used_mib, gpu.total_mib, gpu.util) == (
        0, "NVIDIA H200", 23, 143771, 0)
    assert gpu.uuid.startswith("GPU-") and len(gpu.uuid) == 40
    (app,) = f.apps
    assert (app.gpu_uuid, app.user, app.used_mib, app.run_id) == (gpu.uuid, "root", 22, "")
    assert app.pid > 0 and app.command.startswith("python3 -c import torch")
    assert f.leases == () and f.unknown == ""


def test_gpus_of_a_machine_without_nvidia_smi() -> None:
    f = parse_gpus(recorded("gpus/no-nvidia-smi.txt"))
    assert not f.smi and f.gpus == () and f.apps == () and f.error == ""
    assert f.me == "root" and f.leases == ()


def test_probe_of_a_venv_with_torch_asked_deep() -> None:
    f = parse_probe(recorded("probe/venv-with-torch-deep.txt"))
    assert f.python is PythonState.OK and f.hostname == "vm"
    assert (f.home, f.shell, f.server_ip) == ("/root", "/bin/bash", None)  # no SSH: sh here
    assert f.python_version.startswith("3.") and f.torch_version and f.accelerate_version
    assert f.cuda_version and f.nccl_version and len(f.storage) == 16
    assert float(f.node_time) > 1.7e9 and f.held == () and f.detail == ""
    assert ("lo", "127.0.0.1") in f.addrs
    assert any(p.startswith("torch==") for p in f.packages)
    h = f.health
    assert h is not None and h.torch.startswith(f.torch_version) and h.torch_error == ""
    assert h.gpus == 0 and h.resolves and h.disk_free > 0 and h.disk_path == "/tmp/fleet-rec"


def test_probe_of_a_system_python_without_torch() -> None:
    f = parse_probe(recorded("probe/system-python-no-torch.txt"))
    assert f.python is PythonState.NO_TORCH and f.torch_version == ""
    assert f.python_version.startswith("3.") and f.health is None  # not asked deep
    assert not any(p.startswith("torch==") for p in f.packages) and f.packages
    assert f.detail == ""


def test_kernel_log_readable_without_an_oom_kill() -> None:
    (said,) = parse_kernel_log(recorded("kernel_log/readable-no-kill.txt"), "n1", 41)
    assert said.startswith("n1's kernel log (dmesg) holds no OOM kill")


def test_kernel_log_that_the_user_may_not_read() -> None:
    (said,) = parse_kernel_log(recorded("kernel_log/nobody.txt"), "n1", 41)
    assert said.startswith("n1's kernel log could not be read (dmesg: read kernel buffer "
                           "failed: Operation not permitted)")
