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
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fleet-ui-lab",
                                                daemon=True)
                self._thread.start()

    def _wanted(self) -> bool:
        with self._lock:
            listening = bool(self._listeners)
        return listening or time.monotonic() - self._asked < IDLE_S

    def _run(self) -> None:
        surveys: dict[Path, GpuSurvey | str] = {}
        try:
            while not self._closed and self._wanted():
                found = self._look(surveys)
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
                if not isinstance(s, str):
                    with contextlib.suppress(Exception):
                        s.close()

    def _look(self, surveys: dict[Path, GpuSurvey | str]) -> dict[str, Any]:
        from fleet import backends
        from fleet.config.select import Selection
        from fleet.errors import FleetError
        from fleet.ui import data

        out: list[dict[str, Any]] = []
        for inv in self.inventories:
            if inv not in surveys:
                try:
                    surveys[inv] = backends.for_inventory(inv).survey(inv, Selection())
                except FleetError as e:  # a bad inventory is said on its row, each look
                    surveys[inv] = str(e)
            survey = surveys[inv]
            if isinstance(survey, str):
                out.append({"path": str(inv), "hosts": {}, "error": survey})
                continue
            hosts = data.lab(dict(survey.look()), time.time())
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
    """A run's events, as `fleet logs RUN -f --json` writes them, until its end (then `end`
    with its exit code); the process is ended when the page goes."""
    proc = await asyncio.create_subprocess_exec(
        *fleet_argv("logs", run_id, "-f", "--json"), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True, env=_quiet_env(), limit=1 << 20)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        async for raw in proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:  # not fleet's own: never passed on as if it were
                continue
            if isinstance(event, dict):
                yield sse("fleet", event)
        code = await proc.wait()
        said = (await proc.stderr.read()).decode(errors="replace")[-WORDS_MOST:]
        yield sse("end", {"exit_code": code, "words": said})
    finally:
        _end(proc)


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
