"""The queue's files on a host (fleet/nodeside/queue_runner.py): the names in one of its
directories, bounded; a JSON file replaced whole, readable by its owner alone; a name that may
be a run's or a sweep's id."""

from __future__ import annotations

import json
import os
from typing import Any

from fleet.nodeside.shared.queue_rules import BadWord, run_id

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
