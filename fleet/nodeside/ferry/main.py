"""ferry's entry point: `hash`, `recv`, `send` or `list`, from the node's command line."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import traceback

from fleet.nodeside.ferry.frames import cmd_hash, safe_rel
from fleet.nodeside.ferry.recv import _exit_when_unread, cmd_recv
from fleet.nodeside.ferry.send import cmd_list, cmd_send


def main(argv: list[str]) -> int:
    if argv[:1] == ["hash"] and (len(argv) == 2 or argv[2:] == ["blocks"]):
        threading.Thread(target=_exit_when_unread, daemon=True).start()  # fleet gone: stop
        rels = json.loads(sys.stdin.readline() or "[]")
        cmd_hash(argv[1], [safe_rel(r) for r in rels], sys.stdout, len(argv) == 2)
        return 0
    if argv[:1] == ["recv"] and len(argv) in (2, 3):
        return cmd_recv(argv[1:])
    if argv[:1] == ["send"] and len(argv) == 3:
        return cmd_send(argv[1], argv[2], json.loads(sys.stdin.readline() or "[]"))
    if argv[:1] == ["list"] and len(argv) == 2:
        rels = json.loads(sys.stdin.readline() or "[]")
        cmd_list(argv[1], [safe_rel(r) for r in rels], sys.stdout)
        return 0
    sys.stderr.write("usage: ferry hash ROOT [blocks] < [paths] | ferry recv MARK [LISTEN] | "
                     "ferry send ROOT MARK < [paths] | ferry list ROOT < [paths]\n")
    return 2


def run_to_exit(argv: list[str]) -> None:
    """main, then out at once: a relayed receiver's reader of fleet's word is a daemon thread
    blocked reading stdin, and holds its lock; Python's shutdown would wait a second for that
    lock, then abort (SIGABRT, a core dump where the node keeps them). Nothing is left to
    finalise: every file was closed, every word flushed."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - said as Python would, then out
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run_to_exit(sys.argv[1:])
