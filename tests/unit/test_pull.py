"""The pure parts of `fleet pull`: the paths a job or a person may name, the node's listing read
as untrusted input, what to fetch against what is here, `ferry list` itself (links not
followed), and the outputs as `fleet show` prints them."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from fleet.config.job import load_job
from fleet.config.outputs import output_path
from fleet.errors import ConfigError
from fleet.manifest import pulled_of, record_pulled
from fleet.manifest_view import show
from fleet.nodeside import ferry
from fleet.transport.transfer.plan import Held
from fleet.transport.transfer.pull import links_in, parts_here
from fleet.transport.transfer.wanted import (
    Bound,
    Overrun,
    Want,
    parse_listing,
    too_big,
    wants,
)

D = "a" * ferry.DIGEST_HEX
E = "b" * ferry.DIGEST_HEX


@pytest.mark.parametrize("text,rel", [("checkpoints/", "checkpoints"), ("runs//", "runs"),
                                      ("a/b.pt", "a/b.pt")])
def test_output_paths_lose_their_trailing_slash(text: str, rel: str) -> None:
    assert output_path(text) == rel


@pytest.mark.parametrize("text", ["/etc", "../x", "a/../b", ".", "", "/", "a//b", "./a"])
def test_output_paths_that_leave_the_directory_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        output_path(text)


def test_the_job_key_outputs(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    job = tmp_path / "job.toml"
    job.write_text('inventory = "i.toml"\nscript = "t.py"\noutputs = ["checkpoints/", "runs"]\n')
    assert load_job(job).outputs == ("checkpoints", "runs")
    job.write_text('inventory = "i.toml"\nscript = "t.py"\noutputs = ["../up"]\n')
    with pytest.raises(ConfigError, match=r"outputs\[0\]: '../up' must name"):
        load_job(job)


def test_the_listing_takes_only_names_under_what_was_asked() -> None:
    out = "\n".join([
        "NOISE from an rc file",
        json.dumps({"root": True}),
        json.dumps({"file": ["ckpt/a.pt", 10, 1]}),
        json.dumps({"file": ["ckpt/../../etc/passwd", 10, 1]}),
        json.dumps({"file": ["/etc/passwd", 10, 1]}),
        json.dumps({"file": ["other/x", 10, 1]}),
        json.dumps({"file": ["ckpt/neg", -1, 1]}),
        json.dumps({"file": ["ckptx/y", 1, 1]}),
        json.dumps({"missing": "runs"}),
        json.dumps({"skipped": ["ckpt/link", "a symbolic link (not followed)"]}),
    ])
    got = parse_listing(out, ["ckpt", "runs"])
    assert got.root and got.files == {"ckpt/a.pt": 10}
    assert got.missing == ["runs"] and got.skipped == {"ckpt/link": "a symbolic link (not "
                                                                    "followed)"}
    assert not parse_listing("", ["ckpt"]).root


def test_what_to_fetch_against_what_is_here() -> None:
    size = 2 * ferry.BLOCK + 5
    node = Held("file", size, "f" * 64, (D, D, E))
    files = {"new": 3, "same": size, "part": size, "old": size, "odd": size}
    here = {"same": node, "part": Held("part", ferry.BLOCK, "0" * 64, (D,)),
            "old": Held("file", size, "1" * 64, (D, E, E)), "odd": node}
    there = {"same": node, "part": node, "old": node, "odd": Held("part", size, "f" * 64,
                                                                  (D, D, E))}
    todo, same = wants(files, here, there)
    assert same == ["same"]
    by = {w.rel: w for w in todo}
    assert by["new"] == Want("new", 3)  # nothing here: whole
    assert by["odd"].blocks is None  # the node holds only a partial file: whole
    assert by["part"].blocks == (1, 2) and by["part"].bytes == ferry.BLOCK + 5
    assert by["old"].blocks == (1,) and by["old"].item() == {
        "path": "old", "size": size, "blocks": [1], "known": [D, D, E], "sha": "f" * 64}


def test_ferry_list_follows_no_link_and_skips_partial_files(tmp_path: Path) -> None:
    root = tmp_path / "job"
    (root / "ckpt" / "sub").mkdir(parents=True)
    (root / "ckpt" / "a.pt").write_bytes(b"x" * 5)
    (root / "ckpt" / "sub" / "b.pt").write_bytes(b"y")
    (root / "ckpt" / ".c.pt.fleet-part").write_bytes(b"z")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("k")
    os.symlink(secret, root / "ckpt" / "out")
    os.symlink(secret / "key", root / "ckpt" / "key")
    os.symlink(secret, root / "linked")
    out = io.StringIO()
    ferry.cmd_list(str(root), ["ckpt", "linked", "linked/key", "none"], out)
    got = parse_listing(out.getvalue(), ["ckpt", "linked", "none"])
    assert got.root and got.files == {"ckpt/a.pt": 5, "ckpt/sub/b.pt": 1}
    assert got.missing == ["none"]
    assert set(got.skipped) == {"ckpt/out", "ckpt/key", "linked", "linked/key"}
    missing = io.StringIO()
    ferry.cmd_list(str(tmp_path / "gone"), ["ckpt"], missing)
    assert not parse_listing(missing.getvalue(), ["ckpt"]).root


def test_show_lists_the_outputs_as_of_the_last_pull(tmp_path: Path) -> None:
    m = {"run_id": "r1", "job": {"name": "j", "path": "j.toml", "outputs": ["ckpt"]},
         "code": {}, "nodes": {}}
    lines = show(m)
    assert "outputs: ckpt; not pulled yet (`fleet pull r1`)" in lines
    record_pulled(tmp_path, {"node1": (tmp_path / "r1", {"ckpt/a.pt": 3 << 20})})
    lines = show({**m, "pulled": pulled_of(tmp_path)})
    assert "outputs: ckpt" in lines and "    ckpt/a.pt  3.0 MiB" in lines
    assert any(line.startswith("  [node1] pulled ") and line.endswith("1 file(s), 3.0 MiB")
               for line in lines)


# ---- the stream held to what was listed (Bound) -------------------------------------------------
def head(rel: str, size: int, blocks: list[int] | None = None) -> bytes:
    return json.dumps({"root": 0, "path": rel, "size": size, "mode": 0o644, "mtime": 0,
                       "blocks": blocks, "for": [0]}).encode()


def test_bound_takes_what_was_asked_whole_and_in_blocks() -> None:
    size = 2 * ferry.BLOCK + 5
    b = Bound([Want("a", 13), Want("big", size, (2,), (D, D, E), "f" * 64)])
    for kind, payload in [(b"F", head("a", 13)), (b"D", b"x" * 13), (b"E", b"{}"),
                          (b"F", head("big", size, [2])), (b"D", b"y" * 5), (b"E", b"{}"),
                          (b"Z", b"")]:
        b.check(kind, payload)


@pytest.mark.parametrize("frames,words", [
    ([(b"F", head("a", 64 << 20))],
     "it sent more than it listed: a was listed at 13 bytes, and it began sending 64.0 MiB"),
    ([(b"F", head("a", 12))], "it sent a at 12 bytes, not the 13 bytes it listed"),
    ([(b"F", head("a", True))], "it sent a at True, not the 13 bytes it listed"),
    ([(b"F", head("other", 13))], "it sent 'other', which was not asked for"),
    ([(b"F", head("a", 13)), (b"D", b"x" * 13), (b"E", b"{}"), (b"F", head("a", 13))],
     "it sent a twice"),
    ([(b"F", head("a", 13)), (b"X", b"{}"), (b"F", head("a", 13))], "it sent a twice"),
    ([(b"F", head("a", 13, [0]))], "it sent blocks of a that were not asked for"),
    ([(b"F", head("a", 13)), (b"D", b"x" * 13), (b"D", b"x")],
     "it sent more of a than it listed (13 bytes asked for)"),
    ([(b"F", head("a", 13)), (b"D", b"")] + [(b"D", b"")] * 2,
     "it sent more of a than it listed"),
    ([(b"F", head("a", 13)), (b"D", b"x" * 14)],
     "it sent more of a than it listed (a block 0 of 14 bytes, in a file listed at 13 bytes)"),
    ([(b"T", head("a", 13))], "a change of a file's time and mode"),
], ids=["bigger", "smaller", "not a size", "not asked", "twice", "again after giving up",
        "blocks not asked", "a block too many", "empty blocks past the end", "a long block",
        "a touch"])
def test_bound_calls_an_overrun_what_it_is(frames: list[tuple[bytes, bytes]],
                                           words: str) -> None:
    b = Bound([Want("a", 13)])
    with pytest.raises(Overrun, match=re.escape(words)):
        for kind, payload in frames:
            b.check(kind, payload)


def test_bound_costs_nothing_for_a_huge_listed_size() -> None:
    """A node that lists a 1 PiB file does not make the laptop build a list of 2^30 blocks
    (the bound walks a range), and each block costs the same wherever it is in the file."""
    size = 1 << 50
    b = Bound([Want("huge", size)])
    b.check(b"F", head("huge", size))
    for _ in range(3):
        b.check(b"D", b"x" * 7)
    assert b.next == 3 and len(b.blocks) == ferry.blocks_of(size)


def test_a_listed_size_beyond_the_free_space_is_refused_by_name() -> None:
    big = Want("huge", 1 << 50)
    assert too_big([Want("a", 13), big], {}, 1 << 30) == [
        "huge is listed at 1024.0 TiB, more than the 1.0 GiB free here"]
    # what a partial file here already holds is not needed again
    assert too_big([Want("a", 100)], {"a": 60}, 50) == []
    assert too_big([Want("a", 30), Want("b", 30)], {}, 50) == [
        "the 2 files to fetch are listed at 60 bytes in all, more than the 50 bytes free here"]


def test_parts_here_are_regular_files_only(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ferry.part_name("x")).write_bytes(b"1234")
    (tmp_path / ferry.part_name("y")).mkdir()
    assert parts_here(tmp_path, ["d/x", "y", "z"]) == {"d/x": 4}


@pytest.mark.parametrize("frames,words", [
    ([(b"D", b"x")], "data outside a file"),
    ([(b"F", head("a", 13)), (b"F", head("a", 13))], "a file began inside a"),
    ([(b"F", head("a", 13)), (b"Z", b"")], "the stream ended inside a"),
    ([(b"F", b"not json")], "not JSON"),
])
def test_bound_refuses_a_stream_out_of_order(frames: list[tuple[bytes, bytes]],
                                             words: str) -> None:
    b = Bound([Want("a", 13)])
    with pytest.raises(ferry.Bad, match=re.escape(words)):
        for kind, payload in frames:
            b.check(kind, payload)


def test_a_whole_file_is_asked_for_at_its_listed_size(tmp_path: Path,
                                                      capsysbinary: pytest.CaptureFixture[bytes]
                                                      ) -> None:
    """An honest node leaves out a file that grew since it was listed, rather than send it at
    a size the bound would call an overrun."""
    assert Want("a", 13).item() == {"path": "a", "size": 13}
    (tmp_path / "a").write_bytes(b"x" * 20)
    (tmp_path / "b").write_bytes(b"y" * 3)
    ferry.cmd_send(str(tmp_path), "M", [Want("a", 13).item(), Want("b", 3).item()])
    out = capsysbinary.readouterr().out
    assert b'"path":"b"' in out and b'"path":"a"' not in out


def test_the_listing_is_bounded_in_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ferry, "LIST_MAX", 3)
    files = [json.dumps({"file": [f"ckpt/{i}", 1, 1]}) for i in range(5)]
    got = parse_listing("\n".join([json.dumps({"root": True}), *files]), ["ckpt"])
    assert got.truncated and len(got.files) <= 4
    skipped = [json.dumps({"skipped": [f"ckpt/l{i}", "a link"]}) for i in range(5)]
    assert parse_listing("\n".join(skipped), ["ckpt"]).truncated
    # a path "missing" that was not asked for is no line of ferry's
    gone = parse_listing("\n".join([json.dumps({"missing": "ckpt/x"}),
                                    json.dumps({"missing": "ckpt"}),
                                    json.dumps({"missing": "ckpt"})]), ["ckpt"])
    assert gone.missing == ["ckpt"]


# ---- the destination is this machine's: links in it named, never followed -----------------------
def test_links_in_the_destination_are_found(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    (dest / "ok").mkdir(parents=True)
    outside.mkdir()
    (dest / "ckpt").symlink_to(outside)
    (dest / "ok" / "last.pt").symlink_to(outside / "x")
    (dest / "ok" / ".part.pt.fleet-part").symlink_to(outside / "y")
    rels = ["ckpt/a.pt", "ckpt/b.pt", "ok/last.pt", "ok/part.pt", "ok/fine.pt", "new/c.pt"]
    assert links_in(dest, rels) == [f"{dest}/ckpt", f"{dest}/ok/last.pt",
                                    f"{dest}/ok/.part.pt.fleet-part"]
    # The destination itself is the path this machine's user named: a link there is theirs
    linked = tmp_path / "linked"
    linked.symlink_to(dest / "ok")
    assert links_in(linked, ["fine.pt"]) == []


# ---- show: a name from a node forges no line ----------------------------------------------------
def test_show_prints_a_pulled_name_escaped(tmp_path: Path) -> None:
    m = {"run_id": "r1", "job": {"name": "j", "path": "j.toml", "outputs": ["ckpt"]},
         "code": {}, "nodes": {}}
    forged = "    ckpt/forged.pt  1.0 GiB"
    record_pulled(tmp_path, {"node1": (tmp_path / "r1", {f"ckpt/a\n{forged}\n\x1b[2Jb": 1})})
    lines = show({**m, "pulled": pulled_of(tmp_path)})
    assert forged not in "\n".join(lines).splitlines()
    assert f"    ckpt/a^J{forged}^J^[[2Jb  1 bytes" in lines


def test_a_folder_fleet_pull_marked_is_never_synced(tmp_path: Path) -> None:
    """Wherever it sits in the workdir or the data, and whatever .fleetignore says: results
    brought back are not sent to every node again. The mark on the synced root itself (a pull
    `--to` the workdir) leaves nothing out: the job must still be sent."""
    from fleet.backends.hosts import planview
    from fleet.transport import ignore
    from fleet.transport.sync import scan

    root = tmp_path / "w"
    (root / "deep" / "r2").mkdir(parents=True)
    (root / "train.py").write_text("")
    (root / ".fleetignore").write_text("!r1/\n")
    for run in ("r1", "deep/r2"):
        ignore.mark_pulled(root / run, run)
        (root / run / "model.pt").write_text("weights")
    s = scan(root, (), ignore_files=True)
    assert sorted(s.files) == [".fleetignore", "train.py"]
    assert sorted(s.ignored) == [("deep/r2/", ignore.PULLED), ("r1/", ignore.PULLED)]
    assert ignore.counted(s.ignored) == [(ignore.PULLED, ["deep/r2/", "r1/"])]
    assert "  ignored by .fleet-pulled: 2 (deep/r2/, r1/)" in planview.code_lines(s)
    assert sorted(scan(root, ()).files) == sorted(s.files)  # as the data is scanned
    ignore.mark_pulled(root, "r0")
    assert "train.py" in scan(root, (), ignore_files=True).files
    assert "run r1's outputs" in (root / "r1" / ignore.PULLED).read_text()


def test_the_pull_mark_is_never_written_through_a_link(tmp_path: Path) -> None:
    from fleet.transport import ignore

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ignore.PULLED).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        ignore.mark_pulled(tmp_path / "d", "r1")
    assert not (tmp_path / "elsewhere").exists()
