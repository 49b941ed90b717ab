"""Slurm, without a cluster: the [slurm] inventory, the sbatch script (rendered, checked by bash,
and run with stand-ins for srun/scontrol to prove every job string arrives literally), and the
parsers of what squeue, scontrol and sacct print."""

from __future__ import annotations

import copy
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import manifest, manifest_view
from fleet.backends.slurm import cluster as slurm
from fleet.backends.slurm import manifest as slurm_mf
from fleet.backends.slurm import script as slurm_script
from fleet.backends.slurm import watch as slurm_watch
from fleet.config.inventory import load_inventory
from fleet.config.job import load_job
from fleet.console import Console
from fleet.errors import ConfigError
from fleet.facts import slurm as sj
from fleet.states import RunStatus
from tests.builders import write_cluster, write_job
from tests.conftest import InProcessCLI

HOSTILE = ["$(touch {canary})", "`touch {canary}`", "it's \"quoted\"", "two words",
           "new\nline", "--flag=$HOME", "*", "; touch {canary}", "{{{{literal}}}}"]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def cluster_inv(tmp: Path, body: str = "") -> Path:
    return write_cluster(tmp / "cluster.toml", body, partition="gpu", time="01:00:00")


def job_file(tmp: Path, body: str = "", inventory: str = "cluster.toml") -> Path:
    return write_job(tmp, body, inventory=inventory, nproc_per_node=2)


def export(tmp: Path, body: str = "", inv_body: str = "", **options: object) -> str:
    cluster_inv(tmp, inv_body)
    job = load_job(job_file(tmp, body))
    return slurm_script.export_script(job, slurm.with_options(slurm.cluster_for(job.inventory),
                                                       **options))


def bash_ok(text: str, tmp: Path) -> None:
    f = write(tmp / "check.sh", text)
    r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ---- the inventory ------------------------------------------------------------------------
def test_cluster_inventory_is_read(tmp_path: Path) -> None:
    c = slurm.load_cluster(cluster_inv(tmp_path, 'account = "lab"\ngpus_per_node = 4\n'
                                       'python = "/opt/venv/bin/python"\n'
                                       'workdir = "/shared/fleet"\ncpus_per_task = 8\n'
                                       'env = { NCCL_IB_DISABLE = "1" }\n'
                                       'sbatch_args = ["--exclusive", "--qos=high"]\n'))
    assert (c.nodes, c.partition, c.time, c.account, c.gpus_per_node) == \
        (2, "gpu", "01:00:00", "lab", "4")
    assert c.login is not None and c.login.transport == "local"
    assert c.python == "/opt/venv/bin/python" and c.workdir == "/shared/fleet"
    assert c.env == {"NCCL_IB_DISABLE": "1"} and c.cpus_per_task == 8
    assert c.sbatch_args == ("--exclusive", "--qos=high")


def test_login_over_ssh(tmp_path: Path) -> None:
    c = slurm.load_cluster(write(tmp_path / "c.toml", '[slurm]\nlogin = "hpc.example.org"\n'
                                 'user = "alice"\nport = 2222\n'))
    assert c.login is not None
    assert (c.login.transport, c.login.address, c.login.user, c.login.port) == \
        ("ssh", "hpc.example.org", "alice", 2222)


@pytest.mark.parametrize("body, key, words", [
    ("nodez = 2\n", "slurm.nodez", "unknown key"),
    ("nodes = 0\n", "slurm.nodes", "at least 1"),
    ('partition = "a b"\n', "slurm.partition", "not a Slurm name"),
    ('time = "tomorrow"\n', "slurm.time", "not a Slurm time limit"),
    ('gpus_per_node = "four"\n', "slurm.gpus_per_node", "not a GPU count"),
    ('sbatch_args = ["--mem=1G --x"]\n', "slurm.sbatch_args[0]", "one sbatch option"),
    ('sbatch_args = ["#SBATCH"]\n', "slurm.sbatch_args[0]", "one sbatch option"),
    ('login = "-oProxyCommand=x"\n', "slurm.login", "not a host name"),
    ('interface = "eth0; rm"\n', "slurm.interface", "not a network interface"),
    ('env = { "A B" = "1" }\n', "slurm.env.A B", "not a valid environment variable"),
    ('transport = "carrier-pigeon"\n', "slurm.transport", 'must be "ssh" or "local"'),
])
def test_cluster_mistakes_name_file_and_key(tmp_path: Path, body: str, key: str,
                                            words: str) -> None:
    path = write(tmp_path / "c.toml", "[slurm]\n" + body)
    with pytest.raises(ConfigError) as e:
        slurm.load_cluster(path)
    assert e.value.key == key and e.value.path == str(path)
    assert words in str(e.value)


