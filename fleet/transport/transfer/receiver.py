"""One node's `ferry recv`: started through the node's transport, its reports read and parsed
in a thread of its own."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable

from fleet.console import printable
from fleet.shell import quote
from fleet.transport import openssh
from fleet.transport.base import Pipe, Transport
from fleet.transport.transfer.agent import agent
from fleet.transport.transfer.report import LINE_MAX, NodeState, parse_report


class Receiver:
    """One node's `ferry recv`, its reports read in a thread of their own. With `bulk` (the
    stream comes from this machine), through OpenSSH's `ssh` where it may carry it
    (fleet.transport.openssh); if that does not start, through the node's transport."""

    def __init__(self, name: str, t: Transport, python: str, listen: str | None,
                 state: NodeState, changed: threading.Condition,
                 lost: Callable[[str], None], bulk: bool = False) -> None:
        self.name, self.state, self.changed, self.lost = name, state, changed, lost
        self.t = t
        self.mark = f"FERRY-{secrets.token_hex(8)}"
        self.script = "exec " + agent(python, f"recv {self.mark}" +
                                      (f" {quote(listen)}" if listen else ""))
        self.closed = False
        args = openssh.command(t.host) if bulk else "not the bulk of a stream"
        self.pipe: Pipe
        if isinstance(args, list):
            self.pipe, self.via = openssh.OpenSSHPipe(args, self.script), "ssh"
        else:
            self.pipe, self.via = t.pipe(self.script), args  # why not ssh
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"ferry-{name}")
        self.reader.start()

    def _fall_back(self) -> bool:
        """The `ssh` binary ended before the program started (it cannot log in as fleet did,
        an option it does not know): the node's own transport carries the stream instead."""
        if self.closed or not isinstance(self.pipe, openssh.OpenSSHPipe):
            return False
        why = self.pipe.why()
        self.pipe.close()
        self.via = "ssh did not start" + (f" ({printable(why)})" if why else "")
        try:
            self.pipe = self.t.pipe(self.script)
        except Exception:  # noqa: BLE001 - the node is lost: the reader says it ended
            return False
        if self.closed:  # closed meanwhile: this one too
            self.pipe.close()
        return True

    def _read(self) -> None:
        buf = b""
        started = False
        try:
            while True:
                chunk = self.pipe.recv(65536)
                if not chunk:
                    if not started and self._fall_back():
                        buf = b""
                        continue
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not started:
                        started = line.strip() == self.mark.encode()
                        if started:
                            with self.changed:
                                self.state.started = True
                                self.changed.notify_all()
                        continue
                    self._take(parse_report(line))
                if len(buf) > LINE_MAX:
                    break  # not a report: the node is not speaking the protocol
        finally:
            with self.changed:
                self.state.ended = True
                self.changed.notify_all()
            if not self.state.done:
                self.lost(self.name)

    def _take(self, r: dict[str, object] | None) -> None:
        if r is None:
            return
        s = self.state
        with self.changed:
            s.last = time.monotonic()
            if "port" in r:
                s.port = r["port"]  # type: ignore[assignment]
                s.link_why = printable(str(r["why"]))  # 0: it cannot listen, and why
            elif "linked" in r:
                s.linked, s.link_why = bool(r["linked"]), printable(str(r["why"]))
            elif "at" in r:
                if r["at"] != s.at:
                    s.moved = s.last
                s.at = r["at"]  # type: ignore[assignment]
            elif "waiting" in r:
                s.waiting = float(r["waiting"])  # type: ignore[arg-type]
            elif "unread" in r:
                s.unread = r["unread"]  # type: ignore[assignment]
            elif "ok" in r:
                ok: list[object] = r["ok"]  # type: ignore[assignment]
                s.ok[(int(ok[0]), str(ok[1]))] = str(ok[2])  # type: ignore[call-overload]
            elif "error" in r and s.error is None:
                s.error = r["error"]  # type: ignore[assignment]
            elif "done" in r:
                s.done = True
            self.changed.notify_all()

    def send(self, obj: dict[str, object]) -> None:
        self.pipe.send(json.dumps(obj).encode() + b"\n")

    def close(self) -> None:
        self.closed = True
        self.pipe.close()
