"""Plain `fleet up` and another user's process on a GPU it would use: refused before any claim
(naming host, GPU, user, pid and MiB) unless --force, which says each one it starts beside;
the login's own processes never stop it; leases stay --ignore-leases' (tests/unit/
test_gpu_sharing.py has the parser and the blockers of --wait)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from fleet.backends.hosts.gpus import gate, refused
from fleet.config.inventory import Host
from fleet.console import Console
from fleet.errors import ExitCode, GpusTaken
from fleet.facts.gpus import busy, parse_gpus
from fleet.gpuview import process_blockers
from fleet.transport.framing import Result

NOW = 1_795_534_438.0


def node(apps: str, leases: str = "", me: str = "root") -> str:
    """What GPU_SCRIPT prints on a node with two GPUs."""
    return (f"me={me}\nnow={NOW:.0f}\n=== leases\n{leases}=== gpus\n"
            "0, GPU-aaa, 2048, 81559, 0, NVIDIA H100 80GB HBM3\n"
            "1, GPU-bbb, 18944, 81559, 35, NVIDIA H100 80GB HBM3\n=== rc 0\n=== apps\n" + apps)


ALICE = "GPU-bbb\t4242\t18432\talice\t10800\t\tpython big.py\n"
UNSEEN = "GPU-bbb\t400\t512\t\t\t\t\n"  # another container's: no owner here
MINE = "GPU-aaa\t100\t2048\troot\t7300\t20261124-101010-job-ab12\tpython train.py\n"
LEASE = f"alice 4243 {NOW:.0f}\t" + json.dumps({
    "gpus": [0], "since": NOW - 60, "until": NOW + 3600, "note": "deadline",
    "origin": "alice@laptop"}) + "\n"


def test_another_users_process_and_one_not_visible_block_the_gpus_the_job_would_use() -> None:
    f = parse_gpus(node(MINE + ALICE + UNSEEN))
    assert [b.line() for b in process_blockers("node1", (1,), f, NOW)] == [
        "node1 GPU1: 18432 MiB in use by user alice (pid 4242)",
        "node1 GPU1: 512 MiB in use by a process not visible here (pid 400)"]
    assert process_blockers("node1", (0,), f, NOW) == []  # root's own process never blocks
    # No GPU chosen: the job would use every GPU there (as --wait has it).
    assert len(process_blockers("node1", None, f, NOW)) == 2
    # `fleet check` says the same processes.
    assert busy((1,), f) == ["GPU 1 has 18432 MiB in use by user alice (pid 4242)",
                             "GPU 1 has 512 MiB in use by a process not visible here (pid 400)"]


def test_a_host_without_nvidia_smi_or_gpus_is_never_refused() -> None:
    none = parse_gpus(f"me=root\nnow={NOW:.0f}\n=== leases\nnvidia-smi=missing\n")
    assert not none.smi and process_blockers("node2", None, none, NOW) == []
    assert process_blockers("node2", (0,), none, NOW) == []
    hosts = [Host("node2", "10.0.0.2", gpus=(0,))]
    assert refused(hosts, {"node2": none}, NOW, False, False) == ("checking GPU leases", {})


def test_the_decision_leases_for_ignore_leases_processes_for_force() -> None:
    hosts = [Host("node1", "10.0.0.1", gpus=(0, 1)), Host("node2", "10.0.0.2")]
    facts = {"node1": parse_gpus(node(MINE + ALICE, LEASE)), "node2": parse_gpus(node(MINE))}
    what, why = refused(hosts, facts, NOW, ignore_leases=False, force=False)
    assert what == "checking who uses the GPUs" and list(why) == ["node1"]
    lease, proc = why["node1"].split("; ")
    assert lease.startswith("GPU0: leased by alice until ") and lease.endswith(
        '"deadline" (wait for it (fleet up --wait) or start anyway (--ignore-leases))')
    assert proc == ("GPU1: 18432 MiB in use by user alice (pid 4242) (wait for it "
                    "(fleet up --wait) or start anyway (--force))")
    # --force lets her process through, not her lease; --ignore-leases the other way round.
    what, why = refused(hosts, facts, NOW, ignore_leases=False, force=True)
    assert what == "checking GPU leases" and "pid 4242" not in why["node1"]
    assert "(--ignore-leases)" in why["node1"]
    _, why = refused(hosts, facts, NOW, ignore_leases=True, force=False)
    assert why == {"node1": proc}
    assert refused(hosts, facts, NOW, ignore_leases=True, force=True)[1] == {}
    # GPU 0 alone chosen: alice's process on GPU 1 is not in the way.
    only0 = [Host("node1", "10.0.0.1", gpus=(0,))]
    assert refused(only0, facts, NOW, ignore_leases=True, force=False)[1] == {}


class Node:
    """A transport that answers GPU_SCRIPT only; anything else would be a claim or a write."""

    def __init__(self, out: str) -> None:
        self.out, self.scripts = out, list[str]()

    def run(self, script: str, timeout: float | None = 60.0, what: str = "") -> Result:
        self.scripts.append(what)
        assert what == "list GPUs (nvidia-smi)", what
        return Result(what, 0, self.out, "")


def test_the_gate_refuses_before_anything_else_and_force_says_each_blocker() -> None:
    hosts = [Host("node1", "10.0.0.1", gpus=(1,))]
    t: Any = Node(node(ALICE))
    err = io.StringIO()
    with pytest.raises(GpusTaken) as e:
        gate({"node1": t}, hosts, None, False, Console(io.StringIO(), err, color=False))
    assert e.value.exit_code == ExitCode.BUSY
    assert list(e.value.failures) == ["node1"] and "pid 4242" in e.value.failures["node1"]
    assert t.scripts == ["list GPUs (nvidia-smi)"] and err.getvalue() == ""
    facts = gate({"node1": t}, hosts, None, False, Console(io.StringIO(), err, color=False),
                 force=True)
    assert facts["node1"].apps[0].pid == 4242
    assert err.getvalue() == ("fleet: --force: starting although node1 GPU1: 18432 MiB in use by "
                              "user alice (pid 4242)\n")
    # --force with her lease still there: refused for the lease, and nothing said as started.
    quiet = io.StringIO()
    with pytest.raises(GpusTaken) as e:
        gate({"node1": Node(node(ALICE, LEASE))}, [Host("node1", "10.0.0.1", gpus=(0, 1))],
             None, False, Console(io.StringIO(), quiet, color=False), force=True)
    assert "(--ignore-leases)" in e.value.failures["node1"]
    assert "pid 4242" not in e.value.failures["node1"] and quiet.getvalue() == ""