def test_hosts_and_slurm_together_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "c.toml", '[slurm]\nnodes = 2\n[[hosts]]\nname = "a"\n'
                 'address = "10.0.0.1"\n')
    with pytest.raises(ConfigError, match="either a Slurm cluster"):
        slurm.load_cluster(path)
    with pytest.raises(ConfigError, match="is a Slurm cluster, not a host list") as e:
        load_inventory(path)
    assert e.value.key == "slurm"


def test_host_list_gives_defaults(tmp_path: Path) -> None:
    write(tmp_path / "hosts.toml", '[defaults]\npython = "/venv/bin/python"\n'
          'env = { NCCL_IB_DISABLE = "1" }\n'
          '[[hosts]]\nname = "a"\naddress = "10.0.0.1"\ngpus = "0-3"\nenv = { ONLY_A = "1" }\n'
          '[[hosts]]\nname = "b"\naddress = "10.0.0.2"\ngpus = "4-7"\n'
          '[[hosts]]\nname = "c"\naddress = "10.0.0.3"\ngpus = [0, 1, 2, 3]\n')
    c = slurm.cluster_for(tmp_path / "hosts.toml")
    assert (c.nodes, c.python, c.gpus_per_node, c.login, c.workdir) == \
        (3, "/venv/bin/python", "4", None, None)
    assert c.env == {"NCCL_IB_DISABLE": "1"}  # a host's own env is not every node's
    job = load_job(job_file(tmp_path, inventory="hosts.toml"))
    text = slurm_script.export_script(job, c)
    assert "#SBATCH --nodes=3" in text and "#SBATCH --gpus-per-node=4" in text
    assert "--nproc-per-node 4" in text  # one process per chosen GPU, as on the hosts
    assert f"cd {tmp_path}" in text  # the code where it is: a shared home
    assert "exec /venv/bin/python -m torch.distributed.run" in text


def test_host_list_with_uneven_nodes_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "hosts.toml", '[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n'
          'nproc_per_node = 8\n[[hosts]]\nname = "b"\naddress = "10.0.0.2"\n')
    job = load_job(job_file(tmp_path, inventory="hosts.toml"))
    with pytest.raises(ConfigError, match="same number of processes on every node"):
        slurm_script.export_script(job, slurm.cluster_for(job.inventory))


@pytest.mark.parametrize("launcher, extra", [("accelerate", ""),
                                             ("command", 'command = ["x"]\n'),
                                             ("legacy", "")])
def test_other_launchers_are_refused_naming_the_key(tmp_path: Path, launcher: str,
                                                    extra: str) -> None:
    body = f'launcher = "{launcher}"\n{extra}'
    if launcher == "command":
        cluster_inv(tmp_path)
        write(tmp_path / "job.toml", f'inventory = "cluster.toml"\n{body}nproc_per_node = 2\n')
        job = load_job(tmp_path / "job.toml")
    else:
        cluster_inv(tmp_path)
        job = load_job(job_file(tmp_path, body))
    with pytest.raises(ConfigError) as e:
        slurm_script.export_script(job, slurm.cluster_for(job.inventory))
    assert e.value.key == "launcher" and e.value.path == str(tmp_path / "job.toml")
    assert "only \"torchrun\"" in str(e.value)


# ---- the script -----------------------------------------------------------------------------
def test_headers_and_shape(tmp_path: Path) -> None:
    text = export(tmp_path, inv_body='account = "lab"\ngpus_per_node = "a100:4"\n'
                  'cpus_per_task = 16\nsbatch_args = ["--exclusive"]\n')
    bash_ok(text, tmp_path)
    headers = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert headers == ["#SBATCH --job-name=job", "#SBATCH --nodes=2",
                       "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=a100:4",
                       "#SBATCH --cpus-per-task=16", "#SBATCH --time=01:00:00",
                       "#SBATCH --partition=gpu", "#SBATCH --account=lab",
                       "#SBATCH --exclusive", "#SBATCH --output=job-%j.out"]
    assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
    assert 'srun --kill-on-bad-exit=1 --nodes="$SLURM_NNODES" --ntasks-per-node=1' in text
    # The node rank is Slurm's node id (one task per node), never the task's PROCID.
    assert '--node-rank "$SLURM_NODEID"' in text and "PROCID" not in text
    assert '--master-addr "$MASTER_ADDR" --master-port 29500' in text
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text
    assert "127" in text  # loopback answers are skipped
    # The code where `fleet up` puts it on the shared filesystem; ~ is the node user's home.
    assert 'cd "$HOME"/fleet/code/job-' in text
    # The NIC as fleet picks it, unless pinned.
    assert "ip -o route get" in text and 'NCCL_SOCKET_IFNAME="=$iface"' in text


