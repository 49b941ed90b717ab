"""Hangs: take every rank's stack on every node (fleet.facts.stacks), say which rank is different,
and keep what was seen in the run's local record. Used by `fleet up`'s watchdog (then the run
is stopped) and by `fleet dump` (the run goes on).

A node's files are copied into the record under names the node chose, and the job (any code
on the node) can choose them: each name is checked, and written only inside the record
(`write_inside`), with sizes and counts bounded."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import secrets
import time
from pathlib import Path

from fleet.console import printable
from fleet.errors import FleetError
from fleet.facts import stacks
from fleet.facts.stacks import FR_TRACE
from fleet.shell import Raw, sh
from fleet.sizes import short
from fleet.transport import Transport
from fleet.transport.group import each, reason
from fleet.waits import named, over

FR_MAX_BYTES = 64 << 20  # a flight recorder dump larger than this stays on its node
FR_NODE_BYTES = 256 << 20  # all of one node's dumps kept by one dump, together
FR_MAX_FILES = 64  # of one node's dumps, one dump keeps at most this many (one per rank)
_FR_NAME = re.compile(re.escape(FR_TRACE) + r"[A-Za-z0-9._-]{1,100}\Z")


def take(nodes: dict[str, tuple[Transport, str]], run_id: str,
         keep: Path | None = None, hung: bool = False) -> tuple[list[str], list[str]]:
    """(the report's lines, per node that could not be asked a line) for the nodes: name ->
    (transport, run dir), in order. NCCL flight recorder dumps are copied under `keep`; what
    was refused is said after the report. `hung`: the watchdog saw silence (the verdict's words
    depend on it)."""

    def one(pair: tuple[Transport, str]) -> tuple[stacks.NodeDump, list[str]]:
        t, run_dir = pair
        d = stacks.dump(t, run_dir, run_id)
        return d, keep_records(t, d, run_dir, keep) if keep is not None else []

    with over("every rank's stack", nodes) as wait:
        results = each(named(nodes.items()), wait.tracked(one))
    done = [r for r in results.values() if isinstance(r, tuple)]
    problems = [f"{name}: could not take its stacks: {reason(r)}"
                for name, r in results.items() if isinstance(r, Exception)]
    return (stacks.report([d for d, _ in done], hung) + [s for _, said in done for s in said],
            problems)


def keep_records(t: Transport, d: stacks.NodeDump, run_dir: str, keep: Path) -> list[str]:
    """Copy a node's NCCL flight recorder dumps from its run dir, read through `t`, to
    keep/flight-recorder/<node>/; returns a line per file not copied, saying why."""
    said = []
    total = 0
    for n, r in enumerate(d.flight_records):
        why = refusal(r, n, total)
        if why is None:
            try:
                # A file may grow after it was listed: read no more than the budget left.
                data = fetch(t, f"{run_dir}/{r.name}", min(FR_MAX_BYTES, FR_NODE_BYTES - total))
                total += len(data)
                write_inside(keep, ("flight-recorder", d.host, r.name), data)
            except (FleetError, OSError, ValueError) as e:
                why = str(e) if isinstance(e, ValueError) else reason(e)
        if why is not None:
            # The name on one line: a newline in it must not start a line of its own.
            said.append(f"{d.host}: flight recorder file \"{printable(r.name)}\" not kept: {why}")
    return said


def refusal(r: stacks.FlightRecord, index: int, total: int) -> str | None:
    """Why a flight recorder file the node listed is not copied (None: it is)."""
    if not _FR_NAME.match(r.name):
        return (f"not a name the flight recorder writes ({FR_TRACE}<rank>: letters, digits, "
                "'.', '_', '-')")
    if r.size is None:
        return "it is a symbolic link"
    if index >= FR_MAX_FILES:
        return f"more than {FR_MAX_FILES} files; it stays on the node"
    if r.size > FR_MAX_BYTES:
        return f"{short(r.size)}, more than {FR_MAX_BYTES >> 20} MiB; it stays on the node"
    if total + r.size > FR_NODE_BYTES:
        return (f"the node's dumps would pass {FR_NODE_BYTES >> 20} MiB together; it stays "
                "on the node")
    return None


def fetch(t: Transport, path: str, limit: int) -> bytes:
    """One regular file from the node (never what a symbolic link points to), as base64 over
    the command channel (SFTP may be missing); ValueError past `limit` bytes."""
    script = sh("[", "-f", path, Raw("] && ["), "!", "-L", path,
                Raw("] || { echo 'not a regular file' >&2; exit 3; };"),
                "head", "-c", limit + 1, path, Raw("| base64"))
    out = t.run(script, timeout=120, what=f"read {path}").check(t.host.name).out
    try:
        data = base64.b64decode("".join(out.split()), validate=True)
    except binascii.Error as e:
        raise ValueError(f"the node's answer is not base64 ({e})") from e
    if len(data) > limit:
        raise ValueError(f"it grew past {short(limit)} (the limit) after it was listed; it "
                         "stays on the node")
    return data


def plain_name(name: str) -> bool:
    """A name that is one entry of a directory: not empty, `.` or `..`, no `/`, NUL or control
    character, at most 255 bytes."""
    return (name not in ("", ".", "..") and "/" not in name and name.isprintable()
            and len(name.encode("utf-8", "surrogateescape")) <= 255)


def write_inside(root: Path, parts: tuple[str, ...], data: bytes) -> Path:
    """Write root/part/.../part with `data`, never outside root: each part must be a plain name,
    no directory on the way may be a symbolic link (each is opened with O_NOFOLLOW, from the one
    before), and the file is written aside (O_EXCL, O_NOFOLLOW) then renamed into place, so that
    a link already there is replaced, never followed. ValueError for a name, OSError else."""
    bad = [p for p in parts if not plain_name(p)]
    if bad or not parts:
        raise ValueError(f"{bad[0] if bad else ''!r} is not a plain file name")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts[:-1]):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                where = root.joinpath(*parts[:i + 1])
                raise OSError(e.errno, f"{where} is not a directory (a symbolic link, or a file, "
                                       "is in the way)") from e
            os.close(fd)
            fd = sub
        name = parts[-1]
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                      dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)
    return root.joinpath(*parts)


def save(record_dir: Path, title: str, lines: list[str]) -> Path:
    """Keep a dump in the run's record: stacks-<time>.txt, as it was printed (what a node said
    made printable: the file is read in a terminal too)."""
    path = record_dir / f"stacks-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    path.write_text(printable(title + "\n" + "\n".join(lines) + "\n", lines=True))
    return path
