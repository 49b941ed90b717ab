"""`fleet exec`'s pure parts: the node's script under a real sh (the command as given, in its
directory, with its env, its output capped), its parser, the grouping of answers as dshbak -c
shows them, the summary and the exit code; the hosts chosen and the job's directory and env."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.backends.hosts.execute import chosen, job_directory, job_env
from fleet.config.inventory import Host, Inventory
from fleet.config.job import Job
from fleet.console import Meaning
from fleet.errors import CommandTimedOut, ExitCode, FleetError, TransportError, UsageError
from fleet.facts.command import CAP, Absent, Answer, command_script, parse_answer
from fleet.grouped import Group, block, exit_code, groups, summary
from tests.conftest import InProcessCLI

ROOT = Path(__file__).resolve().parents[2]
SH = shutil.which("dash") or "sh"
MARK = "FLEET-EXEC-0123456789abcdef"


def on_node(argv: list[str], directory: str, env: dict[str, str] | None = None,
            raw: frozenset[str] = frozenset(), home: Path | None = None
            ) -> Answer | Absent | None:
    """The script as the transport runs it (text on a POSIX sh's stdin), parsed."""
    r = subprocess.run([SH, "-s"], input=command_script(argv, directory, env or {}, MARK, raw),
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(home or "/")})
    assert r.returncode == 0, r.stderr
    return parse_answer(r.stdout, r.stderr, MARK, directory)


def test_the_command_runs_as_given_in_its_directory_with_its_env(tmp_path: Path) -> None:
    hostile = "it's $HOME `id` $(touch pwned); \"x\" \\"
    a = on_node(["sh", "-c", 'pwd; printf "%s|" "$V" "$@"; echo; echo oops >&2; exit 7',
                 "zero", "a b", "*", hostile], str(tmp_path), {"V": hostile})
    assert a == Answer(f"{tmp_path}\n{hostile}|a b|*|{hostile}|\noops\n", 7, 0)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_a_tilde_is_the_nodes_home_in_the_directory_and_in_path_values(tmp_path: Path) -> None:
    (tmp_path / "fleet" / "code" / "j").mkdir(parents=True)
    a = on_node(["sh", "-c", 'pwd; echo "$D|$L"'], "~/fleet/code/j",
                {"D": "~/fleet/data/d", "L": "~/literal"}, frozenset({"D"}), home=tmp_path)
    assert a == Answer(f"{tmp_path}/fleet/code/j\n{tmp_path}/fleet/data/d|~/literal\n", 0)


def test_a_missing_directory_runs_nothing_and_says_so(tmp_path: Path) -> None:
    a = on_node(["touch", str(tmp_path / "ran")], str(tmp_path / "nowhere"))
    assert a == Absent(str(tmp_path / "nowhere"))
    assert not (tmp_path / "ran").exists()


def test_output_past_the_cap_is_counted_not_shown_and_the_command_not_killed(
        tmp_path: Path) -> None:
    a = on_node(["sh", "-c", f"head -c {CAP + 1000} /dev/zero | tr '\\0' x; echo done >&2; "
                             "exit 4"], str(tmp_path))
    assert isinstance(a, Answer)
    assert a.output == "x" * CAP and a.cut == 1000 + len("done\n") and a.code == 4


def test_a_command_that_is_not_there_is_its_own_failure(tmp_path: Path) -> None:
    a = on_node(["no-such-command-here"], str(tmp_path))
    assert isinstance(a, Answer) and a.code == 127 and "no-such-command-here" in a.output


@pytest.mark.parametrize("out,err", [
    ("partial output\n", ""),  # killed before the status came
    (f"x\n{MARK} 0\n", "status ?\n"),
    ("x\nFLEET-EXEC-forged 0\n", "status 0\n"),  # a mark the command could not know
])
def test_an_answer_without_its_status_or_mark_is_no_answer(out: str, err: str) -> None:
    assert parse_answer(out, err, MARK, "/d") is None


def test_the_mark_that_counts_is_the_last_one() -> None:
    out = f"a\n{MARK} 5\nb\n{MARK} 2\n"
    assert parse_answer(out, "status 0\n", MARK, "/d") == Answer(f"a\n{MARK} 5\nb", 0, 2)


OUTCOMES: dict[str, Answer | Absent | Exception] = {
    "node1": Answer("same\n", 0), "node2": Answer("other\n", 0), "node3": Answer("same\n", 0),
    "node4": Answer("same\n", 1)}


def test_identical_answers_are_one_group_in_the_order_of_their_first_host() -> None:
    assert groups(OUTCOMES) == [Group(("node1", "node3"), Answer("same\n", 0)),
                                Group(("node2",), Answer("other\n", 0)),
                                Group(("node4",), Answer("same\n", 1))]
    assert block(groups(OUTCOMES)[0]) == [("---- node1,node3 (2) ----", Meaning.NAME),
                                          ("same", Meaning.PLAIN)]
    assert block(groups(OUTCOMES)[2])[0] == ("---- node4 (1): exit status 1 ----", Meaning.FAIL)


