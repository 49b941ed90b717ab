"""Checkpoints that survive their host, without hosts: `[restart] checkpoints` as read from the
file, a node's listing of its checkpoint directory read as untrusted input, which files settled,
what a poll copies where and prunes, which file a restart resumes from; and the keeper itself
on nodes that are this machine (the local transport), each in a directory of its own."""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.backends.hosts.replicate import Keeper
from fleet.config.job import load_job
from fleet.console import Console, Waiting
from fleet.errors import ConfigError
from fleet.facts import checkpoints as fact
from fleet.facts.checkpoints import Seen
from fleet.run import checkpoints as book
from fleet.run.checkpoints import Kept
from fleet.transport.sync import scan
from fleet.waits import Words


def job_file(tmp: Path, restart: str, inventory: str = "") -> Path:
    (tmp / "train.py").write_text("print('hi')\n")
    (tmp / "inv.toml").write_text(inventory or '[[hosts]]\nname = "n1"\naddress = "10.0.0.1"\n')
    path = tmp / "job.toml"
    path.write_text(f'inventory = "inv.toml"\nscript = "train.py"\n[restart]\n{restart}\n')
    return path


# ---- the key ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "kept"), [('"ckpt/"', "ckpt"), ('"./out/ckpt"', "out/ckpt"),
                                             ('"a//b/"', "a/b")])
def test_checkpoints_is_a_directory_inside_the_jobs_own(tmp_path: Path, value: str,
                                                        kept: str) -> None:
    job = load_job(job_file(tmp_path, f"max = 1\ncheckpoints = {value}"))
    assert job.restart.checkpoints == kept
    assert load_job(job_file(tmp_path, "max = 1")).restart.checkpoints == ""


def test_a_local_checkpoint_folder_is_never_sent_over_the_nodes_copies(tmp_path: Path) -> None:
    """The nodes' checkpoints are theirs (and fleet's copies): a folder of that name in the
    laptop's project (a local test run, checkpoints pulled back) is not synced over them."""
    job = load_job(job_file(tmp_path, 'max = 1\ncheckpoints = "out/ckpt"'))
    (tmp_path / "out" / "ckpt").mkdir(parents=True)
    (tmp_path / "out" / "ckpt" / "last.ckpt").write_text("stale")
    (tmp_path / "out" / "notes.txt").write_text("kept")
    sent = scan(tmp_path, job.exclude).manifest
    assert "out/notes.txt" in sent and "train.py" in sent
    assert not any(rel.startswith("out/ckpt") for rel in sent), sent


@pytest.mark.parametrize("value", ['"/ckpt"', '"../ckpt"', '"ckpt/../../x"', '""', '"."',
                                   '"~/ckpt"', "3"])
def test_a_checkpoints_outside_the_jobs_directory_is_refused_naming_file_and_key(
        tmp_path: Path, value: str) -> None:
    path = job_file(tmp_path, f"max = 1\ncheckpoints = {value}")
    with pytest.raises(ConfigError) as e:
        load_job(path)
    assert str(path) in str(e.value) and "restart.checkpoints" in str(e.value), str(e.value)


# ---- a node's listing ---------------------------------------------------------------------------
def lines(*objs: object) -> str:
    return "\n".join(json.dumps(o) for o in objs)


def test_a_listing_takes_only_safe_names_under_the_directory_with_sane_numbers() -> None:
    out = "motd noise\n" + lines(
        {"root": True}, {"file": ["ckpt/epoch=3.ckpt", 412, 1700000000000000000]},
        {"file": ["ckpt/sub/a.pt", 0, 5]},
        {"file": ["ckpt/../etc/passwd", 1, 1]}, {"file": ["/etc/passwd", 1, 1]},
        {"file": ["other/x", 1, 1]}, {"file": ["ckpt", 1, 1]},
        {"file": ["ckpt/neg", -1, 1]}, {"file": ["ckpt/huge", fact.SIZE_MAX + 1, 1]},
        {"file": ["ckpt/flt", 1, 1.5]}, {"file": ["ckpt/bool", True, 1]},
        {"file": ["ckpt/late", 1, fact.MTIME_MAX + 1]},
        {"file": ["ckpt/.x.fleet-part", 1, 1]},
        {"skipped": ["ckpt/link", "a symbolic link (not followed)"]},
        {"file": ["ckpt/a", 1, 1], "extra": 1}, ["file"], "text")
    got = fact.parse(out, "ckpt")
    assert got.there
    assert got.files == {"ckpt/epoch=3.ckpt": Seen(412, 1700000000000000000),
                         "ckpt/sub/a.pt": Seen(0, 5)}
    assert set(got.skipped) == {"ckpt/neg", "ckpt/huge", "ckpt/flt", "ckpt/bool", "ckpt/late",
                                "ckpt/link"}


def test_a_listing_is_bounded_whatever_the_node_says() -> None:
    out = lines(*({"file": [f"ckpt/{i}", 1, 1]} for i in range(fact.FILES_MAX + 50)))
    got = fact.parse(out, "ckpt")
    assert got.truncated and len(got.files) == fact.FILES_MAX
    assert fact.parse(lines({"root": False}, {"missing": "ckpt"}), "ckpt").files == {}


