"""Files from a node (the engine of `fleet pull`): listed by `ferry list`, compared with what is
here (the same size and sha256: not fetched again; a partial file an interrupted pull left:
only the blocks it lacks), streamed by `ferry send` and written here strictly, as from an
untrusted peer: no more than it listed, nothing through a link here. The pure parts (the
listing's parser, what to ask for, the stream's bound) are in `wanted`."""

from __future__ import annotations

import io
import json
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleet.console import Console, printable
from fleet.errors import TransportError, WorkdirError
from fleet.nodeside import ferry
from fleet.shell import quote
from fleet.transport.base import Pipe, Transport
from fleet.transport.transfer.agent import agent
from fleet.transport.transfer.plan import Held, hash_script, parse_held
from fleet.transport.transfer.progress import Bar
from fleet.transport.transfer.report import LINE_MAX, NodeState, problem_text
from fleet.transport.transfer.wanted import Bound, Want, parse_listing, too_big, wants

FETCH_IDLE_S = 60.0  # a node that sends nothing for this long while fetched from: given up


def fetch(t: Transport, python: str, root: str, wanted: Sequence[Want], dest: Path,
          received: Callable[[int], None] | None = None,
          placed: dict[str, str] | None = None) -> dict[str, str]:
    """The node's files root/rel into dest/rel, streamed by `ferry send` and written here by the
    same Receiver, strictly: a node is untrusted, so no path may leave dest or pass through a
    link there, each file is verified against the hash the node sent, each replaces its
    target only whole, and the stream is held to what was asked (`Bound`: the files wanted,
    each at its listed size, the blocks asked). A Want asks for some blocks only (the rest are
    here). Returns (and fills `placed`, as they land) rel -> sha256 of what was placed; a file
    the node did not send is missing from it. received(n) hears each block's bytes as they
    come. WorkdirError, naming the host, if the stream breaks the protocol (the file it was
    sending then is not kept, not even in part), or names a link in dest; TransportError if
    it stops before its end (what arrived is kept, for the next pull to resume)."""
    mark = f"FERRY-{secrets.token_hex(8)}"
    pipe = t.pipe(agent(python, f"send {quote(root)} {mark}",
                        json.dumps([w.item() for w in wanted])))
    got: dict[str, str] = {} if placed is None else placed
    errors: list[dict[str, object]] = []

    def report(obj: dict[str, object]) -> None:
        ok = obj.get("ok")
        if isinstance(ok, list) and len(ok) == 3:
            got[str(ok[1])] = str(ok[2])
        elif "error" in obj:
            errors.append(obj["error"])  # type: ignore[arg-type]

    recv = ferry.Receiver([str(dest)], 0, report, strict=True,
                          only={(0, w.rel) for w in wanted})
    bound = Bound(list(wanted))
    reader = _PipeReader(pipe)
    idle = threading.Thread(target=reader.watch, args=(FETCH_IDLE_S,), daemon=True)
    idle.start()
    buf = bytearray()
    try:
        while not buf.endswith(mark.encode() + b"\n"):  # rc noise first, bounded
            chunk = reader.read(1)
            if not chunk or len(buf) > LINE_MAX:
                raise WorkdirError(f"{t.host.name}: no files came from {root} "
                                   f"({pipe.err().strip()[-200:] or 'its sender did not start'})")
            buf += chunk
        while True:
            kind, payload = ferry.read_frame(reader.read)
            if not kind:
                raise EOFError("the stream ended before its end" +
                               (f" (nothing for {FETCH_IDLE_S:.0f}s)" if reader.idle else ""))
            bound.check(kind, payload)
            if kind == b"D" and received is not None:
                received(len(payload))
            if not recv.apply(kind, payload):
                break
    except ferry.Linked as e:
        raise WorkdirError(
            f"{printable(e.path)}: a symbolic link on this machine, in the destination of the "
            f"pull from {t.host.name}: fleet writes nothing through a link (remove it, or pull "
            "--to another directory); nothing more was written") from e
    except EOFError as e:  # a lost link: what arrived stays, for the next pull to resume
        raise TransportError(f"{t.host.name}: the files sent from {root} stopped coming "
                             f"({printable(str(e))}); nothing more was written") from e
    except (ferry.Bad, ValueError, TypeError, RecursionError) as e:
        recv.drop()
        raise WorkdirError(f"{t.host.name}: broke the protocol sending files from {root}: "
                           f"{printable(str(e))}; nothing of that file was kept, and nothing "
                           "more was written") from e
    finally:
        reader.done = True
        pipe.close()
    if errors:
        raise WorkdirError(f"{t.host.name}: {problem_text(errors[0])}")
    return got


