"""The pure parts of sharing GPUs: nvidia-smi's and the leases' parsers (node text is untrusted),
the blockers `fleet up --wait` names, `fleet gpus`'s table and JSON, the words for times, `--wait`
taking a value or none; and fleet/nodeside/lease.py itself run here on a scratch directory (the
race between two users is test_e2e_gpus's)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fleet import backends, nodeside
from fleet.backends.base import Options
from fleet.cli.app import optional_values
from fleet.cli.job_commands import wait_seconds
from fleet.config.job import load_job
from fleet.config.select import Selection
from fleet.console import Console
from fleet.errors import UsageError
from fleet.facts.gpus import GPU_SCRIPT, parse_gpus
from fleet.facts.leases import (
    LEASE_DIR,
    MAX_LEASE_S,
    MAX_NAMES,
    MAX_RECORDS,
    Lease,
    LeaseOrder,
    parse_answer,
    parse_gpu_list,
    parse_lease,
)
from fleet.gpuview import as_json, blockers, clock, idle, lease_blockers, rows, span

NOW = 1_795_534_438.0
LEASE = json.dumps({"gpus": [1], "since": NOW - 60, "until": NOW + 3 * 3600, "note": "deadline",
                    "origin": "alice@laptop"})
WHOLE = json.dumps({"gpus": None, "until": NOW + 600})
OUT = f"""Welcome to the lab
me=root
now={NOW:.0f}
=== leases
alice 4243 {NOW:.0f}\t{LEASE}
bob 4244 {NOW:.0f}\t{WHOLE}
carol 4245 {NOW:.0f}\t{json.dumps({"gpus": [0], "until": NOW - 1})}
=== gpus
0, GPU-aaa, 2048, 81559, 0, NVIDIA H100 80GB HBM3
1, GPU-bbb, 18432, 81559, 35, NVIDIA H100 80GB HBM3
=== rc 0
=== apps
GPU-aaa\t100\t2048\troot\t7300\t20261124-101010-job-ab12\tpython train.py
GPU-bbb\t200\t18432\talice\t10800\t\tpython big.py
GPU-zzz\t300\t1\tmallory\t1\t\tnot a GPU of this node
GPU-bbb\t400\t512\t\t\t; rm -rf /\t\x1b[2Jcleared
"""


def test_parse_gpus_reads_use_owner_age_command_run_and_leases() -> None:
    f = parse_gpus(OUT)
    assert f.smi and f.me == "root" and f.now == NOW and f.error == ""
    assert [(g.index, g.used_mib, g.util) for g in f.gpus] == [(0, 2048, 0), (1, 18432, 35)]
    a, b, hidden = f.apps  # GPU-zzz is not this node's: dropped
    assert (a.user, a.age_s, a.command, a.run_id) == ("root", 7300, "python train.py",
                                                      "20261124-101010-job-ab12")
    assert (b.user, b.age_s, b.run_id) == ("alice", 10800, "")
    assert (hidden.user, hidden.age_s, hidden.run_id, hidden.command) == ("", None, "",
                                                                          "?[2Jcleared")
    assert [x.owner for x in f.leases] == ["alice", "bob", "carol"]
    assert [x.owner for x in f.active_leases()] == ["alice", "bob"]  # carol's ended


def test_nvidia_smi_failing_or_missing_is_said_not_raised() -> None:
    mismatch = parse_gpus("me=a\nnow=1\n=== leases\n=== gpus\nFailed to initialize NVML: "
                          "Driver/library version mismatch\nNVML library version: 535.183\n"
                          "=== rc 18\n=== apps\n")
    assert mismatch.smi and mismatch.gpus == ()
    assert mismatch.error.startswith("Failed to initialize NVML: Driver/library version mismatch")
    silent = parse_gpus("me=a\n=== gpus\n=== rc 9\n=== apps\n")
    assert silent.error == "nvidia-smi exited with 9"
    missing = parse_gpus(f"me=a\n=== leases\nUNKNOWN 4244 1\t{WHOLE}\nnvidia-smi=missing\n")
    assert not missing.smi and missing.gpus == () and missing.leases[0].owner == "4244"
    hung = parse_gpus("me=a\n=== gpus\n=== rc 124\n=== apps\n")
    assert hung.error == "nvidia-smi gave no answer in 10 s"


def test_a_lease_cannot_inject_lines_nor_a_gpu_be_listed_twice() -> None:
    # A line break other than \n in a colleague's lease file is data, not a new section.
    evil = OUT.replace(f"\t{WHOLE}", f"\t{WHOLE}\r=== gpus\r7, GPU-aaa, 0, 81559, 0, Phantom")
    f = parse_gpus(evil)
    assert [g.index for g in f.gpus] == [0, 1] and f.error == ""
    twice = parse_gpus(OUT.replace("1, GPU-bbb", "1, GPU-aaa"))
    assert twice.gpus == () and "listed a GPU twice" in twice.error


def test_a_lease_ends_within_a_week_of_its_files_last_change() -> None:
    far = json.dumps({"gpus": None, "until": NOW + 400 * 86400})
    f = parse_gpus(f"me=a\nnow={NOW:.0f}\n=== leases\nbob 1 {NOW:.0f}\t{far}\n")
    assert f.leases[0].until == NOW + 7 * 86400


@pytest.mark.parametrize("owner, text", [
    ("al ice", LEASE), ("../x", LEASE), ("alice", "[1]"), ("alice", "{"),
    ("alice", json.dumps({"gpus": [1], "until": "soon"})),
    ("alice", json.dumps({"gpus": [True], "until": NOW})),
    ("alice", json.dumps({"gpus": [-1], "until": NOW})),
    ("alice", json.dumps({"gpus": [], "until": NOW})),
    ("alice", '{"gpus": null, "until": NaN}'), ("alice", '{"gpus": null, "until": 1e300}'),
    ("alice", "[" * 100000),
])
def test_a_lease_from_a_node_is_checked(owner: str, text: str) -> None:
    assert parse_lease(owner, text) is None


def test_a_leases_note_is_printable_and_bounded() -> None:
    lease = parse_lease("alice", json.dumps({"gpus": [3, 1, 1], "until": NOW,
                                             "note": "M\u00fcller \x1b]0;x\x07" + "n" * 500}))
    assert lease is not None and lease.gpus == (1, 3)
    assert lease.note.startswith("M\u00fcller ?]0;x?") and len(lease.note) == 200


def test_lease_program_answer_after_a_banner() -> None:
    out = "motd {not json\n" + json.dumps({"ok": False, "now": NOW, "conflicts": [
        {"owner": "alice", "gpus": [1], "until": NOW + 60, "note": "x"}, {"owner": 3}]})
    said = parse_answer(out)
    assert not said.ok and [c.owner for c in said.conflicts] == ["alice"]
    assert parse_answer("nothing").error == "the host's lease program gave no answer"


@pytest.mark.parametrize("text, gpus", [("0", (0,)), ("2,0", (0, 2)), ("1-3", (1, 2, 3)),
                                        ("0,0-1", (0, 1)), ("", None), ("3-1", None),
                                        ("a", None), ("0-999", None), ("\u00b2", None)])
def test_gpu_lists(text: str, gpus: tuple[int, ...] | None) -> None:
    assert parse_gpu_list(text) == gpus


def test_spans_and_clock() -> None:
    assert [span(s) for s in (0, 59.6, 61, 3600, 7140, 3 * 3600 + 300, 14 * 3600, 3 * 86400)] == [
        "0 s", "1 min", "1 min", "1 h", "1 h 59 min", "3 h 5 min", "14 h", "3 d"]
    now = time.mktime((2026, 11, 24, 15, 0, 0, 0, 0, -1))
    assert clock(now + 3600, now) == "16:00"
    assert clock(now + 86400, now) == "Wed 15:00"
    assert clock(now + 30 * 86400, now) == "2026-12-24 15:00"


def test_blockers_name_processes_and_other_users_leases() -> None:
    f = parse_gpus(OUT)
    here = NOW + 100  # this machine's clock may differ from the node's: leases end by time left
    lines = [b.line() for b in blockers("node2", (1,), f, here)]
    assert lines[:2] == ["node2 GPU1: 18 GiB, alice, 3 h", "node2 GPU1: 512 MiB, pid 400 (not "
                         "visible here)"]
    assert lines[2].startswith('node2 GPU1: leased by alice until ') and lines[2].endswith(
        '(3 h left): "deadline"')
    assert lines[3].startswith("node2: the whole host: leased by bob until")
    assert "(10 min left)" in lines[3]
    # No GPU chosen: every GPU of the host, and any lease on it.
    assert len(blockers("node2", None, f, here)) == 5
    # root's own lease does not block root; an ended lease blocks nobody.
    mine = parse_gpus(OUT.replace("alice 4243", "root 0").replace("bob 4244", "root 0"))
    assert lease_blockers("node2", (1,), mine, here) == []
    assert [b.line() for b in blockers("node2", (1,), f, here, leases=False)] == lines[:2]


def test_idle_holders_are_flagged() -> None:
    f = parse_gpus(OUT)
    root_app, alice_app, _ = f.apps
    assert idle(root_app, 0)  # 2 GiB for 2 h at 0%
    assert not idle(alice_app, 35)
    assert not idle(root_app, None)  # no utilisation reported: nothing claimed
    table, meanings = rows({"node2": f}, NOW, {"node2/0": NOW - 600})
    row = next(r for r in table if r[5] == "100")
    assert row[8] == ("run 20261124-101010-job-ab12; idle? 0% now, 0% for the 10 min watched")


def test_gpus_table_and_json_say_each_hosts_state() -> None:
    results = {"n1": parse_gpus(OUT), "n2": parse_gpus("me=a\nnvidia-smi=missing\n"),
               "n3": "cannot connect to 10.0.0.3:22: Connection refused"}
    table, meanings = rows(results, NOW)
    assert table[0][:2] == ["n1", "all"] and table[0][8].startswith("leased by bob until")
    assert [table[-2][0], table[-2][1], table[-2][8]] == [
        "n2", "-", "no nvidia-smi here (no NVIDIA GPU)"]
    assert table[-1][8] == "not asked: cannot connect to 10.0.0.3:22: Connection refused"
    doc = as_json(results, NOW)
    n1, n2, n3 = doc["hosts"]
    assert [p["pid"] for g in n1["gpus"] for p in g["processes"]] == [100, 200, 400]
    assert n1["leases"][0]["owner"] == "alice" and n2["nvidia_smi"] is False
    assert n3 == {"host": "n3", "error": "cannot connect to 10.0.0.3:22: Connection refused"}
    json.dumps(doc)


@pytest.mark.parametrize("argv, out", [
    (["up", "--wait", "job.toml"], ["up", "--wait=forever", "job.toml"]),
    (["up", "--wait", "2h", "job.toml"], ["up", "--wait=2h", "job.toml"]),
    (["up", "job.toml", "--wait"], ["up", "job.toml", "--wait=forever"]),
    (["up", "--wait=30m", "job.toml"], ["up", "--wait=30m", "job.toml"]),
    (["up", "job.toml", "--wait", "--", "--wait", "5s"],
     ["up", "job.toml", "--wait=forever", "--", "--wait", "5s"]),
    (["exec", "inv", "--", "sleep", "--wait"], ["exec", "inv", "--", "sleep", "--wait"]),
    (["reserve", "n:1", "--note", "--wait"], ["reserve", "n:1", "--note", "--wait"]),
    (["--debug", "up", "j", "--wait", "--wait"], ["--debug", "up", "j", "--wait=forever",
                                                  "--wait=forever"]),
])
def test_wait_takes_a_duration_or_none(argv: list[str], out: list[str]) -> None:
    assert optional_values(argv) == out


def test_wait_with_a_number_but_no_unit_is_refused() -> None:
    with pytest.raises(UsageError, match="--wait 90: give its unit"):
        optional_values(["up", "job.toml", "--wait", "90"])


def test_wait_seconds() -> None:
    assert wait_seconds(None) is None and wait_seconds("forever") == math.inf
    assert wait_seconds("1.5h") == 5400
    with pytest.raises(UsageError, match="--wait=soon: a duration"):
        wait_seconds("soon")


# ---- fleet/nodeside/lease.py, run here -----------------------------------------------------
def lease(d: Path, action: str, gpus: str, seconds: int = 3600) -> dict[str, object]:
    r = subprocess.run([sys.executable, "-I", "-S", "-c", nodeside.text("lease.py"), str(d),
                        action, gpus, str(seconds), "note", "me@here"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    said: dict[str, object] = json.loads(r.stdout)
    return said


def test_lease_program_takes_replaces_refuses_and_gives_back(tmp_path: Path) -> None:
    d = tmp_path / "leases"
    took = lease(d, "take", "0,1")
    assert took["ok"] is True and oct(d.stat().st_mode & 0o7777) == "0o1777"
    assert len(list(d.glob("*.lease"))) == 1
    again = lease(d, "take", "0,1", 7200)  # names the lease it replaces: fleet drops it
    assert again["ok"] is True and again["replaces"] == [took["name"]]
    assert lease(d, "drop", str(again["replaces"][0]))["ok"] is True  # type: ignore[index]
    [only] = d.glob("*.lease")
    assert only.name == again["name"]
    assert json.loads(only.read_text())["until"] > time.time() + 3600
    # Another user's lease (its file is theirs) refuses an overlapping one.
    other = d / "4243-000000000000.lease"
    other.write_text(json.dumps({"gpus": [2], "until": time.time() + 60, "note": "theirs"}))
    if os.geteuid() == 0:
        os.chown(other, 4243, 4243)
        refused = lease(d, "take", "1-2".replace("-", ","))
        assert refused["ok"] is False and [c["gpus"] for c in refused["conflicts"]] == [[2]]
        assert lease(d, "take", "all")["ok"] is False  # the whole host overlaps it too
    # Giving back GPU 0 keeps a lease of GPU 1.
    gave = lease(d, "give", "0")
    assert gave["ok"] is True and [x["gpus"] for x in gave["released"]] == [[0, 1]]
    mine = [json.loads(p.read_text()) for p in d.glob("*.lease") if p != other]
    assert [x["gpus"] for x in mine] == [[1]]
    assert lease(d, "give", "all")["ok"] is True
    assert [p for p in d.glob("*.lease") if p != other] == []


def test_lease_program_refuses_a_directory_not_shared_and_skips_links(tmp_path: Path) -> None:
    d = tmp_path / "leases"
    d.mkdir(mode=0o755)
    if os.geteuid() == 0:
        os.chown(d, 4243, 4243)  # another user's, not 1777: not fixed behind their back
        said = lease(d, "take", "0")
        assert said["ok"] is False and "not 1777" in str(said["error"])
        os.chown(d, 0, 0)
    os.chmod(d, 0o1777)
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"gpus": [0], "until": time.time() + 60}))
    (d / "1-link.lease").symlink_to(target)
    assert lease(d, "take", "0")["ok"] is True  # a link is no lease
    link = d / "x"
    link.symlink_to(tmp_path)
    said = lease(link, "take", "0")
    assert said["ok"] is False and f"the lease directory {link} is a link (to " in str(
        said["error"]) and f"remove it (`rm {link}`)" in str(said["error"])
    # A colleague's file that is not a lease fleet reads (gpus not a list, an end at infinity)
    # is no lease here either: no crash, no invisible refusal.
    for bad in ('{"gpus": 5, "until": 9e9}', '{"gpus": null, "until": Infinity}',
                '{"gpus": [], "until": 9e9}'):
        (d / "4243-00000000000a.lease").write_text(bad)
        assert lease(d, "take", "all")["ok"] is True
        assert lease(d, "give", "all")["ok"] is True


def test_lease_program_reads_past_empty_files_and_refuses_a_flood(tmp_path: Path) -> None:
    """A colleague's 500 empty *.lease files cost names only: the lease beside them still
    refuses; past MAX_RECORDS files that are not empty, or MAX_NAMES names, nothing is taken
    (a lease may be among what was not read), and a drop (undoing a take) still works."""
    d = tmp_path / "leases"
    d.mkdir(mode=0o1777)
    os.chmod(d, 0o1777)
    for i in range(500):
        (d / f"0-{i:012x}.lease").touch()
    real = d / "4243-000000000000.lease"
    real.write_text(json.dumps({"gpus": [0], "until": time.time() + 3600, "note": "real"}))
    if os.geteuid() == 0:
        os.chown(real, 4243, 4243)
        said = lease(d, "take", "0")
        assert said["ok"] is False and [c["note"] for c in said["conflicts"]] == ["real"]
    for i in range(MAX_RECORDS):
        (d / f"1-{i:012x}.lease").write_text("x")
    said = lease(d, "take", "1")
    assert said["ok"] is False and f"holds over {MAX_RECORDS} *.lease files that are not " \
        "empty: its leases are unknown, so nothing was changed" in str(said["error"])
    assert lease(d, "give", "all")["ok"] is False
    assert lease(d, "drop", "0-000000000000.lease")["ok"] is True
    assert not (d / "0-000000000000.lease").exists()
    for i in range(MAX_NAMES):
        (d / f"2-{i:012x}.lease").touch()
    assert f"holds over {MAX_NAMES} names:" in str(lease(d, "take", "1")["error"])


def test_every_name_counts_toward_the_bound(tmp_path: Path) -> None:
    """Review LOW 11: only *.lease names counted, so ten million other names were walked
    under the lock (the program) or globbed whole before the count began (the listing).
    Both stop at MAX_NAMES names of any kind now."""
    d = tmp_path / "leases"
    d.mkdir(mode=0o1777)
    os.chmod(d, 0o1777)
    (d / "4243-000000000000.lease").write_text(json.dumps({"gpus": [0], "until": NOW}))
    for i in range(MAX_NAMES):
        (d / f"junk-{i}").touch()
    assert f"holds over {MAX_NAMES} names:" in str(lease(d, "take", "1")["error"])
    listed = subprocess.run(["sh", "-c", GPU_SCRIPT.replace(LEASE_DIR, str(d))],
                            capture_output=True, text=True, timeout=120).stdout
    assert "=== leases cut names" in listed and parse_gpus(listed).unknown == \
        f"{LEASE_DIR} holds over {MAX_NAMES} names"
    (d / "junk-0").unlink()
    listed = subprocess.run(["sh", "-c", GPU_SCRIPT.replace(LEASE_DIR, str(d))],
                            capture_output=True, text=True, timeout=120).stdout
    assert "=== leases cut" not in listed and f"\t{json.dumps({'gpus': [0], 'until': NOW})}" \
        in listed, listed[-500:]


def test_lease_program_ends_a_lease_a_week_after_its_ctime_whatever_its_mtime(
        tmp_path: Path) -> None:
    d = tmp_path / "leases"
    d.mkdir(mode=0o1777)
    os.chmod(d, 0o1777)
    far = d / "4243-000000000000.lease"
    far.write_text(json.dumps({"gpus": None, "until": 1_950_000_000}))  # 2031
    os.utime(far, (1_949_000_000, 1_949_000_000))  # `touch -d 2031` sets the mtime only
    if os.geteuid() != 0:
        pytest.skip("another user's lease needs root to chown")
    os.chown(far, 4243, 4243)
    said = lease(d, "take", "0")
    [c] = said["conflicts"]  # type: ignore[misc]
    assert c["until"] <= time.time() + MAX_LEASE_S


def test_leases_not_all_read_are_unknown_and_in_the_way() -> None:
    head = f"me=root\nnow={NOW:.0f}\n=== leases\n"
    cut = parse_gpus(f"{head}alice 4243 {NOW:.0f}\tx\nalice 4243 {NOW:.0f}\t{{}}\n"
                     f"bob 4244 {NOW:.0f}\t[]\n=== leases cut records\nnvidia-smi=missing\n")
    assert cut.unknown == (f"{LEASE_DIR} holds over {MAX_RECORDS} *.lease files that are not "
                           "empty (not leases: 2 of alice, 1 of bob)")
    assert parse_gpus(f"{head}=== leases cut names\n").unknown == \
        f"{LEASE_DIR} holds over {MAX_NAMES} names"
    assert "is a link or no directory" in parse_gpus(f"{head}=== leases bad\n").unknown
    assert parse_gpus(f"{head}=== leases odd\n").unknown == "its lease directory is unreadable"
    assert parse_gpus(OUT).unknown == ""
    [b] = lease_blockers("node2", (1,), cut, NOW)
    assert b.line().startswith("node2: the whole host: its leases are unknown: /var/tmp/")
    table, _ = rows({"node2": cut}, NOW)
    assert table[0][:2] == ["node2", "all"] and table[0][8].startswith("leases unknown: ")
    assert as_json({"node2": cut}, NOW)["hosts"][0]["leases_unknown"] == cut.unknown


def test_the_lease_program_as_shipped_keeps_what_fleet_reads() -> None:
    """lease.py goes to a node bundled with fleet.nodeside.shared.lease_rules, which
    fleet.facts.leases imports too: run as a node gets it, it keeps the records fleet reads,
    with the same end."""
    node: dict[str, Any] = {"__name__": "lease_program"}
    exec(compile(nodeside.text("lease.py"), "fleet-lease", "exec"), node)
    assert "from fleet" not in nodeside.text("lease.py")
    for said in [{"gpus": None, "until": NOW}, {"gpus": [0, 3], "until": NOW + 9e9},
                 {"gpus": [], "until": NOW}, {"gpus": [True], "until": NOW},
                 {"gpus": [1 << 16], "until": NOW}, {"gpus": list(range(257)), "until": NOW},
                 {"gpus": [1.0], "until": NOW}, {"gpus": None, "until": math.inf},
                 {"gpus": None, "until": -1}, {"gpus": None, "until": 1e11},
                 {"gpus": None, "until": True}, {"gpus": None, "until": "1"}, {"gpus": None},
                 {"until": NOW}, [1]]:
        mine = node["valid"](said, NOW)
        theirs = parse_lease("alice", json.dumps(said), NOW)
        assert (mine is None) == (theirs is None), said
        assert mine is None or theirs is None or mine["until"] == theirs.until, said


def test_a_lease_records_what_fleet_reads() -> None:
    text = json.dumps({"gpus": [1], "since": NOW, "until": NOW + 60, "note": "n", "origin": "o"})
    assert parse_lease("alice", text) == Lease("alice", (1,), NOW + 60, NOW, "n", "o")


def test_slurm_refuses_gpu_sharing_with_its_reason(tmp_path: Path) -> None:
    """Slurm allocates a cluster's GPUs itself; its queue already waits."""
    cluster = tmp_path / "cluster.toml"
    cluster.write_text('[slurm]\nlogin = "hpc.example.org"\nnodes = 2\n')
    backend = backends.for_inventory(cluster)
    for call in (lambda: backend.survey(cluster, Selection()),
                 lambda: backend.lease(cluster, "n1", LeaseOrder.take((0,), 60))):
        with pytest.raises(UsageError, match="Slurm allocates a cluster's GPUs itself"):
            call()
    job = tmp_path / "job.toml"
    job.write_text('inventory = "cluster.toml"\nscript = "x.py"\n')
    (tmp_path / "x.py").write_text("")
    with pytest.raises(UsageError, match="--wait is for host lists: on Slurm the queue"):
        backend.prepare(load_job(job), Console(), Options(wait=60.0))