def test_command_line_options_win(tmp_path: Path) -> None:
    text = export(tmp_path, partition="debug", time="5", nodes=4, account="x",
                  gpus_per_node="2")
    for h in ("--partition=debug", "--time=5", "--nodes=4", "--account=x", "--gpus-per-node=2"):
        assert f"#SBATCH {h}\n" in text
    with pytest.raises(ConfigError, match="--partition"):
        export(tmp_path, partition="a;b")


def test_pinned_interface_is_not_detected(tmp_path: Path) -> None:
    text = export(tmp_path, inv_body='interface = "ib0"\n')
    assert "export NCCL_SOCKET_IFNAME==ib0" in text and "export GLOO_SOCKET_IFNAME=ib0" in text
    assert "ip -o route get" not in text
    text = export(tmp_path, body='[env]\nNCCL_SOCKET_IFNAME = "=eth1"\n')
    assert "ip -o route get" not in text


def test_c10d_debug_secrets_and_module(tmp_path: Path) -> None:
    write(tmp_path / "pkg.py", "")
    cluster_inv(tmp_path)
    write(tmp_path / "job.toml", 'inventory = "cluster.toml"\nmodule = "pkg"\ndebug = true\n'
          'secret_env = ["HIDDEN"]\n[env]\nHIDDEN = "s3cret"\nHF_TOKEN = "hf_x"\nA = "1"\n'
          '[rendezvous]\nbackend = "c10d"\nport = 29600\n')
    text = slurm_script.export_script(load_job(tmp_path / "job.toml"),
                               slurm.cluster_for(tmp_path / "cluster.toml"))
    bash_ok(text, tmp_path)
    assert '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR":29600' in text
    assert '--rdzv-id "$SLURM_JOB_ID"' in text and "--node-rank" not in text
    assert "--module pkg" in text and "export NCCL_DEBUG=INFO" in text
    assert "s3cret" not in text and "hf_x" not in text
    assert 'export HIDDEN="${HIDDEN:?set HIDDEN in the environment' in text
    assert "export A=1" in text


FAKE_SRUN = """#!/bin/bash
# srun for one node: run the task's command as node 0 of 1.
while [ "$1" != bash ]; do shift; done
SLURM_NODEID=0 SLURMD_NODENAME=n1 exec "$@"
"""
FAKE_SCONTROL = """#!/bin/sh
case "$2" in hostnames) echo n1 ;; node) echo "NodeName=n1 NodeAddr=10.9.8.7 State=IDLE" ;; esac
"""
FAKE_PYTHON = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}},
          open(os.environ["FAKE_OUT"], "w"))
"""


def test_hostile_strings_arrive_literally(tmp_path: Path) -> None:
    """The script, run by bash with stand-ins for srun/scontrol and a python that records
    what it got: every argument and env value is the job's own, and nothing was executed."""
    canary = tmp_path / "pwned"
    args = [a.format(canary=canary) for a in HOSTILE]
    binp = tmp_path / "bin"
    binp.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                       ("python", FAKE_PYTHON.format(python=sys.executable))):
        f = write(binp / name, body)
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    code = tmp_path / "code dir $(x)"
    code.mkdir()
    write(code / "train.py", "")
    toml_args = json.dumps(args)
    env_value = f"v $(touch {canary}) 'q' \"d\"\nline2"
    write(tmp_path / "cluster.toml", f'[slurm]\nnodes = 1\npython = "{binp}/python"\n')
    write(tmp_path / "job.toml", f'inventory = "cluster.toml"\nworkdir = "code dir $(x)"\n'
          f'script = "train.py"\nargs = {toml_args}\n[env]\nHOSTILE = {json.dumps(env_value)}\n')
    job = load_job(tmp_path / "job.toml")
    cluster = slurm.cluster_for(job.inventory)
    text = slurm_script.render(job, cluster, slurm_script.Script(code_dir=str(code)))
    script = write(tmp_path / "job.sbatch", text)
    out = tmp_path / "out.json"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30,
                       env={**os.environ, "PATH": f"{binp}:{os.environ['PATH']}",
                            "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1",
                            "SLURM_JOB_ID": "7", "FAKE_OUT": str(out)})
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())
    want_args = [a.replace("{{", "{").replace("}}", "}") for a in args]
    assert got["argv"][-len(args):] == want_args
    assert got["argv"][:6] == ["-m", "torch.distributed.run", "--nnodes", "1",
                               "--nproc-per-node", "1"]
    assert got["argv"][got["argv"].index("--node-rank") + 1] == "0"
    assert got["argv"][got["argv"].index("--master-addr") + 1] == "10.9.8.7"
    assert got["env"]["HOSTILE"] == env_value and got["env"]["MASTER_ADDR"] == "10.9.8.7"
    assert got["cwd"] == str(code)
    assert not canary.exists()


