"""What the page gets pushed (server-sent events) and what its buttons run.

- The lab: one thread looks at every inventory's GPUs through the seam (a GpuSurvey per
  inventory, its connections kept between looks) every LOOK_S while a page listens, and pushes
  each look to every listener.
- A run's events: `fleet logs RUN -f --json`, the documented event stream (docs/EVENTS.md),
  one process per page, ended with the page's connection.
- The actions: fleet's own commands (`stop`, `pull`, `reserve`, `release`), with the page's
  values as arguments, never through a shell: the same locks, checks and words as typed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleet.backends import GpuSurvey

LOOK_S = 5.0  # how often the lab is looked at while a page listens
IDLE_S = 30.0  # with no page listening this long, the connections are closed
ACTION_S = 300.0  # an action's bound (a stop waits out its grace period; a pull moves files)
WORDS_MOST = 8000  # characters of an action's words sent back
TAIL = 20000  # lines of a run's log a page gets before it follows (the page keeps as many)
EVENT_MOST = 8 * (1 << 20)  # bytes of one event read back: a node's line (at most 1 MiB) as JSON


def sse(event: str, data: Any) -> bytes:
    """One server-sent event: its name and one line of JSON (JSON has no raw line breaks, so
    no text inside can start another field or event)."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


@dataclass
class Lab:
    """The inventories' GPUs, looked at by one thread while pages listen."""

    inventories: list[Path]
    latest: dict[str, Any] = field(default_factory=dict)
    _listeners: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[dict[str, Any]]]] = \
        field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wake: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _closed: bool = False
    _asked: float = 0.0

    def look(self) -> dict[str, Any]:
        """The latest look (one now where none was made yet)."""
        self._asked = time.monotonic()
        self._start()
        with self._lock:
            if self.latest:
                return self.latest
        self._wake.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self._closed:
            with self._lock:
                if self.latest:
                    return self.latest
            time.sleep(0.1)
        return {"at": time.time(), "inventories": [], "error": "no look yet"}

    async def stream(self) -> AsyncIterator[bytes]:
        """Every look from now on, the latest first."""
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=4)
        me = (asyncio.get_running_loop(), q)
        with self._lock:
            self._listeners.append(me)
            first = self.latest
        self._start()
        self._wake.set()
        try:
            if first:
                yield sse("lab", first)
            while True:
                yield sse("lab", await q.get())
        finally:
            with self._lock:
                self._listeners.remove(me)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout=10)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fleet-ui-lab",
                                                daemon=True)
                self._thread.start()

    def _go_on(self) -> bool:
        """Whether to look again: a page listens, or asked lately. Deciding to end clears the
        thread under the lock, so a page that comes meanwhile starts a new one."""
        with self._lock:
            if not self._closed and (self._listeners or
                                     time.monotonic() - self._asked < IDLE_S):
                return True
            self._thread = None
            return False

    def _run(self) -> None:
        surveys: dict[Path, GpuSurvey] = {}
        try:
            while self._go_on():
                try:
                    found = self._look(surveys)
                except Exception as e:  # said on the page, and looked at again next time
                    found = {"at": time.time(), "inventories": [],
                             "error": f"the lab could not be looked at: {type(e).__name__}: {e}"}
                with self._lock:
                    self.latest = found
                    listeners = list(self._listeners)
                for loop, q in listeners:
                    with contextlib.suppress(RuntimeError):  # its loop closed: gone
                        loop.call_soon_threadsafe(_offer, q, found)
                self._wake.wait(LOOK_S)
                self._wake.clear()
        finally:
            for s in surveys.values():
                with contextlib.suppress(Exception):
                    s.close()

    def _look(self, surveys: dict[Path, GpuSurvey]) -> dict[str, Any]:
        from fleet import backends
        from fleet.config.select import Selection
        from fleet.errors import FleetError
        from fleet.ui import data

        out: list[dict[str, Any]] = []
        for inv in self.inventories:
            if inv not in surveys:
                try:
                    surveys[inv] = backends.for_inventory(inv).survey(inv, Selection())
                except FleetError as e:  # a bad inventory is said on its row, tried each look
                    out.append({"path": str(inv), "hosts": {}, "error": str(e)})
                    continue
            hosts = data.lab(dict(surveys[inv].look()), time.time())
            out.append({"path": str(inv), "hosts": hosts, "error": None})
        return {"at": time.time(), "inventories": out}


def _offer(q: asyncio.Queue[dict[str, Any]], item: dict[str, Any]) -> None:
    """A look for one listener; a listener that fell behind skips to the newest."""
    if q.full():
        with contextlib.suppress(asyncio.QueueEmpty):
            q.get_nowait()
    q.put_nowait(item)


def fleet_argv(*args: str) -> list[str]:
    """fleet's own command line, run by the interpreter that runs this one."""
    return [sys.executable, "-m", "fleet", *args]


def _quiet_env() -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}


async def follow(run_id: str) -> AsyncIterator[bytes]:
    """A run's events, as `fleet logs RUN -f --json --merge` writes them (the last TAIL lines of
    the stream, then live; the job's ports not forwarded for a page), until its end: then `end`
    with its exit code and words. The process is ended when the page goes."""
    proc = await asyncio.create_subprocess_exec(
        *fleet_argv("logs", run_id, "-f", "--json", "--merge", "--no-forward",
                    f"--tail={TAIL}"),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True, env=_quiet_env(),
        limit=EVENT_MOST)
    assert proc.stdout is not None and proc.stderr is not None
    said = asyncio.ensure_future(_last_words(proc.stderr))
    why = ""
    try:
        try:
            async for raw in proc.stdout:
                try:
                    event = json.loads(raw)
                except ValueError:  # not fleet's own: never passed on as if it were
                    continue
                if isinstance(event, dict):
                    yield sse("fleet", event)
        except ValueError:  # a line past EVENT_MOST: the rest cannot be read in step
            why = f"an event of over {EVENT_MOST} bytes: the page stops following here\n"
            _end(proc)
        code = await proc.wait()
        yield sse("end", {"exit_code": code, "words": why + await said})
    finally:
        _end(proc)
        said.cancel()


async def _last_words(stream: asyncio.StreamReader) -> str:
    """What a process says on stderr, read as it comes (a pipe left full would stop it), its
    last WORDS_MOST characters kept."""
    kept = ""
    while chunk := await stream.read(1 << 16):
        kept = (kept + chunk.decode(errors="replace"))[-WORDS_MOST:]
    return kept


def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)


async def act(args: list[str], cwd: Path) -> dict[str, Any]:
    """One of fleet's commands for a button: its exit code and its words (stdout and stderr
    together, in order), bounded in time."""
    proc = await asyncio.create_subprocess_exec(
        *fleet_argv(*args), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=_quiet_env(), cwd=cwd)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), ACTION_S)
    except TimeoutError:
        _end(proc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
        return {"ok": False, "exit_code": -1,
                "words": f"fleet {args[0]} did not end within {ACTION_S:g}s: ended"}
    finally:
        _end(proc)
    words = out.decode(errors="replace")[-WORDS_MOST:]
    code = proc.returncode if proc.returncode is not None else -1
    return {"ok": code == 0, "exit_code": code, "words": words}
