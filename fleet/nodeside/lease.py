"""Take, give back or drop GPU leases on this host (fleet reserve / fleet release): under an
flock of the lease directory itself, read every lease, refuse one that another user's active
lease overlaps, else write it (a temporary file renamed into place: readers never see half of
one). Prints one JSON line, whatever happens. Standard library only, Python 3.8+.

argv: DIR take GPUS SECONDS NOTE ORIGIN | DIR give GPUS | DIR drop NAME... -- GPUS "all" (the
whole host) or "0,2"; take answers the new lease's file name and the names of the caller's
leases it would replace, which the caller drops once every host took its lease (so a refusal
elsewhere, undone by dropping the new one, loses nothing held before)."""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import pwd
import re
import secrets
import stat
import sys
import time
from typing import Any, NoReturn

LOCK_WAIT_S = 10.0
MAX_FILES = 500
MAX_LEASE_S = 7 * 86400  # a lease ends within a week of its file's last change, whatever it says
NAME = re.compile(r"[0-9]{1,10}-[0-9a-f]{12}\.lease")


def answer(**said: Any) -> NoReturn:
    print(json.dumps(said), flush=True)
    sys.exit(0)


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def shared_dir(path: str) -> int:
    """The lease directory, open (its descriptor is the lock): made world-writable and sticky
    (like /tmp: everyone writes, only a file's owner removes it) where missing; refused where it
    is a link or not shared."""
    try:
        os.mkdir(path, 0o1777)
        os.chmod(path, 0o1777)  # the umask took bits off
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o1777 != 0o1777:
        if st.st_uid != os.geteuid():
            answer(ok=False, error=f"{path} (owner {owner_name(st.st_uid)}) has mode {mode:o}, "
                   "not 1777: other users could not lease here; root can `install -d -m 1777 "
                   f"-o root {path}`")
        os.fchmod(fd, 0o1777)
    return fd


def lock(fd: int, path: str) -> None:
    """An flock of the directory itself: no file anyone could replace, fill or make a FIFO."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                answer(ok=False, error=f"the lease directory {path} stayed locked for over "
                       f"{LOCK_WAIT_S:.0f}s (another user's fleet reserve holding it)")
            time.sleep(0.05)


def valid(said: Any, mtime: float) -> dict[str, Any] | None:
    """A lease's record as fleet.facts.leases.parse_lease accepts one (its end no later than a
    week after its file last changed); None for anything else."""
    if not isinstance(said, dict):
        return None
    gpus, until = said.get("gpus"), said.get("until")
    if gpus is not None and not (isinstance(gpus, list) and 0 < len(gpus) <= 256 and all(
            type(g) is int and 0 <= g < 1 << 16 for g in gpus)):
        return None
    if isinstance(until, bool) or not isinstance(until, (int, float)) or not (
            math.isfinite(until) and 0 <= until < 1e11):
        return None
    return dict(said, until=min(float(until), mtime + MAX_LEASE_S))


def leases(path: str) -> list[tuple[str, int, dict[str, Any]]]:
    """Every lease here that fleet reads too (regular files named *.lease, no dot file, no
    link): (file name, owner uid, the lease, its owner named)."""
    names = sorted(n for n in os.listdir(path) if n.endswith(".lease") and not n.startswith("."))
    out = []
    for name in names[:MAX_FILES]:
        try:
            fd = os.open(os.path.join(path, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                said = valid(json.loads(f.read(4096).decode("ascii")), st.st_mtime)
            except ValueError:
                continue
        if said is not None:
            said["owner"] = owner_name(st.st_uid)
            out.append((name, st.st_uid, said))
    return out


def covers(said: dict[str, Any], gpus: list[int] | None) -> bool:
    mine = said.get("gpus")
    return mine is None or gpus is None or bool(set(mine) & set(gpus))


def write(path: str, record: dict[str, Any]) -> str:
    name = f"{os.geteuid()}-{secrets.token_hex(6)}.lease"
    tmp = os.path.join(path, ".tmp-" + name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(path, name))
    return name


def public(said: dict[str, Any]) -> dict[str, Any]:
    return {k: said.get(k) for k in ("owner", "gpus", "until", "since", "note", "origin")}


def tidy(path: str, every: list[tuple[str, int, dict[str, Any]]], now: float) -> None:
    """The caller's own leases that ended, and its temporary files left by a write cut short."""
    me = os.geteuid()
    for name, uid, said in every:
        if uid == me and said["until"] <= now:
            os.unlink(os.path.join(path, name))
    for name in os.listdir(path):
        if name.startswith(f".tmp-{me}-"):
            full = os.path.join(path, name)
            if os.lstat(full).st_mtime < now - 60:
                os.unlink(full)


def main() -> None:
    path, action, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    fd = shared_dir(path)
    lock(fd, path)
    now, me = time.time(), os.geteuid()
    every = leases(path)
    tidy(path, every, now)
    live = [(n, u, s) for n, u, s in every if s["until"] > now]
    if action == "drop":  # the caller's own leases, by name (undoing or finishing a take)
        for name in args:
            full = os.path.join(path, name)
            if NAME.fullmatch(name) and os.path.lexists(full) and os.lstat(full).st_uid == me:
                os.unlink(full)
        answer(ok=True, now=now)
    gpus = None if args[0] == "all" else sorted({int(x) for x in args[0].split(",")})
    if action == "take":
        seconds, note, origin = float(args[1]), args[2], args[3]
        theirs = [s for _, u, s in live if u != me and covers(s, gpus)]
        if theirs:
            answer(ok=False, now=now, conflicts=[public(s) for s in theirs])
        record = {"gpus": gpus, "since": now, "until": now + min(seconds, MAX_LEASE_S),
                  "note": note, "origin": origin}
        name = write(path, record)
        replaces = [n for n, u, s in live if u == me and (s["gpus"] == gpus or (
            gpus is not None and s["gpus"] is not None and set(s["gpus"]) <= set(gpus)))]
        record["owner"] = owner_name(me)
        answer(ok=True, now=now, lease=[public(record)], name=name, replaces=replaces)
    released = []
    for name, uid, said in live:
        # A GPU given back is taken out of a lease of GPUs; a whole-host lease goes only when
        # the whole host is given back.
        if uid != me or (said["gpus"] is None and gpus is not None) or not covers(said, gpus):
            continue
        left = [] if gpus is None else [g for g in said["gpus"] if g not in gpus]
        if left:
            write(path, {k: v for k, v in dict(said, gpus=left).items() if k != "owner"})
        os.unlink(os.path.join(path, name))
        released.append(public(said))
    kept = [public(s) for _, u, s in live if u != me and covers(s, gpus)]
    answer(ok=True, now=now, released=released, kept=kept)


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, IndexError) as e:
        answer(ok=False, error=f"{sys.argv[1] if len(sys.argv) > 1 else 'lease'}: "
               f"{type(e).__name__}: {e}")