def test_placeholders_become_the_nodes_values(tmp_path: Path) -> None:
    text = export(tmp_path, body='args = ["--rank={node_rank}", "--of={nnodes}", '
                  '"--world={world_size}", "--first={first_rank}", "--at={master_addr}:'
                  '{master_port}", "{{x}}"]\n')
    assert ('--rank="$SLURM_NODEID" --of="$SLURM_NNODES" --world="$((SLURM_NNODES * 2))" '
            '--first="$((SLURM_NODEID * 2))" --at="$MASTER_ADDR":29500 \'{x}\'') in text


def test_master_never_loopback(tmp_path: Path) -> None:
    """The master-address lines of the script, run with a node whose name resolves to
    127.0.1.1 only and no NodeAddr: with 2 nodes the script stops, saying why; a lone node
    talks to itself over 127.0.0.1."""
    text = export(tmp_path)
    start = text.index("master_node=")
    end = text.index("export MASTER_ADDR")
    binp = tmp_path / "bin"
    binp.mkdir()
    for name, body in (("scontrol", '#!/bin/sh\n[ "$2" = hostnames ] && echo n1; true\n'),
                       ("getent", "#!/bin/sh\necho '127.0.1.1 STREAM n1'\n")):
        f = write(binp / name, body)
        f.chmod(0o755)
    snippet = write(tmp_path / "m.sh", "set -euo pipefail\n" + text[start:end]
                    + 'echo "ok $MASTER_ADDR"\n')

    def run(nodes: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(snippet)], capture_output=True, text=True,
                              env={**os.environ, "PATH": f"{binp}:{os.environ['PATH']}",
                                   "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": nodes})

    r = run("2")
    assert r.returncode == 1 and "resolves only to loopback" in r.stderr, r.stdout + r.stderr
    r = run("1")
    assert r.returncode == 0 and r.stdout == "ok 127.0.0.1\n", r.stdout + r.stderr


def test_cli_export(tmp_path: Path) -> None:
    cluster_inv(tmp_path)
    job = job_file(tmp_path)
    fleet = InProcessCLI(tmp_path)
    out = tmp_path / "job.sbatch"
    r = fleet("export", "slurm", str(job), "-o", str(out), "--time", "30")
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --time=30\n" in out.read_text() and os.access(out, os.X_OK)
    r = fleet("export", "slurm", str(job), "--gpus-per-node", "x y")
    assert r.returncode == 2 and "--gpus-per-node" in r.stderr


# ---- facts: what Slurm's clients print --------------------------------------------------------
SCONTROL = ("JobId=12 JobName=job UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 "
            "Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode "
            "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=1:0 "
            "RunTime=00:00:09 TimeLimit=00:10:00 NodeList=node[1-2] BatchHost=node1 "
            "Command=/shared/my runs/job.sbatch WorkDir=/shared/my runs "
            "StdOut=/shared/my runs/batch.log Power=")


def test_parse_scontrol() -> None:
    info = sj.parse_scontrol("banner line\n" + SCONTROL + "\n", "12")
    assert info == sj.JobInfo("12", "FAILED", 1, 0, "node[1-2]", "NonZeroExitCode", "scontrol")
    assert info.status is RunStatus.FAILED
    assert sj.scontrol_fields(SCONTROL)["WorkDir"] == "/shared/my runs"
    assert sj.parse_scontrol("slurm_load_jobs error: Invalid job id specified\n", "12") is None
    assert sj.parse_scontrol(SCONTROL, "13") is None


