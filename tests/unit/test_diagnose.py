"""Failure signatures: each rule fires on the lines real tools print, and only on those."""

from __future__ import annotations

import pytest

from fleet.facts.diagnose import MAX_LINE, RULES, Diagnosis, diagnose, format_diagnoses

# Lines as NCCL, Gloo, c10d, torchrun, urllib, requests and python print them.
REAL_LINES = [
    ("no-route-to-host",
     "[0] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 128::1d<40861> returned "
     "113(No route to host) errno 11(Resource temporarily unavailable)"),
    ("no-route-to-host",
     "node2:4242:4300 [1] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to "
     "9001::281<50557> returned 113(No route to host) errno 11(Resource temporarily unavailable)"),
    ("name-resolution",
     "[W socket.cpp:601] [c10d] The IPv6 network addresses of (ece-a58489.austin.utexas.edu, "
     "44685) cannot be retrieved (gai error: -2 - Name or service not known)."),
    ("name-resolution",
     "socket.gaierror: [Errno -2] Name or service not known"),
    ("gloo-loopback",
     "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/"
     "pair.cc:144] no error ... remote=[127.0.0.1]:45123"),
    ("gloo-loopback",
     "RuntimeError: [/opt/conda/conda-bld/pytorch_1646755853042/work/third_party/gloo/gloo/"
     "transport/tcp/pair.cc:799] connect [127.0.1.1]:4623: Connection refused"),
    ("nccl-system-error",
     "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, "
     "unhandled system error, NCCL version 2.10.3"),
    ("nccl-system-error",
     "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
     "device error."),
    ("nccl-system-error",
     "  torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
     "ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for details), "
     "NCCL version 2.19.3"),
    ("rendezvous-timeout",
     "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"),
    ("rendezvous-timeout",
     "W0813 22:23:32.979031 140204091807488 torch/distributed/elastic/rendezvous/"
     "dynamic_rendezvous.py:1267] The node 'xxxxx' has failed to send a keep-alive heartbeat to "
     "the rendezvous '100' due to an error of type RendezvousTimeoutError."),
    ("rendezvous-timeout",
     "torch.distributed.DistNetworkError: The client socket has timed out after 900s while "
     "trying to connect to (10.0.0.11, 29500)."),
    ("rendezvous-timeout",
     "RuntimeError: Timed out initializing process group in store based barrier on rank: 2, for "
     "key: store_based_barrier_key:1 (world_size=2, worker_count=4, timeout=0:30:00)"),
    ("rendezvous-timeout",
     "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
     "1/2 clients joined."),
    ("download-failed",
     "urllib.error.URLError: <urlopen error [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
     "failed: unable to get local issuer certificate (_ssl.c:1006)>"),
    ("download-failed",
     "requests.exceptions.SSLError: HTTPSConnectionPool(host='download.openmmlab.com', port=443): "
     "Max retries exceeded with url: /mmdetection/v3.0/rtmdet/x.pth (Caused by SSLError("
     "SSLCertVerificationError(1, '[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
     "self-signed certificate in certificate chain (_ssl.c:1133)')))"),
    ("download-failed",
     "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>"),
    ("cuda-oom",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
     "capacity of 79.15 GiB of which 3.44 MiB is free."),
    ("cuda-oom",
     "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total "
     "capacity; 13.01 GiB already allocated; 1.01 GiB free; 13.25 GiB reserved in total by "
     "PyTorch)"),
    ("duplicate-gpu",
     "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"),
    ("address-in-use",
     "[W socket.cpp:426] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - "
     "Address already in use)."),
    ("address-in-use",
     "RuntimeError: The server socket has failed to listen on any local network address. port: "
     "29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"),
    ("connection-refused",
     "[W socket.cpp:663] [c10d] The client socket has failed to connect to [node1]:29500 "
     "(errno: 111 - Connection refused)."),
    ("connection-refused",
     "ConnectionRefusedError: [Errno 111] Connection refused"),
    ("module-not-found",
     "ModuleNotFoundError: No module named 'torchvision'"),
    ("module-not-found",
     "/usr/bin/python3: Error while finding module specification for 'torch.distributed.run' "
     "(ModuleNotFoundError: No module named 'torch')"),
    ("module-not-found",
     "/opt/venv/bin/python: No module named torch.distributed.run"),
    ("interface-not-found",
     "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] "
     "ifa != nullptr. Unable to find address for: eth0"),
    ("interface-not-found",
     "node1:1234:1234 [0] NCCL WARN Bootstrap : no socket interface found"),
]

