"""Take, give back or drop GPU leases on this host (fleet reserve / fleet release): under an
flock of the lease directory itself, read every lease, refuse one that another user's active
lease overlaps, else write it (a temporary file renamed into place: readers never see half of
one). Prints one JSON line, whatever happens. Standard library only, Python 3.8+.

argv: DIR take GPUS SECONDS NOTE ORIGIN [RUN] | DIR give GPUS | DIR drop NAME... -- GPUS "all"
(the whole host) or "0,2"; take answers the new lease's file name and the names of the caller's
leases it would replace, which the caller drops once every host took its lease (so a refusal
elsewhere, undone by dropping the new one, loses nothing held before). With RUN (a run id), a
run lease: held for that run while it runs (`fleet up`'s placement, a queue's agent), refused
where any active run lease (the caller's too) or another user's active lease overlaps it, and
never replaced by a take."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import pwd
import secrets
import stat
import sys
import time
from typing import Any, NoReturn

from fleet.nodeside.shared.lease_rules import (
    LEASE_FILE,
    MAX_LEASE_S,
    MAX_NAMES,
    MAX_RECORDS,
    lease_end,
    lease_gpus,
    lease_run,
    lease_time,
)

LOCK_WAIT_S = 5.0  # fleet's own reserve holds the lock for well under a second


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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except NotADirectoryError:
        answer(ok=False, error=not_a_directory(path))
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o1777 != 0o1777:
        if st.st_uid != os.geteuid():
            answer(ok=False, error=f"{path} (owner {owner_name(st.st_uid)}) has mode {mode:o}, "
                   "not 1777: other users could not lease here; root can `install -d -m 1777 "
                   f"-o root {path}`")
        os.fchmod(fd, 0o1777)
    return fd


def not_a_directory(path: str) -> str:
    """Why `path` (there, and no directory to open without following a link) cannot hold leases,
    and what fixes it."""
    try:
        st = os.lstat(path)
        what = (f"a link (to {os.readlink(path)[:60]!r})" if stat.S_ISLNK(st.st_mode)
                else "not a directory")
        whose = f"its owner {owner_name(st.st_uid)} or root"
    except OSError:
        what, whose = "not a directory", "root"
    return (f"the lease directory {path} is {what}: fleet keeps leases only in a directory of "
            f"its own; {whose} can remove it (`rm {path}`), then the next fleet reserve makes "
            "the directory")


def lock_holders(fd: int) -> str:
    """Who holds an flock on the directory open as `fd`, from /proc/locks (pid, its owner and
    command, where this host shows them), "" where it does not say."""
    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", "rb") as f:
            text = f.read(1 << 20).decode("ascii", "replace")
    except OSError:
        return ""
    found = []
    for line in text.split("\n"):
        words = line.split()
        # "1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF" (a waiter's line has "->" first)
        if len(words) >= 6 and words[1] == "FLOCK" and words[5] == where and \
                words[4].isdigit() and words[4] != "0":
            pid = words[4]
            try:
                user = owner_name(os.stat(f"/proc/{pid}").st_uid)
                with open(f"/proc/{pid}/comm", "rb") as c:
                    comm = c.read(64).decode("ascii", "replace").strip()
                found.append(f"pid {pid} of {user} ({comm})")
            except OSError:
                found.append(f"pid {pid}")
    return ", ".join(sorted(set(found))[:3])


def lock(fd: int, path: str) -> None:
    """An flock of the directory itself: no file anyone could replace, fill or make a FIFO.
    Anyone who can read the directory can hold one too: the wait is bounded, then the holder
    is named."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                who = lock_holders(fd)
                answer(ok=False, error=f"the lease directory {path} stayed locked for over "
                       f"{LOCK_WAIT_S:.0f} s, by {who or 'a process this host does not name'}"
                       " (fleet's own reserve holds it for under a second): ask its owner to "
                       "end it")
            time.sleep(0.05)


def valid(said: Any, changed: float) -> dict[str, Any] | None:
    """A lease's record as fleet.facts.leases.parse_lease accepts one (its end no later than a
    week after its file's last status change, `changed`); None for anything else."""
    if not isinstance(said, dict) or lease_gpus(said.get("gpus")) is False:
        return None
    until = lease_time(said.get("until"))
    return None if until is None else dict(said, until=lease_end(until, changed))