def test_parse_squeue_and_sacct() -> None:
    assert sj.parse_squeue("12|RUNNING|node[1-2]|None\n", "12") == \
        sj.JobInfo("12", "RUNNING", nodes="node[1-2]", reason="None", source="squeue")
    assert sj.parse_squeue("12|PENDING||Resources\n", "12").status is RunStatus.STARTING
    assert sj.parse_squeue("slurm_load_jobs error: Invalid job id specified\n", "12") is None
    assert sj.parse_sacct("12|CANCELLED by 0|0:15|node[1-2]\n", "12") == \
        sj.JobInfo("12", "CANCELLED by 0", 0, 15, "node[1-2]", source="sacct")
    assert sj.parse_sacct("sacct: error: Slurm accounting storage is disabled\n", "12") is None


def test_parse_job_prefers_scontrol_then_squeue_then_sacct() -> None:
    out = ("=== squeue\n12|COMPLETING|node[1-2]|None\n=== scontrol\n" + SCONTROL +
           "\n=== sacct\nsacct: error: Slurm accounting storage is disabled\n=== end\n")
    assert sj.parse_job(out, "12").source == "scontrol"
    out = "=== squeue\n12|RUNNING|node1|None\n=== scontrol\nInvalid job id\n=== sacct\n"
    assert sj.parse_job(out, "12").source == "squeue"
    out = "=== squeue\n=== scontrol\nInvalid\n=== sacct\n12|COMPLETED|0:0|node1\n"
    assert sj.parse_job(out, "12").status is RunStatus.SUCCEEDED
    assert sj.parse_job("=== squeue\n=== scontrol\n=== sacct\n", "12") is None


@pytest.mark.parametrize("state, status", [
    ("PENDING", RunStatus.STARTING), ("RUNNING", RunStatus.RUNNING),
    ("COMPLETING", RunStatus.RUNNING), ("COMPLETED", RunStatus.SUCCEEDED),
    ("CANCELLED by 0", RunStatus.STOPPED), ("CANCELLED+", RunStatus.STOPPED),
    ("TIMEOUT", RunStatus.FAILED), ("NODE_FAIL", RunStatus.FAILED),
    ("OUT_OF_MEMORY", RunStatus.FAILED), ("", RunStatus.UNKNOWN), ("WEIRD", RunStatus.UNKNOWN)])
def test_job_states(state: str, status: RunStatus) -> None:
    assert sj.status_of(state) is status


def test_parse_submit() -> None:
    assert sj.parse_submit("12\n") == "12"
    assert sj.parse_submit("Welcome to the cluster\n34;cluster2\n") == "34"
    assert sj.parse_submit("sbatch: error: Batch job submission failed\n") is None


def test_parse_nodes_and_srun_verdicts() -> None:
    out = ("noise\nnode=node1|1|signalled|fleet: node node1 is node rank 0 of 2 (master 10.0.0.1)\n"
           "node=node2|1||fleet: node node2 is node rank 1 of 2 (master 10.0.0.1)\n"
           "node=node3||| \n")
    assert sj.parse_nodes(out) == {"node1": sj.NodeInfo("node1", 0, 1, True),
                                   "node2": sj.NodeInfo("node2", 1, 1, False),
                                   "node3": sj.NodeInfo("node3", None, None, False)}
    log = ("srun: error: node2: task 1: Exited with exit code 1\n"
           "slurmstepd: error: *** STEP 2.0 ON node1 CANCELLED AT 2026-11-22T16:37:27 ***\n"
           "srun: error: node1: task 0: Terminated\n")
    ends = sj.parse_srun(log)
    assert [(e.node, e.by_itself) for e in ends] == [("node2", True), ("node1", False)]


def test_commands_quote_what_they_are_given() -> None:
    script = sj.submit_script("/shared/my runs/$(x)", "job.sbatch")
    assert "cd '/shared/my runs/$(x)'" in script
    assert "'--output=/shared/my runs/$(x)/batch.log'" in script
    assert sj.cancel_script("12; rm -rf /") == "scancel '12; rm -rf /' 2>&1"


# A stand-in for `srun --jobid=J --overlap --ntasks-per-node=1 --label CMD...`: runs CMD as two
# tasks on "nodes" n1 and n2 (SLURMD_NODENAME), each line labelled with its task, as srun does.
FAKE_STEP_SRUN = """#!/bin/sh
while [ "${1#-}" != "$1" ]; do shift; done
i=0
for node in n1 n2; do
  SLURMD_NODENAME=$node "$@" 2>&1 | sed "s/^/$i: /"
  i=$((i + 1))
done
"""


