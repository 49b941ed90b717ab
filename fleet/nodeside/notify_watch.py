"""A detached run's word of its end (`[notify]` webhook), from its master: started beside the
run's wrapper, it reads notify.json in the run directory (written by fleet, mode 0600) and
removes it at once (the URL then lives only in this process), waits until the wrapper has
ended, then POSTs what this node knows: its own part's end (its exit code, fleet's stop record,
the last traceback in its node.log), never the other nodes'. It is not in the run's environment,
so a stop leaves it be; it ends at most TRIES posts after the run's end, each bounded whole by
TIMEOUT_S (post: fleet's own attached runs send through it too), and writes what happened to
notify.log. argv: the run directory, the wrapper's pid. Standard library only, Python 3.8+."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from fleet.nodeside.shared.nodemap import (
    EXIT_CODE,
    NODE_LOG,
    NOTIFY_JSON,
    NOTIFY_LOG,
    STARTED,
    STOPPED,
)
from fleet.nodeside.shared.run_end import TRACEBACK, ended, headline
from fleet.nodeside.shared.scrub import masked

POLL_S = 1.0
TIMEOUT_S = 10.0
TRIES = 3  # a lost answer is tried again PAUSE_S later: at most ~40 s after the run's end
PAUSE_S = 5.0
TAIL_BYTES = 64 << 10  # of node.log, the last traceback is looked for in this much
TRACE_LINES = 30


def read(path: str, limit: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(size - limit, 0))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def last_traceback(log: str) -> list[str]:
    """The last Python traceback in the log's tail (else its last lines), TRACE_LINES at most,
    each without control characters (the log is the job's)."""
    lines = log.splitlines()
    at = max((i for i, line in enumerate(lines) if TRACEBACK in line), default=-1)
    block = lines[at:] if at >= 0 else lines[-10:]
    return ["    " + masked(line)[:300]
            for line in block[-TRACE_LINES:]]


def stopped_by(text: str, proof: str) -> str | None:
    """Who stopped the node, where the stop record is fleet's own (a line of it hashes to the
    proof fleet gave: the job can write the file too); None otherwise."""
    lines = text.splitlines()
    genuine = any(hashlib.sha256(line.encode()).hexdigest() == proof for line in lines)
    return (lines[0].strip() or "a stop") if genuine and lines else None


def verdict(run_dir: str, cfg: dict[str, Any]) -> tuple[str, str, list[str], float]:
    """(state, words, failure lines, seconds) of the master's part, from its run directory."""
    node = cfg["node"]
    code_text = read(os.path.join(run_dir, EXIT_CODE)).strip()
    code = int(code_text) if code_text.lstrip("-").isdigit() else None
    started = read(os.path.join(run_dir, STARTED)).strip()
    try:
        end = os.stat(os.path.join(run_dir, EXIT_CODE)).st_mtime
    except OSError:
        end = time.time()
    seconds = end - int(started) if started.isdigit() else 0.0
    seen = (f"seen on {node} (the master) alone: a detached run's other nodes are not "
            f"watched (`fleet status {cfg['run_id']}`)")
    by = stopped_by(read(os.path.join(run_dir, STOPPED)), cfg["proof"])
    if by is not None:
        return "stopped", f"{node} was stopped by {by} (exit {code}); {seen}", [], seconds
    if code is None:
        return "unknown", f"{node}'s part ended without an exit code; {seen}", [], seconds
    if code == 0:
        return "succeeded", f"{node}'s part succeeded (exit 0); {seen}", [], seconds
    failure = [f"{node}'s last traceback:"] + last_traceback(
        read(os.path.join(run_dir, NODE_LOG), TAIL_BYTES))
    return "failed", f"{node}'s part failed (exit {code}); {seen}", failure, seconds


def request(cfg: dict[str, Any], state: str, said: str, failure: list[str],
            seconds: float) -> urllib.request.Request:
    """The POST, as fleet.lifecycle.notify writes it for an attached run."""
    head = headline(cfg["run_id"], cfg["job"], state, seconds)
    text = "\n".join([head, said] + failure)
    if cfg["format"] == "ntfy":
        return urllib.request.Request(cfg["webhook"], text.encode(), method="POST", headers={
            "Title": head.encode("latin-1", "replace").decode("latin-1"),
            "Content-Type": "text/plain; charset=utf-8"})
    body: dict[str, Any] = {"text": text}
    if cfg["format"] == "json":
        body.update(run=cfg["run_id"], job=cfg["job"], state=state, seconds=round(seconds, 1),
                    said=said, failure=failure, hang=None)
    return urllib.request.Request(cfg["webhook"], json.dumps(body).encode(), method="POST",
                                  headers={"Content-Type": "application/json"})


class _GivenUp(OSError):
    """The send was given up at its deadline: nothing more of it may leave this machine."""


def _guarded(cls: type[http.client.HTTPConnection], gone: threading.Event
             ) -> type[http.client.HTTPConnection]:
    """cls whose connect() shuts what it made where the send was given up meanwhile: a
    socket still being connected when shut() ran was not there to be shut, and a request
    sent on it after post() said "had not answered" would be told twice (the retry)."""

    class Guarded(cls):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            if gone.is_set():
                raise _GivenUp("the send was given up")
            super().connect()
            if gone.is_set():
                self.close()
                raise _GivenUp("the send was given up")

    return Guarded


class _Tracked(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """urllib's http and https handlers that keep each connection they make (its socket can
    then be shut from another thread), TLS verified as urlopen's default does: the system's
    certificates, the host name checked. Once shut, no connection of theirs sends anything."""

    def __init__(self) -> None:
        urllib.request.HTTPHandler.__init__(self)
        urllib.request.HTTPSHandler.__init__(self)
        self.made: list[http.client.HTTPConnection] = []
        self.gone = threading.Event()

    def _keep(self, cls: type[http.client.HTTPConnection]) -> Any:
        guarded = _guarded(cls, self.gone)

        def make(host: str, **kw: Any) -> http.client.HTTPConnection:
            conn = guarded(host, **kw)
            self.made.append(conn)
            return conn
        return make

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._keep(http.client.HTTPConnection), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._keep(http.client.HTTPSConnection), req,
                            context=ssl.create_default_context())

    def shut(self) -> None:
        """Shut every socket made: a thread blocked on one wakes with an error; one still
        connecting finds `gone` set once connected, and closes it unused."""
        self.gone.set()
        for conn in list(self.made):
            sock = conn.sock
            if sock is not None:
                # The plain socket's shutdown: an SSL socket's own would drop its state too.
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _clean(text: object) -> str:
    """A server's words as fleet writes them: printable, one line, 200 characters at most."""
    return masked(text)[:200]


def _answer(opener: urllib.request.OpenerDirector, req: urllib.request.Request,
            within: float) -> str | None:
    try:
        with opener.open(req, timeout=within) as r:
            code = int(r.status)
    except urllib.error.HTTPError as e:
        e.close()
        return f"it answered HTTP {e.code} {_clean(e.reason)}".rstrip()
    except urllib.error.URLError as e:
        return f"it could not be reached ({_clean(e.reason)})"
    except Exception as e:  # noqa: BLE001 - a timeout, a refused or cut connection, bad HTTP
        return f"it could not be reached ({_clean(e) or type(e).__name__})"
    return None if 200 <= code < 300 else f"it answered HTTP {code}"


def post(req: urllib.request.Request, within: float = TIMEOUT_S) -> str | None:
    """POST: None where the webhook took it, else why not (never the URL). The whole send (the
    name's lookup, connecting, TLS, the request, the answer's head) ends within `within`
    seconds: urlopen's own timeout bounds each socket operation alone, so a server that
    trickles a byte every few seconds would hold it for ever. The send runs in a thread of
    its own; at the deadline its sockets are shut, which ends it (one still in a name lookup,
    which nothing can cut short, is left behind: a daemon, gone with this process)."""
    tracked = _Tracked()
    opener = urllib.request.build_opener(tracked)
    said: list[str | None] = []
    sender = threading.Thread(target=lambda: said.append(_answer(opener, req, within)),
                              name="fleet-notify", daemon=True)
    sender.start()
    sender.join(within)
    if said:
        return said[0]
    tracked.shut()
    return f"it had not answered after {within:g}s (a slow or stalled server)"


def main() -> None:
    run_dir, pid = sys.argv[1], int(sys.argv[2])
    path = os.path.join(run_dir, NOTIFY_JSON)
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    os.unlink(path)
    while not ended(run_dir, pid):
        time.sleep(POLL_S)
    state, said, failure, seconds = verdict(run_dir, cfg)
    why = None
    for i in range(TRIES):
        why = post(request(cfg, state, said, failure, seconds))
        if why is None:
            break
        if i + 1 < TRIES:
            time.sleep(PAUSE_S)
    said = f"told {cfg['where']}" if why is None else \
        f"{cfg['where']} not told after {TRIES} tries: {why}"
    with open(os.path.join(run_dir, NOTIFY_LOG), "a", encoding="utf-8") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {state}: {said}\n")


if __name__ == "__main__":
    main()
