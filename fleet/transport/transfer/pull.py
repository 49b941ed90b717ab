"""Files from a node (the engine of a pull): streamed by `ferry send`, written here strictly, as
from an untrusted peer."""

from __future__ import annotations

import json
import secrets
import threading
import time
from pathlib import Path

from fleet.console import printable
from fleet.errors import WorkdirError
from fleet.nodeside import ferry
from fleet.shell import quote
from fleet.transport.base import Pipe, Transport
from fleet.transport.transfer.agent import agent
from fleet.transport.transfer.report import LINE_MAX, problem_text

FETCH_IDLE_S = 60.0  # a node that sends nothing for this long while fetched from: given up


def fetch(t: Transport, python: str, root: str, rels: list[str], dest: Path) -> dict[str, str]:
    """The node's files root/rel into dest/rel, streamed by `ferry send` and written here by the
    same Receiver, strictly: a node is untrusted, so no path may leave dest or pass through a
    link there, each file is verified against the hash the node sent, and each replaces its
    target only whole. Returns rel -> sha256 of what was placed; a file the node did not send
    is missing from it. WorkdirError if the stream breaks the protocol."""
    mark = f"FERRY-{secrets.token_hex(8)}"
    rels = [ferry.safe_rel(r) for r in rels]
    pipe = t.pipe(agent(python, f"send {quote(root)} {mark}", json.dumps(rels)))
    got: dict[str, str] = {}
    errors: list[dict[str, object]] = []

    def report(obj: dict[str, object]) -> None:
        ok = obj.get("ok")
        if isinstance(ok, list) and len(ok) == 3:
            got[str(ok[1])] = str(ok[2])
        elif "error" in obj:
            errors.append(obj["error"])  # type: ignore[arg-type]

    recv = ferry.Receiver([str(dest)], 0, report, strict=True,
                          only={(0, r) for r in rels})
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
            if not recv.apply(kind, payload):
                break
    except (ferry.Bad, EOFError, ValueError, TypeError, RecursionError) as e:
        raise WorkdirError(f"{t.host.name}: the files sent from {root} broke the protocol "
                           f"({printable(str(e))}); nothing more was written") from e
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