def test_step_script_runs_in_each_nodes_directory(tmp_path: Path) -> None:
    """The step's command reaches every node literally (a hostile run dir too), runs in that
    node's directory, and the parser gives each node its own lines; a node without its
    directory says `missing`."""
    run_dir = tmp_path / "runs $(touch pwned) 'q'"
    (run_dir / "n1").mkdir(parents=True)
    (run_dir / "n1" / "exit_code").write_text("0\n")
    binp = tmp_path / "bin"
    binp.mkdir()
    for name, body in (("srun", FAKE_STEP_SRUN), ("squeue", "#!/bin/sh\necho 2\n")):
        f = write(binp / name, body)
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    script = sj.step_script("12", str(run_dir), 'echo "in $(basename "$PWD")"; cat exit_code')
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                       cwd=tmp_path, env={**os.environ, "PATH": f"{binp}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stdout + r.stderr
    nodes, other = sj.parse_step(r.stdout)
    assert nodes == {"n1": "in n1\n0\n", "n2": "missing\n"} and other == []
    assert not (tmp_path / "pwned").exists()


def test_parse_step_keeps_what_was_no_tasks() -> None:
    out = ("srun: error: Unable to create step for job 12: Job/step already completing\n"
           " 0: fleet-node gpu-a\n 1: slurmstepd-gpu-b: error: couldn't chdir to `/x'\n"
           " 1: fleet-node gpu-b\n 0: === ended 1\n 1: missing\n"
           " 2: not a node's first line\n")
    nodes, other = sj.parse_step(out)
    assert nodes == {"gpu-a": "=== ended 1\n", "gpu-b": "missing\n"}
    assert other == ["srun: error: Unable to create step for job 12: Job/step already "
                     "completing", "slurmstepd-gpu-b: error: couldn't chdir to `/x'",
                     "not a node's first line"]


def test_parse_preflight() -> None:
    log = ("fleet: preflight failed on gpu-b: /x/python has no torch\n"
           "srun: error: gpu-b: task 1: Exited with exit code 1\n"
           "fleet: preflight failed on gpu-a: python /x/python not found or not runnable "
           "(exit 127)\n")
    assert sj.parse_preflight(log) == {
        "gpu-b": "/x/python has no torch",
        "gpu-a": "python /x/python not found or not runnable (exit 127)"}
    assert sj.parse_preflight("srun: error: gpu-a: task 0: Exited with exit code 1\n") == {}


def test_flight_recorder_is_refused_not_ignored(tmp_path: Path) -> None:
    cluster_inv(tmp_path)
    job = load_job(job_file(tmp_path, "[watchdog]\nnccl_flight_recorder = true\n"))
    with pytest.raises(ConfigError) as e:
        slurm_script.export_script(job, slurm.cluster_for(job.inventory))
    assert e.value.key == "watchdog.nccl_flight_recorder"
    assert e.value.path == str(tmp_path / "job.toml") and "not wired on Slurm" in str(e.value)


# ---- while the job waits: its state and Slurm's reason, said once per change ---------------
PENDING = ("JobId=14 JobName=job UserId=root(0) Priority=1 JobState=PENDING Reason=Resources "
           "Dependency=(null) ExitCode=0:0 RunTime=00:00:00 NodeList=(null) "
           "SchedNodeList=node[1-2]")


def test_state_words_name_the_reason_a_job_waits() -> None:
    info = sj.parse_scontrol(PENDING, "14")
    assert info is not None and info.reason == "Resources" and info.nodes == ""
    assert sj.state_words(info) == "PENDING (Resources)"
    assert sj.state_words(sj.parse_squeue("14|PENDING||Priority\n", "14")) == \
        "PENDING (Priority)"
    assert sj.state_words(sj.parse_squeue("14|PENDING||None\n", "14")) == "PENDING"
    assert sj.state_words(sj.parse_squeue("14|RUNNING|node[1-2]|None\n", "14")) == \
        "RUNNING on node[1-2]"


def test_announcer_says_each_change_once() -> None:
    err = io.StringIO()
    say = slurm_watch.Announcer(Console(out=io.StringIO(), err=err, color=False), "14")
    for line in ("14|PENDING||None", "14|PENDING||None", "14|PENDING||Resources",
                 "14|PENDING||Resources", "14|PENDING||Priority", "14|RUNNING|node[1-2]|None",
                 "14|RUNNING|node[1-2]|None", "14|COMPLETED|node[1-2]|None"):
        say(sj.parse_squeue(line, "14"))
    say(None)
    assert err.getvalue().splitlines() == [
        "fleet: slurm  job 14 is PENDING", "fleet: slurm  job 14 is PENDING (Resources)",
        "fleet: slurm  job 14 is PENDING (Priority)",
        "fleet: slurm  job 14 is RUNNING on node[1-2]"]


# ---- the script's preflight: each node's versions, for the manifest ---------------------------
def test_preflight_reports_the_versions_it_read(tmp_path: Path) -> None:
    """The script's own fleet_check, run by bash as srun would (its function body through
    `declare -f`): python and torch as the node's python says them; none for a python
    without torch, which fails the preflight."""
    import importlib.metadata
    import platform

    def preflight(python: str) -> subprocess.CompletedProcess[str]:
        text = export(tmp_path, inv_body=f'python = "{python}"\n')
        fn = text[text.index("fleet_check() {"):text.index('srun --nodes="$SLURM_NNODES" '
                                                            '--ntasks-per-node=1 bash -c')]
        return subprocess.run(["bash", "-c", fn + 'bash -c "$(declare -f fleet_check); '
                               'fleet_check"'], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "SLURMD_NODENAME": "n1"})

    r = preflight(sys.executable)
    assert r.returncode == 0, r.stderr
    assert sj.parse_versions(r.stdout) == {"n1": {
        "python": platform.python_version(), "torch": importlib.metadata.version("torch")}}
    r = preflight(str(tmp_path / "no-python"))
    assert r.returncode == 1 and sj.parse_versions(r.stdout + r.stderr) == {}
    assert sj.parse_preflight(r.stderr) == {
        "n1": f"python {tmp_path / 'no-python'} not found or not runnable (exit 127)"}