class Flooded(Exception):
    """More in the lease directory than fleet reads: its leases are unknown."""


def leases(path: str) -> list[tuple[str, int, dict[str, Any]]]:
    """Every lease here that fleet reads too (regular files named *.lease, no dot file, no
    link): (file name, owner uid, the lease, its owner named). Flooded past MAX_NAMES names
    of any kind (so that no pile of other names is walked under the lock) or MAX_RECORDS
    records (empty files cost only a name), whoever's they are."""
    out = []
    names = records = 0
    with os.scandir(path) as entries:
        for entry in entries:
            names += 1
            if names > MAX_NAMES:
                raise Flooded(f"over {MAX_NAMES} names")
            name = entry.name
            if not name.endswith(".lease") or name.startswith("."):
                continue
            try:
                # An empty file or anything but a file costs no open (checked again once open)
                if not entry.is_file(follow_symlinks=False) or \
                        entry.stat(follow_symlinks=False).st_size == 0:
                    continue
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
                    continue
                records += 1
                if records > MAX_RECORDS:
                    raise Flooded(f"over {MAX_RECORDS} *.lease files that are not empty")
                try:
                    said = valid(json.loads(f.read(4096).decode("ascii")), st.st_ctime)
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
    """A lease as the answer shows it; "run" only where it is a run lease."""
    run = lease_run(said.get("run"))
    return dict({k: said.get(k) for k in ("owner", "gpus", "until", "since", "note", "origin")},
                **({"run": run} if run else {}))


def tidy(path: str, every: list[tuple[str, int, dict[str, Any]]], now: float) -> None:
    """The caller's own leases that ended, and its temporary files left by a write cut short."""
    me = os.geteuid()
    for name, uid, said in every:
        if uid == me and said["until"] <= now:
            os.unlink(os.path.join(path, name))
    with os.scandir(path) as entries:  # bounded, as leases() found it a moment ago
        names = [e.name for e in itertools.islice(entries, MAX_NAMES)]
    for name in names:
        if name.startswith(f".tmp-{me}-"):
            full = os.path.join(path, name)
            if os.lstat(full).st_mtime < now - 60:
                os.unlink(full)


def main() -> None:
    path, action, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    fd = shared_dir(path)
    lock(fd, path)
    now, me = time.time(), os.geteuid()
    if action == "drop":  # the caller's own leases, by name (undoing or finishing a take)
        for name in args:
            full = os.path.join(path, name)
            if LEASE_FILE.fullmatch(name) and os.path.lexists(full) and os.lstat(full).st_uid == me:
                os.unlink(full)
        answer(ok=True, now=now)
    try:
        every = leases(path)
    except Flooded as e:
        # Fail closed: a colleague's lease may be among what was not read.
        answer(ok=False, now=now, error=f"the lease directory {path} holds {e}: its leases "
               f"are unknown, so nothing was changed; their owners (ls -ln {path}) or root "
               "can remove what is not a lease")
    tidy(path, every, now)
    live = [(n, u, s) for n, u, s in every if s["until"] > now]
    gpus = None if args[0] == "all" else sorted({int(x) for x in args[0].split(",")})
    if action == "take":
        seconds, note, origin = float(args[1]), args[2], args[3]
        run = args[4] if len(args) > 4 else ""
        if run and not lease_run(run):
            answer(ok=False, now=now, error=f"{run[:60]!r} is not a run id")
        theirs = [s for _, u, s in live if (u != me or (run and lease_run(s.get("run"))))
                  and covers(s, gpus)]
        if theirs:
            answer(ok=False, now=now, conflicts=[public(s) for s in theirs])
        record = {"gpus": gpus, "since": now, "until": now + min(seconds, MAX_LEASE_S),
                  "note": note, "origin": origin, **({"run": run} if run else {})}
        name = write(path, record)
        # A run lease replaces nothing, and nothing replaces one: it goes with its run.
        replaces = [] if run else [
            n for n, u, s in live if u == me and not lease_run(s.get("run")) and (
                s["gpus"] == gpus or (gpus is not None and s["gpus"] is not None
                                      and set(s["gpus"]) <= set(gpus)))]
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
