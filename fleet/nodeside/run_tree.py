"""The run's processes by descent, recorded in the run directory's `procs` while they live: a
process that sheds the run's variables and its session (`setsid env -u FLEET_ATTEMPT_ID -u
FLEET_RUN_ID ...`), or whose parent ends so that it is re-parented to PID 1, keeps no link to
the run but this record. Every
TICK_S the process tree is read; each process of this user whose parent is the wrapper or one
recorded before (the same pid with the same start time: a pid may be reused) is appended as a
line `<pid> <start>` (start time in clock ticks since boot, field 22 of /proc/PID/stat); the
first line is the wrapper itself, whose start time is the run's (run_pids.sh checks every pid
against it). It ends once no recorded process is alive. argv: the run directory, the wrapper's
pid."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable

TICK_S = 0.25
COMPACT_AFTER = 10000  # lines appended before the record is rewritten with the living only


def parse_stat(text: str) -> tuple[int, int, int] | None:
    """(pid, parent pid, start time) from the text of /proc/PID/stat, None if it is not one.
    The command name sits in parentheses and may hold anything, spaces, parentheses and
    newlines included: the fields are those after its last `) `."""
    head, sep, tail = text.rpartition(") ")
    pid, paren, _ = head.partition(" (")
    fields = tail.split()
    if not sep or not paren or not pid.isdigit() or len(fields) < 20:
        return None
    ppid, start = fields[1], fields[19]
    if not ppid.isdigit() or not start.isdigit():
        return None
    return int(pid), int(ppid), int(start)


def parse_uid(status: str) -> int | None:
    """The real uid from the text of /proc/PID/status."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            words = line.split()
            return int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    return None


def descendants(table: dict[int, tuple[int, int]], known: dict[int, int], uid: int,
                owner: Callable[[int], int | None]) -> dict[int, int]:
    """The processes of `table` (pid -> (parent pid, start)) that `owner` (pid -> uid) says
    are `uid`'s and that descend from a living process of `known` (pid -> start time), not in
    it yet: pid -> start. Only those are asked about their owner: reading every process's
    status each tick would cost a node more than the whole tree does."""
    alive = {p for p, s in known.items() if p in table and table[p][1] == s}
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in table.items():
        if p != 1 and p not in known:
            children.setdefault(ppid, []).append(p)
    found: dict[int, int] = {}
    todo = list(alive)
    while todo:
        for c in children.pop(todo.pop(), []):
            if owner(c) == uid:
                found[c] = table[c][1]
                todo.append(c)
    return found


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None  # the process ended meanwhile


def owner(pid: int, proc: str = "/proc") -> int | None:
    status = read(f"{proc}/{pid}/status")
    return parse_uid(status) if status is not None else None


def scan(proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """Every process now: pid -> (parent pid, start time)."""
    table: dict[int, tuple[int, int]] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        stat = read(f"{proc}/{name}/stat")
        got = parse_stat(stat) if stat is not None else None
        if got is not None and got[0] == int(name):
            table[got[0]] = (got[1], got[2])
    return table


def subtree(roots: Iterable[int], proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """The processes from `roots` down, found through each one's children files (Linux's
    /proc/PID/task/TID/children): pid -> (parent pid, start time). Its cost follows the run's
    tree, not the machine's; a child that a file missed now is found at the next tick."""
    table: dict[int, tuple[int, int]] = {}
    todo = list(roots)
    while todo:
        p = todo.pop()
        stat = None if p in table else read(f"{proc}/{p}/stat")
        got = parse_stat(stat) if stat is not None else None
        if got is None or got[0] != p:
            continue
        table[p] = (got[1], got[2])
        try:
            tasks = os.listdir(f"{proc}/{p}/task")
        except OSError:
            continue
        for t in tasks:
            text = read(f"{proc}/{p}/task/{t}/children") or ""
            todo.extend(int(c) for c in text.split() if c.isdigit())
    return table


def write(path: str, procs: list[tuple[int, int]], mode: str = "a") -> None:
    with open(path, mode, encoding="ascii") as f:
        f.write("".join(f"{p} {s}\n" for p, s in procs))


def main() -> None:
    run_dir, wrapper = sys.argv[1], int(sys.argv[2])
    uid = os.getuid()
    table = scan()
    if wrapper not in table:
        return  # it ended already: nothing of it can be told apart any more
    begun = table[wrapper][1]
    # Without children files (a kernel built without them), every process is read each tick.
    cheap = os.path.exists(f"/proc/{wrapper}/task/{wrapper}/children")
    known = {wrapper: begun}
    path = os.path.join(run_dir, "procs")
    write(path, [(wrapper, begun)], "w")  # an earlier attempt's record names another wrapper
    written = 1
    while True:
        new = descendants(table, known, uid, owner)
        if new:
            write(path, list(new.items()))
            written += len(new)
        known.update(new)
        # Only the living are kept: a pid's next owner is not the run's.
        known = {p: s for p, s in known.items() if p in table and table[p][1] == s}
        if not known:
            return
        if written > COMPACT_AFTER:
            # The wrapper's line stays first, ended or not: it names the run's start.
            lines = [(wrapper, begun)] + [(p, s) for p, s in known.items() if p != wrapper]
            write(path + ".tmp", lines, "w")
            os.replace(path + ".tmp", path)
            written = len(lines)
        time.sleep(TICK_S)
        table = subtree(known) if cheap else scan()


if __name__ == "__main__":
    main()