def test_a_file_has_settled_once_two_polls_saw_it_the_same() -> None:
    a, b = Seen(10, 1), Seen(20, 2)
    assert fact.settled(None, {"c/x": a}) == {}
    assert fact.settled({"c/x": a, "c/y": b}, {"c/x": a, "c/y": Seen(30, 3)}) == {"c/x": a}


def test_the_listing_command_names_the_directory_quoted() -> None:
    cmd = fact.command("python3", "/w/code/job 1", "ckpt")
    assert "list '/w/code/job 1'" in cmd and '["ckpt"]' in cmd


# ---- what a poll copies and prunes --------------------------------------------------------------
A, B, C = Seen(100, 10), Seen(100, 20), Seen(100, 30)


def test_a_settled_file_goes_to_every_node_that_lacks_it_newest_first() -> None:
    kept: dict[str, Kept] = {}
    listings = {"n1": {"c/1": A, "c/2": B}, "n2": {}, "s1": {"c/1": A}}
    copies = book.fresh(kept, {"n1": {"c/1": A, "c/2": B}}, listings)
    assert [(c.kept.rel, c.source, c.targets) for c in copies] == [
        ("c/2", "n1", ("n2", "s1")), ("c/1", "n1", ("n2",))]
    assert kept["c/2"].writer == "n1" and kept["c/1"].holders == ["n1", "s1"]


def test_a_copied_file_is_not_copied_again_and_a_failed_one_is_asked_again() -> None:
    kept = {"c/1": Kept("c/1", 100, 10, "n1", "ab" * 32, ["n1", "n2"]),
            "c/2": Kept("c/2", 100, 20, "n1", "", ["n1"])}
    listings = {"n1": {"c/1": A, "c/2": B}, "n2": {"c/1": A}}
    copies = book.fresh(kept, {"n1": listings["n1"], "n2": listings["n2"]}, listings)
    assert [(c.kept.rel, c.source, c.targets) for c in copies] == [("c/2", "n1", ("n2",))]


def test_a_nodes_own_version_is_never_written_over_but_fleets_older_copy_is() -> None:
    kept = {"c/last": Kept("c/last", 100, 10, "n1", "ab" * 32, ["n1", "n2"])}
    listings = {"n1": {"c/last": B}, "n2": {"c/last": A}, "n3": {"c/last": C}}
    copies = book.fresh(kept, {"n1": {"c/last": B}}, listings)
    assert [(c.source, c.targets) for c in copies] == [("n1", ("n2",))]
    assert kept["c/last"].seen == B


def test_what_the_job_prunes_of_its_own_is_pruned_of_fleets_copies() -> None:
    kept = {"c/1": Kept("c/1", 100, 10, "n1", "x", ["n1", "n2", "s1"]),
            "c/2": Kept("c/2", 100, 20, "n1", "x", ["n1", "n2", "s1"]),
            "c/3": Kept("c/3", 100, 30, "n1", "x", ["n1", "n2"])}
    # n1 (which writes the newest) pruned c/1; s1's copy of it was changed by someone else.
    listings = {"n1": {"c/2": B, "c/3": C}, "n2": {"c/1": A, "c/2": B, "c/3": C},
                "s1": {"c/1": Seen(5, 5)}}
    assert book.pruned(kept, listings) == {"c/1": ["n2"]}
    assert set(kept) == {"c/2", "c/3"}
    assert kept["c/2"].holders == ["n1", "n2"]  # s1 lost its copy: forgotten, not pruned


def test_nothing_is_pruned_while_the_writer_cannot_be_asked() -> None:
    kept = {"c/1": Kept("c/1", 100, 10, "n1", "x", ["n1", "n2"]),
            "c/2": Kept("c/2", 100, 20, "n1", "x", ["n1", "n2"])}
    assert book.pruned(kept, {"n2": {"c/1": A, "c/2": B}}) == {}
    assert set(kept) == {"c/1", "c/2"}


def test_a_restart_resumes_from_the_newest_file_a_survivor_holds() -> None:
    kept = {"c/1": Kept("c/1", 100, 10, "n1"), "c/2": Kept("c/2", 100, 20, "n1"),
            "c/3": Kept("c/3", 100, 30, "n1")}
    # c/3 only on the lost n1; n2 holds c/2 at another mtime (not the file fleet saw).
    k, holders = book.newest_held(kept, {"n2": {"c/2": Seen(100, 21), "c/1": A}, "s1": {"c/1": A}})
    assert k is kept["c/1"] and holders == ["n2", "s1"]
    assert book.newest_held(kept, {"n2": {}}) == (None, [])


def test_the_record_reads_back_and_a_damaged_one_reads_as_empty(tmp_path: Path) -> None:
    kept = {"c/1": Kept("c/1", 100, 10, "n1", "ab", ["n1", "n2"])}
    book.save(tmp_path, kept)
    assert book.load(tmp_path) == kept
    (tmp_path / book.FILE).write_text('{"files": [{"rel": 3}]}')
    assert book.load(tmp_path) == {}
    book.save(tmp_path / "absent", kept)  # no record dir: nothing written
    assert not (tmp_path / "absent").exists()