# What a run that worked prints: torchrun's banner, NCCL's INFO lines, c10d's benign warnings.
HEALTHY_LOG = """\
W1122 02:09:20.170086 140209818330880 torch/distributed/run.py:779]
W1122 02:09:20.170086 140209818330880 torch/distributed/run.py:779] \
*****************************************
W1122 02:09:20.170086 140209818330880 torch/distributed/run.py:779] Setting OMP_NUM_THREADS \
environment variable for each process to be 1 in default, to avoid your system being \
overloaded, please further tune the variable for optimal performance in your application as \
needed.
W1122 02:09:20.170086 140209818330880 torch/distributed/run.py:779] \
*****************************************
[W1122 02:09:24.909136767 socket.cpp:207] [c10d] The hostname of the client socket cannot be \
retrieved. err=-3
[I socket.cpp:787] [c10d] The client socket has connected to [node1]:29500 on [node2]:46672.
node1:4021:4021 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.11<0>
node1:4021:4021 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to =eth0
node1:4021:4021 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.11<0>
Initialized process group with rank 0.
Running on rank 0. (local device: 0)
Epoch [0/10], Batch [0/469], Loss: 2.2978
Epoch [0/10], Batch [100/469], Loss: 0.0704
Epoch [0/10] completed. Loss: 0.1745
Epoch [1/10], Batch [0/469], Loss: 0.0423
"""


def test_rule_names_are_unique_and_every_rule_says_what_and_how() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for r in RULES:
        assert r.meaning.endswith(".") and r.fix.endswith("."), r.name


def test_every_rule_has_a_real_line() -> None:
    assert {name for name, _ in REAL_LINES} == {r.name for r in RULES}


@pytest.mark.parametrize(("rule", "line"), REAL_LINES,
                         ids=[f"{name}-{i}" for i, (name, _) in enumerate(REAL_LINES)])
def test_rule_fires_on_real_line(rule: str, line: str) -> None:
    found = [d.rule for d in diagnose(line)]
    assert rule in found
    # One line is allowed a second hint only where it carries a second real signature.
    assert set(found) <= {rule, "connection-refused"}


def test_name_resolution_defers_to_download_rule() -> None:
    line = ("urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>")
    assert [d.rule for d in diagnose(line)] == ["download-failed"]


def test_healthy_log_gives_no_diagnosis() -> None:
    assert diagnose(HEALTHY_LOG) == []


def test_connection_refused_only_on_refused_lines() -> None:
    text = ("[I socket.cpp:787] [c10d] The client socket has connected to [node1]:29500\n"
            "connection to node2 accepted; nothing was refused\n"
            "INFO: rendezvous port 29500 open on node1\n")
    assert diagnose(text) == []


def test_each_rule_once_even_when_matched_many_times() -> None:
    line = ("[W socket.cpp:663] [c10d] The client socket has failed to connect to [node1]:29500 "
            "(errno: 111 - Connection refused).")
    found = diagnose("\n".join([line] * 20))
    assert [d.rule for d in found] == ["connection-refused"]
    assert found[0].line == line


def test_order_follows_first_appearance() -> None:
    text = "\n".join([
        "Epoch [0/10], Batch [0/469], Loss: 2.2978",
        "ModuleNotFoundError: No module named 'wandb'",
        "[0] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 128::1d<40861> returned "
        "113(No route to host) errno 11(Resource temporarily unavailable)",
        "ModuleNotFoundError: No module named 'wandb'",
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, "
        "unhandled system error, NCCL version 2.10.3",
    ])
    assert [d.rule for d in diagnose(text)] == [
        "module-not-found", "no-route-to-host", "rendezvous-timeout", "nccl-system-error"]


def test_two_signatures_on_one_line_in_line_order() -> None:
    line = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] "
            "connect [127.0.1.1]:4623: Connection refused")
    assert [d.rule for d in diagnose(line)] == ["gloo-loopback", "connection-refused"]


def test_line_is_stripped_and_clipped_around_the_signature() -> None:
    line = "x" * 500 + " torch.OutOfMemoryError: CUDA out of memory. " + "y" * 500
    (d,) = diagnose("   " + line + "   \n")
    assert len(d.line) <= MAX_LINE
    assert "OutOfMemoryError" in d.line
    short = "  ModuleNotFoundError: No module named 'torch'  "
    assert diagnose(short)[0].line == short.strip()


def test_colour_codes_do_not_hide_a_signature() -> None:
    line = "\x1b[31mtorch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\x1b[0m"
    (d,) = diagnose(line)
    assert d.rule == "rendezvous-timeout"
    assert "\x1b" not in d.line


def test_fixes_point_at_fleet_features() -> None:
    fix = {r.name: r.fix for r in RULES}
    assert 'interface = "' in fix["no-route-to-host"]
    assert "NCCL_SOCKET_IFNAME" in fix["no-route-to-host"]
    assert "fleet check" in fix["rendezvous-timeout"]
    assert "[rendezvous]" in fix["rendezvous-timeout"]
    assert 'data = "' in fix["download-failed"]
    assert "fleet check" in fix["connection-refused"]
    assert "set_device" in fix["cuda-oom"]


def test_format_gives_the_seen_line_then_the_hint() -> None:
    d = Diagnosis("r", "the line", "It broke.", "Mend it.")
    assert format_diagnoses([d, d]) == [
        "seen: the line", "hint: It broke. Fix: Mend it.",
        "seen: the line", "hint: It broke. Fix: Mend it.",
    ]
    assert format_diagnoses([]) == []