def test_parse_versions_and_node_entries() -> None:
    log = ("fleet: preflight on node2: python=3.11.7 torch=2.3.1\n"
           "fleet: preflight on node1: python=3.11.7 torch=\n"
           "fleet: preflight failed on node3: /x/python has no torch\n"
           "node1: fleet: preflight on node9: python=1 torch=1\n")
    assert sj.parse_versions(log) == {"node2": {"python": "3.11.7", "torch": "2.3.1"},
                                      "node1": {"python": "3.11.7"},
                                      "node9": {"python": "1", "torch": "1"}}
    nodes = {"node1": sj.NodeInfo("node1", 0, 0), "node2": sj.NodeInfo("node2", None, None)}
    entries = sj.node_entries(nodes, log.splitlines()[0] + "\n" + log.splitlines()[2], 2)
    assert entries == {
        "node1": {"node_rank": 0, "nproc": 2, "versions": {}},
        "node2": {"node_rank": None, "nproc": 2, "versions": {"python": "3.11.7",
                                                              "torch": "2.3.1"}},
        "node3": {"node_rank": None, "nproc": 2, "versions": {},
                  "preflight": "/x/python has no torch"}}
    assert "'/r $(x)/batch.log'" in sj.preflight_script("/r $(x)")


# ---- a Slurm run's manifest -------------------------------------------------------------------
def slurm_manifest(tmp: Path, run_id: str, job_id: str, lr: str = "0.1") -> dict:  # type: ignore[type-arg]
    cluster_inv(tmp, 'env = { CLUSTER_TOKEN = "c-secret" }\n')
    job = load_job(job_file(tmp, f'[env]\nLR = "{lr}"\nAPI_TOKEN = "s3cret"\n'))
    cluster = slurm.load_cluster(job.inventory)
    s = slurm_script.Script(code_dir="/w/code/j-1c1eb3c5", run_dir=f"/w/runs/{run_id}",
                            run_id=run_id)
    return slurm_mf.build_slurm(
        job, cluster, run_id, job_id, f"/w/runs/{run_id}/job.sbatch",
        slurm_script.env_of(job, cluster, run_id),
        [w for g in slurm_script.argv(job, cluster, s) for w in g],
        {"commit": "c1", "dirty": False, "diff": ""}, {"train.py": "h1"}, None)