# ---- the keeper, on nodes that are this machine ---------------------------------------------
def local_job(tmp: Path) -> Path:
    inv = "".join(f'[[hosts]]\nname = "{n}"\naddress = "127.0.0.1"\ntransport = "local"\n'
                  f'workdir = "{tmp / n}"\n' + ("spare = true\n" if n == "s1" else "")
                  for n in ("n1", "n2", "s1"))
    return job_file(tmp, 'max = 1\ncheckpoints = "ckpt"', inv)


def ckpt_dir(tmp: Path, node: str, slot: str) -> Path:
    return tmp / node / "code" / slot / "ckpt"


def test_the_keeper_copies_verifies_prunes_and_restores(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state" / "runs" / "r1").mkdir(parents=True)
    job = load_job(local_job(tmp_path))
    out = io.StringIO()
    console = Console(out=out, err=out, live=False)
    waited: list[str] = []  # what a person would have seen waited for, in order
    shown = console.waiting

    @contextlib.contextmanager
    def waiting(text: Words) -> Iterator[Waiting]:
        waited.append(text() if callable(text) else text)
        with shown(text) as w:
            yield w
    monkeypatch.setattr(console, "waiting", waiting)
    k = Keeper(job, console, "r1")
    try:
        k.nodes = k._all()
        n1 = ckpt_dir(tmp_path, "n1", job.slot)
        n1.mkdir(parents=True)
        for i in (1, 2):
            (n1 / f"e{i}.pt").write_bytes(os.urandom(300_000))
            os.chmod(n1 / f"e{i}.pt", 0o4755)  # a set-uid bit on the node is not carried
        (n1 / "e9.pt").symlink_to("/etc/passwd")
        k.poll()
        assert not ckpt_dir(tmp_path, "n2", job.slot).exists()  # not settled yet
        k.poll()
        for node in ("n2", "s1"):
            d = ckpt_dir(tmp_path, node, job.slot)
            assert sorted(os.listdir(d)) == ["e1.pt", "e2.pt"]
            for i in (1, 2):
                assert (d / f"e{i}.pt").read_bytes() == (n1 / f"e{i}.pt").read_bytes()
                assert stat.S_IMODE(os.stat(d / f"e{i}.pt").st_mode) == 0o600
        said = out.getvalue()
        assert "fleet: checkpoint e2.pt (293.0 KiB) from n1 to n2, s1, " in said, said
        record = json.loads((tmp_path / "state" / "runs" / "r1" / book.FILE).read_text())
        assert [f["rel"] for f in record["files"]] == ["ckpt/e1.pt", "ckpt/e2.pt"]
        assert all(len(f["sha256"]) == 64 for f in record["files"])

        (n1 / "e1.pt").unlink()  # the job prunes its own
        k.poll()
        assert sorted(os.listdir(ckpt_dir(tmp_path, "n2", job.slot))) == ["e2.pt"]
        assert waited == []  # the watch, while the job prints, draws no wait

        # n1 is lost, s1 takes its place: s1 is warm, nothing moves.
        k.ready(2, {"n1": "s1"}, ["n1"])
        assert "fleet: checkpoint e2.pt (293.0 KiB) is on every node already\n" in \
            out.getvalue(), out.getvalue()
        # n2 is lost instead, and n1 wrote e3 after the last look: whole once it stays the same
        # a moment after the job's end, it is the newest, and goes to the spare.
        k.pause()
        (n1 / "e3.pt").write_bytes(os.urandom(1000))
        k.ready(2, {"n2": "s1"}, ["n2"])
        assert "fleet: checkpoint e3.pt (1000 bytes) from n1 to s1, " in out.getvalue()
        assert waited[-4:] == [  # before the attempt, each wait says what it waits for
            "waiting: the checkpoints each node holds 0/2 hosts done",
            "checkpoint: files written since the last look, looked at again in 1 s "
            "(unchanged: whole)",
            "waiting: the checkpoints each node holds 0/2 hosts done",
            "checkpoint e3.pt (1000 bytes): copying from n1 to s1"], waited
        # n1 is lost: n2 lacks e3, which comes from s1.
        k.pause()
        k.ready(3, {"n1": "s1"}, ["n1"])
        assert "fleet: checkpoint e3.pt (1000 bytes) from s1 to n2, " in out.getvalue()
        # no survivor holds any: said plainly.
        k.pause()
        for node in ("n2", "s1"):
            for f in ckpt_dir(tmp_path, node, job.slot).iterdir():
                f.unlink()
        k.ready(4, {"n1": "s1"}, ["n1"])
        assert ("fleet: checkpoint: no node left holds one in ckpt/ (the newest fleet saw, "
                "e3.pt, was on n1, n2, s1): attempt 4 starts from scratch\n") in out.getvalue()
    finally:
        k.close()
