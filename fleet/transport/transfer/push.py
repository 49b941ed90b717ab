"""Directories to nodes: what each lacks hashed there and here, then streamed (relay.Transfer);
and one directory to one node (the Slurm login node), streamed or in one bundle."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from pathlib import Path

from fleet.console import Console
from fleet.errors import RemoteCommandError, WorkdirError, host_error
from fleet.nodeside import ferry
from fleet.transport.base import Transport
from fleet.transport.group import each
from fleet.transport.sync import (
    Scan,
    SyncStats,
    changed,
    code_entries,
    listing_script,
    parse_listing,
    send,
)
from fleet.transport.transfer.plan import (
    Dir,
    Held,
    Local,
    Move,
    Moved,
    candidates,
    held_script,
    moved_per_node,
    need,
    parse_helds,
    plan_moves,
    streams,
)
from fleet.transport.transfer.relay import Outcome, Target, Transfer


def local_file(rel: str, path: Path, with_hashes: bool) -> Local:
    """A file here as the stream sends it, hashed (whole and per block) `with_hashes`: where a
    node holds a version to compare with."""
    st = os.stat(path)
    lf = Local(rel, path, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    if with_hashes:
        size, sha, blocks = _hashes(str(path))
        after = os.stat(path)
        if size != st.st_size or (after.st_size, after.st_mtime_ns) != (size, st.st_mtime_ns):
            raise WorkdirError(f"{path}: changed while fleet read it; start again once it is "
                               "written")
        lf = Local(rel, path, size, st.st_mtime_ns, lf.mode, sha, tuple(blocks))
    return lf


def _hashes(path: str) -> tuple[int, str, list[str]]:
    """ferry.hash_file, the whole file's sha256 in a thread of its own beside the block digests
    (hashlib lets go of the GIL): one pass's time where a core is free."""
    whole: list[str | OSError] = []

    def sha() -> None:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while b := f.read(ferry.BLOCK):
                    h.update(b)
            whole.append(h.hexdigest())
        except OSError as e:
            whole.append(e)
    th = threading.Thread(target=sha, daemon=True, name="hash-whole")
    th.start()
    try:
        size, _, blocks = ferry.hash_file(path, 0, whole_sha=False)
    finally:
        th.join()
    if isinstance(whole[0], OSError):
        raise whole[0]
    return size, whole[0], blocks


def move(nodes: list[Target], dirs: list[Dir], console: Console) -> tuple[Outcome, list[Move]]:
    """Makes every node hold what `dirs` says it gets; see fleet.transport.transfer's docstring."""
    asks = {tg.name: [(tg.roots[k], candidates(d.rels.get(tg.name, []),
                                              d.there.get(tg.name, {})))
                      for k, d in enumerate(dirs)] for tg in nodes}
    asking = [tg for tg in nodes if any(rels for _, rels in asks[tg.name])]
    hashed: set[tuple[int, str]] = {(k, r) for tg in asking
                                    for k, (_, rels) in enumerate(asks[tg.name]) for r in rels}
    locals_: dict[tuple[int, str], Local] = {}
    problem: list[BaseException] = []

    def here() -> None:
        try:
            for k, d in enumerate(dirs):
                for rel in sorted({r for rels in d.rels.values() for r in rels}):
                    path = d.scan.files[rel]
                    try:
                        locals_[(k, rel)] = local_file(rel, path, (k, rel) in hashed)
                    except OSError as e:
                        raise WorkdirError(
                            f"{path}: cannot be read any more ({e.strerror or e}); nothing "
                            "was started: make it readable, or leave it out with `exclude`"
                        ) from e
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            problem.append(e)
    th = threading.Thread(target=here, daemon=True)
    th.start()

    def ask(tg: Target) -> list[dict[str, Held]]:
        r = tg.t.run(held_script(tg.python, asks[tg.name]), timeout=None,
                     what="hash what is there")
        r.check(tg.name)
        return parse_helds(r.out, asks[tg.name])
    results: dict[str, list[dict[str, Held]] | Exception] = each(
        ((tg.name, tg) for tg in asking), ask)
    bad = {n: r for n, r in results.items() if isinstance(r, Exception)}
    th.join()
    if problem:
        raise problem[0]
    if bad:
        raise host_error("hashing what the nodes hold", bad)
    held = {n: r for n, r in results.items() if not isinstance(r, Exception)}
    order = {tg.name: i for i, tg in enumerate(nodes)}
    files = []
    for (k, rel), lf in sorted(locals_.items()):
        needs = {order[tg.name]: need(lf, held[tg.name][k].get(rel) if tg.name in held else None)
                 for tg in nodes if rel in dirs[k].rels.get(tg.name, ())}
        files.append((k, lf, needs))
    moves = plan_moves(files)
    outcome = Transfer(nodes, moves, console).run() if moves else Outcome()
    for (i, root), m in moved_per_node(moves).items():
        outcome.moved.setdefault(nodes[i].name, {})[root] = m
    return outcome, moves


# ---- one directory to one node (the Slurm login node) -----------------------------------------
def sync_dir(t: Transport, python: str, scan: Scan, dest: str, tag: str,
             console: Console) -> SyncStats:
    """Make `dest` on the node hold every file of the scan (extra files there are kept): one
    listing, then what changed streamed (streams()) or in one bundle."""
    r = t.run(listing_script([dest]), what=f"list {dest}")
    if not r.ok:
        raise RemoteCommandError(t.host.name, f"list {dest}", r.code, r.err)
    there = parse_listing(r.out, 1)[0]
    rels = changed(scan.manifest, there)
    size = sum(scan.manifest[rel][0] for rel in rels)
    if not streams(size, any(ferry.part_name(rel) in there for rel in rels)):
        if rels:
            send(t, code_entries(scan, dest, rels), tag)
        return SyncStats(len(rels), size, len(scan.manifest) - len(rels))
    name, root = t.host.name, t.path(dest)
    out, _ = move([Target(name, t, python, t.host.address, (root,))],
                  [Dir(scan, {name: root}, {name: there}, {name: rels})], console)
    m = out.moved.get(name, {}).get(0, Moved())
    return SyncStats(m.files, m.sent, len(scan.manifest) - m.files)