def test_a_cut_output_says_how_much_is_not_shown() -> None:
    lines = block(Group(("n",), Answer("x", 0, cut=12)))
    assert lines[-1] == ("[output cut after 64 KiB: 12 bytes more not shown]", Meaning.WARN)
    assert [t for t, _ in block(Group(("n",), Answer("", 0)))] == ["---- n (1) ----"]


def test_summary_names_each_host_that_did_not_exit_0_and_why() -> None:
    outcomes = {**OUTCOMES,
                "node5": Absent("~/fleet/code/j-1", "`fleet up` of this job puts it there"),
                "node6": TransportError("cannot connect to 10.0.0.6:22: refused"),
                "node7": CommandTimedOut("node7", "sleep 9", 2.0),
                "node8": FleetError("the command's exit status never came back")}
    assert [t for t, _ in summary(outcomes)] == [
        "node4: exit status 1",
        "node5: not run: ~/fleet/code/j-1 is not there (`fleet up` of this job puts it there)",
        "node6: unreachable: cannot connect to 10.0.0.6:22: refused",
        "node7: no answer to sleep 9 after 2.0s (it may still run there)",
        "node8: no answer: the command's exit status never came back",
        "3 of 8 host(s) exited 0"]
    assert summary({"a": Answer("", 0)}) == [("1 of 1 host(s) exited 0", Meaning.OK)]
    same = {n: TransportError("connection refused") for n in ("n1", "n2", "n3")}
    assert [t for t, _ in summary({**same, "n4": Answer("", 2)})] == [
        "n1, n2, n3: unreachable: connection refused", "n4: exit status 2",
        "0 of 4 host(s) exited 0"]  # the same words on three hosts: said once


def test_exit_code_0_when_all_succeeded_1_when_one_failed_3_when_one_gave_no_answer() -> None:
    ok = {"a": Answer("x", 0), "b": Answer("y", 0)}
    assert exit_code(ok) is ExitCode.OK
    assert exit_code({**ok, "c": Answer("x", 2)}) is ExitCode.FAILED
    assert exit_code({**ok, "c": Absent("/d")}) is ExitCode.FAILED
    assert exit_code({**ok, "c": Answer("x", 2), "d": TransportError("gone")}) \
        is ExitCode.UNREACHABLE


def test_hosts_chosen_in_inventory_order_and_an_unknown_name_lists_them() -> None:
    inv = Inventory(Path("inv.toml"), (Host("a", "10.0.0.1"), Host("b", "10.0.0.2")),
                    spares=(Host("s", "10.0.0.3"),))
    assert [h.name for h in chosen(inv, [])] == ["a", "b", "s"]
    assert [h.name for h in chosen(inv, ["s", "a"])] == ["a", "s"]
    with pytest.raises(UsageError,
                       match=r"^--node: no host named zz in inv.toml; its hosts: a, b, s$"):
        chosen(inv, ["a", "zz"])


def test_the_jobs_directory_and_env_are_those_fleet_up_gives_it(tmp_path: Path) -> None:
    job = Job(path=tmp_path / "job.toml", name="j", inventory=tmp_path / "inv.toml",
              workdir=tmp_path, script="t.py", env={"LR": "0.1", "SHARED": "job"},
              data=tmp_path / "data")
    host = Host("a", "10.0.0.1", workdir="~/fleet/", gpus=(1, 3), env={"SHARED": "host"})
    assert job_directory(job, host) == f"~/fleet/code/{job.slot}"
    env, paths = job_env(job, host)
    assert env == {"FLEET_DATA_DIR": f"~/fleet/data/{job.data_slot}",
                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,3",
                   "LR": "0.1", "SHARED": "host"}
    assert paths == {"FLEET_DATA_DIR"}
    assert not any(k.startswith(("MASTER_", "FLEET_RUN", "FLEET_NODE")) for k in env)


def test_a_slurm_cluster_is_refused_with_the_reason(tmp_path: Path) -> None:
    """Through the real CLI: a [slurm] inventory is told apart as `fleet trust` does, and
    refused before anything is connected to."""
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[slurm]\nlogin = "localhost"\nnodes = 2\n')
    r = InProcessCLI(tmp_path)("exec", str(cluster), "--", "hostname")
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert "fleet: error: the slurm backend does not support fleet exec: it runs on the hosts " \
           "of a host list only" in r.stderr
    assert "srun --nodes=N CMD" in r.stderr


def test_no_command_is_a_usage_error(tmp_path: Path) -> None:
    inv = tmp_path / "inv.toml"
    inv.write_text('[[hosts]]\nname = "a"\naddress = "localhost"\n')
    r = InProcessCLI(tmp_path)("exec", str(inv))
    assert r.returncode == 2 and "give the command after --" in r.stderr, r.stderr