class _PipeReader:
    """read(n) of exactly what a Pipe gives, buffered; watch() closes the pipe once nothing
    came for a while (a node that stops sending cannot hold fleet)."""

    def __init__(self, pipe: Pipe) -> None:
        self.pipe, self.buf = pipe, bytearray()
        self.last = time.monotonic()
        self.done = self.idle = False

    def watch(self, limit: float) -> None:
        while not self.done:
            time.sleep(min(1.0, limit / 4))
            if not self.done and time.monotonic() - self.last > limit:
                self.idle = True
                self.pipe.close()
                return

    def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.pipe.recv(max(65536, n - len(self.buf)))
            if not chunk:
                break
            self.last = time.monotonic()
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


@dataclass
class Pulled:
    """One node's pull: where it went, the files in place after it (rel -> size), what moved
    (files fetched, bytes that crossed the link, bytes of them already here), the files not
    fetched again, what was left out (notes) and what went wrong (problems)."""

    dest: Path
    files: dict[str, int] = field(default_factory=dict)
    fetched: int = 0
    received: int = 0
    kept: int = 0
    unchanged: int = 0
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def pull(t: Transport, python: str, root: str, rels: list[str], dest: Path,
         console: Console) -> Pulled:
    """The files under root/<each of rels> on the node into dest/<rel>: listed there (links
    not followed), those already here (same size and sha256) left alone, a partial or older
    file completed with only the blocks it lacks, the rest streamed whole, with progress."""
    host = t.host.name
    got = Pulled(dest)
    with console.waiting(f"{host}: listing {', '.join(rels)}"):
        res = t.run(agent(python, f"list {quote(root)}", json.dumps(rels)), timeout=300,
                    what=f"list {root}").check(host)
        listing = parse_listing(res.out, rels)
    if not listing.root:
        got.problems.append(f"{root} is not there (the job's directory)")
        return got
    got.problems += [f"{root}/{m} is not there" for m in listing.missing]
    got.notes += [f"not pulled: {root}/{rel}: {why}" for rel, why in listing.skipped.items()]
    if listing.truncated:
        got.problems.append(f"more than {ferry.LIST_MAX} files under {', '.join(rels)}: name "
                            "fewer paths")
        return got
    if linked := links_in(dest, list(listing.files)):
        got.problems += [f"{printable(p)}: a symbolic link on this machine, in the destination: "
                         "fleet writes nothing through a link (remove it, or pull --to another "
                         "directory); nothing was fetched" for p in linked]
        return got
    dest.mkdir(parents=True, exist_ok=True)
    with console.waiting(f"{host}: comparing {len(listing.files)} file(s) with {dest}"):
        mine = io.StringIO()
        ferry.cmd_hash(str(dest), list(listing.files), mine)
        here = parse_held(mine.getvalue(), set(listing.files))
        there: dict[str, Held] = {}
        if here:
            res = t.run(hash_script(python, root, sorted(here)), timeout=600,
                        what=f"hash {root}").check(host)
            there = parse_held(res.out, set(here))
    todo, same = wants(listing.files, here, there)
    got.unchanged = len(same)
    got.files = {rel: listing.files[rel] for rel in same}
    if todo and (full := too_big(todo, parts_here(dest, [w.rel for w in todo]),
                                 free_in(dest))):
        got.problems += [f"{f} (in {dest}): nothing was fetched" for f in full]
        return got
    if todo:
        total = sum(w.bytes for w in todo)
        state = NodeState(host, expected=total)
        bar = Bar(console, total, {host: state}, [host], label="pulled")

        def received(n: int) -> None:
            state.at += n
            got.received += n
            bar.tick()
        placed: dict[str, str] = {}
        broke = False
        try:
            fetch(t, python, root, todo, dest, received, placed)
        except WorkdirError as e:  # the node was asked, and what it sent is the problem
            got.problems.append(str(e).removeprefix(f"{host}: "))
            broke = True
        finally:
            bar.end()
        for w in todo:
            if w.rel in placed:
                got.fetched += 1
                got.kept += w.size - w.bytes
                got.files[w.rel] = w.size
            elif not broke:
                got.problems.append(f"{root}/{w.rel} changed or went away there while it was "
                                    "pulled (what arrived is kept): pull again")
    return got


def free_in(dest: Path) -> int:
    """The bytes this user may still write where dest is."""
    sv = os.statvfs(dest)
    return sv.f_bavail * sv.f_frsize


def parts_here(dest: Path, rels: list[str]) -> dict[str, int]:
    """rel -> the size of the partial file an interrupted pull left of it here (a resume
    grows it, needing only the rest)."""
    out: dict[str, int] = {}
    for rel in rels:
        try:
            st = os.lstat(dest / ferry.part_name(rel))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[rel] = st.st_size
    return out


def links_in(dest: Path, rels: list[str]) -> list[str]:
    """The symbolic links on the way from dest to each file (or its partial file) here, each
    once: the destination is this machine's, and no file a node sends goes through a link in
    it, nor is one here read through a link to be compared."""
    found: list[str] = []
    for rel in rels:
        for name in (rel, ferry.part_name(rel)):
            try:
                ferry.target(str(dest), name, strict=True)
            except ferry.Linked as e:
                if e.path not in found:
                    found.append(e.path)
                break
    return found
