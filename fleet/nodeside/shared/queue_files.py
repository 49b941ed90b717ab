"""The queue's files on a host (fleet/nodeside/queue_runner.py): the names in one of its
directories, bounded; a JSON file replaced whole, readable by its owner alone; a name that may
be a run's or a sweep's id; an agent's book of the runs it waits on."""

from __future__ import annotations

import json
import os
from typing import Any

from fleet.nodeside.shared.queue_rules import BadWord, gpu_list, run_id

MOST_NAMES = 100000


def run_ok(name: str) -> bool:
    try:
        run_id(name)
    except BadWord:
        return False
    return True


def names(path: str) -> list[str]:
    """The regular files' names in a directory (none where it is missing), bounded."""
    out: list[str] = []
    try:
        with os.scandir(path) as entries:
            for e in entries:
                if len(out) >= MOST_NAMES:
                    break
                if e.is_file(follow_symlinks=False):
                    out.append(e.name)
    except OSError:
        return []
    return out


def write_json(path: str, said: dict[str, Any]) -> bool:
    """Replace the file whole (mode 0600); False where it could not be written."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            json.dump(said, f)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def tail(path: str, size: int = 262144) -> str:
    """The last `size` bytes of a file as text ("" where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def parse_book(text: str) -> dict[str, dict[str, Any]]:
    """An agent's book (queue_agent.py: run -> its GPUs, its wrapper's pid and start time, when
    it started, its lease's name, its metrics' patterns), read as any host file is: an entry
    that does not parse is left out, each kept one has exactly these fields."""
    try:
        book = json.loads(text)
    except ValueError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for run, e in book.items() if isinstance(book, dict) else ():
        try:
            out[run_id(run)] = {
                "gpus": list(gpu_list(e["gpus"])), "pid": _int(e["pid"]),
                "start": _int(e["start"]), "t0": _when(e["t0"]), "lease": str(e["lease"]),
                "metrics": _texts(e["metrics"])}
        except (BadWord, KeyError, TypeError, ValueError):
            continue
    return out


def _int(value: object) -> int:
    if type(value) is not int or not 0 < value < 1 << 62:
        raise ValueError("not a positive integer")
    return value


def _when(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e11:
        raise ValueError("not a time")
    return float(value)


def _texts(value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError("not names and patterns")
    return dict(value)