def test_slurm_manifest_masks_secrets_and_shows_the_job_and_its_nodes(tmp_path: Path) -> None:
    m = slurm_manifest(tmp_path, "j-1", "12")
    text = manifest.dumps(m)
    assert "s3cret" not in text and "c-secret" not in text
    lines = manifest_view.show(m)
    assert lines[1] == "code: commit c1, clean; 1 file(s) synced"
    assert lines[2].startswith("slurm: job 12 through localhost (") and \
        "nodes 2, partition gpu, time 01:00:00" in lines[2]
    assert "  script: /w/runs/j-1/job.sbatch" in lines
    assert "  env LR=0.1" in lines and "  env API_TOKEN=***" in lines and \
        "  env CLUSTER_TOKEN=***" in lines and "  env FLEET_RUN_ID=j-1" in lines
    command = next(line for line in lines if line.startswith("  command: "))
    assert "-m torch.distributed.run" in command and '--node-rank "$SLURM_NODEID"' in command
    assert lines[-1] == "nodes: none had reported yet when fleet last asked Slurm"
    log = "fleet: preflight on node1: python=3.11.7 torch=2.3.1\n"
    ran = slurm_mf.with_allocation(
        m, "node[1-2]", "COMPLETED",
        sj.node_entries({"node1": sj.NodeInfo("node1", 0, 0),
                         "node2": sj.NodeInfo("node2", 1, 0)}, log, 2), True)
    lines = manifest_view.show(ran)
    assert lines[2].endswith(": COMPLETED on node[1-2]")
    assert lines[-2:] == ["[node1] node rank 0, 2 process(es); python 3.11.7, torch 2.3.1",
                          "[node2] node rank 1, 2 process(es); versions unknown"]
    assert manifest_view.show(slurm_mf.with_allocation(m, "", "CANCELLED", {}, True))[-1] == \
        "nodes: none reported (the job ended before its preflight ran on any node)"


def test_diff_of_slurm_runs_and_of_a_slurm_run_with_a_host_run(tmp_path: Path) -> None:
    log = "fleet: preflight on node1: python=3.11.7 torch=2.3.1\n"
    nodes = {"node1": sj.NodeInfo("node1", 0, 0)}
    a = slurm_mf.with_allocation(slurm_manifest(tmp_path, "j-1", "12"), "node[1-2]",
                                 "COMPLETED", sj.node_entries(nodes, log, 2), True)
    assert manifest_view.diff(a, copy.deepcopy(a)) == []
    b = slurm_mf.with_allocation(slurm_manifest(tmp_path, "j-2", "13", lr="0.2"), "node[2-3]",
                                 "COMPLETED", sj.node_entries(
                                     nodes, log.replace("2.3.1", "2.4.0"), 2), True)
    b["files"] = {"train.py": "h2"}
    b["inventory"]["slurm"]["partition"] = "big"
    assert manifest_view.diff(a, b) == [
        "file train.py: changed", "slurm: partition gpu -> big",
        "slurm: nodes node[1-2] -> node[2-3]", "env LR 0.1 -> 0.2",
        "node1: torch 2.3.1 -> 2.4.0"]
    hosts = {"run_id": "j-3", "job": {**a["job"], "env": {"LR": "0.3"}},
             "inventory": {"path": "hosts.toml"}, "code": a["code"], "files": a["files"],
             "data": None, "nodes": {"gpu-a": {}, "gpu-b": {}}}
    assert manifest_view.diff(a, hosts) == [
        f"ran on: Slurm ({tmp_path / 'cluster.toml'}: job 12 on node[1-2]) -> hosts "
        "(hosts.toml: gpu-a, gpu-b)", "job env API_TOKEN *** -> (unset)",
        "job env LR 0.1 -> 0.3",
        "nodes, env and commands are not compared between a host list and Slurm: `fleet show` "
        "each run"]


def test_a_compute_nodes_address_is_its_nodeaddr_checked() -> None:
    """`fleet forward` on Slurm reaches a node at Slurm's NodeAddr; what else the login node
    answers is never a destination."""
    line = ("NodeName=node1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.213.73.11 "
            "NodeHostName=node1 Version=23.11")
    assert sj.parse_node_address(line, "node1") == "10.213.73.11"
    assert sj.parse_node_address("NodeAddr=fd00::b", "n") == "fd00::b"
    assert sj.parse_node_address("", "node1") == "node1"  # no answer: the name
    assert sj.parse_node_address("NodeAddr=a;rm${IFS}x", "node1") == "node1"
    assert sj.parse_node_address("NoNodeAddr=10.0.0.1", "node1") == "node1"
