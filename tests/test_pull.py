"""The pure parts of `fleet pull`: the paths a job or a person may name, the node's listing read
as untrusted input, what to fetch against what is here, `ferry list` itself (links not
followed), and the outputs as `fleet show` prints them."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from fleet.config.job import load_job
from fleet.config.outputs import output_path
from fleet.errors import ConfigError
from fleet.manifest import pulled_of, record_pulled
from fleet.manifest_view import show
from fleet.nodeside import ferry
from fleet.transport.transfer.plan import Held
from fleet.transport.transfer.wanted import Want, parse_listing, wants

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
