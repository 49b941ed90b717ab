"""Take or give back a GPU lease on this host (fleet reserve / fleet release): under an flock of
the lease directory's lock file, read every lease, refuse one that another user's active lease
overlaps, else write it (a temporary file renamed into place: readers never see half of one).
Prints one JSON line. Standard library only, Python 3.8+.

argv: DIR take|give GPUS SECONDS NOTE ORIGIN -- GPUS "all" (the whole host) or "0,2"."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import secrets
import stat
import sys
import time
from typing import Any, NoReturn

LOCK_WAIT_S = 10.0
MAX_FILES = 500


def answer(**said: Any) -> NoReturn:
    print(json.dumps(said), flush=True)
    sys.exit(0)


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def shared_dir(path: str) -> None:
    """The lease directory: made world-writable and sticky (like /tmp: everyone writes, only a
    file's owner removes it) where missing; refused where it is a link or not shared."""
    try:
        os.mkdir(path, 0o1777)
        os.chmod(path, 0o1777)  # the umask took bits off
    except OSError as e:
        if e.errno != errno.EEXIST:
            answer(ok=False, error=f"cannot make {path}: {e.strerror}")
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        answer(ok=False, error=f"{path} is not a directory")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o1777 != 0o1777:
        if st.st_uid == os.geteuid():
            os.chmod(path, 0o1777)
        else:
            answer(ok=False, error=f"{path} (owner {owner_name(st.st_uid)}) has mode {mode:o}, "
                   "not 1777: other users could not lease here; its owner or root can "
                   f"`chmod 1777 {path}`")


def lock(path: str) -> int:
    fd = os.open(os.path.join(path, ".lock"), os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                answer(ok=False, error=f"the lease lock {path}/.lock is held by another "
                       f"process for over {LOCK_WAIT_S:.0f}s")
            time.sleep(0.05)


def leases(path: str) -> list[tuple[str, int, dict[str, Any]]]:
    """Every lease file here: (file name, owner, the lease's JSON as a dict)."""
    out = []
    for name in sorted(os.listdir(path))[:MAX_FILES]:
        if not name.endswith(".lease"):
            continue
        full = os.path.join(path, name)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                said = json.loads(f.read(4096).decode("utf-8", "replace"))
            except ValueError:
                continue
        if isinstance(said, dict):
            said["owner"] = owner_name(st.st_uid)
            out.append((name, st.st_uid, said))
    return out


def covers(said: dict[str, Any], gpus: list[int] | None) -> bool:
    mine = said.get("gpus")
    return mine is None or gpus is None or bool(set(mine) & set(gpus))


def active(said: dict[str, Any], now: float) -> bool:
    until = said.get("until")
    return isinstance(until, (int, float)) and until > now


def write(path: str, record: dict[str, Any]) -> None:
    name = f"{os.geteuid()}-{secrets.token_hex(6)}.lease"
    tmp = os.path.join(path, ".tmp-" + name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(path, name))


def public(said: dict[str, Any]) -> dict[str, Any]:
    return {k: said.get(k) for k in ("owner", "gpus", "until", "since", "note", "origin")}


def main() -> None:
    path, action, which, seconds, note, origin = sys.argv[1:7]
    gpus = None if which == "all" else sorted({int(x) for x in which.split(",")})
    shared_dir(path)
    fd = lock(path)
    now = time.time()
    me = os.geteuid()
    every = leases(path)
    for name, uid, said in every:
        if uid == me and not active(said, now):
            os.unlink(os.path.join(path, name))  # one's own ended leases: tidied while here
    live = [(n, u, s) for n, u, s in every if active(s, now)]
    if action == "take":
        theirs = [s for _, u, s in live if u != me and covers(s, gpus)]
        if theirs:
            answer(ok=False, now=now, conflicts=[public(s) for s in theirs])
        record = {"gpus": gpus, "since": now, "until": now + float(seconds), "note": note,
                  "origin": origin}
        write(path, record)
        for name, uid, said in live:  # a lease again on the same GPUs: the new one replaces it
            if uid == me and (said.get("gpus") == gpus or (gpus is not None and said.get("gpus")
                              is not None and set(said["gpus"]) <= set(gpus))):
                os.unlink(os.path.join(path, name))
        record["owner"] = owner_name(me)
        answer(ok=True, now=now, lease=[public(record)])
    released = []
    for name, uid, said in live:
        if uid != me or not covers(said, gpus):
            continue
        left = [] if gpus is None or said.get("gpus") is None else \
            [g for g in said["gpus"] if g not in gpus]
        if left:
            write(path, dict(said, gpus=left))
        os.unlink(os.path.join(path, name))
        released.append(public(said))
    kept = [public(s) for _, u, s in live if u != me and covers(s, gpus)]
    os.close(fd)
    answer(ok=True, now=now, released=released, kept=kept)


if __name__ == "__main__":
    main()
