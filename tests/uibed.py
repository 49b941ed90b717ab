"""The lab's page for browser tests: the real `fleet ui` as a process of its own (its URL read
from the one line it prints), a real Chromium driven by Playwright, plain HTTP requests for
what a browser cannot show (a refusal's status), and where screenshots are kept.

The browser is Debian's `chromium` (.ci/setup installs it): Playwright's own download of its
browsers needs the internet, so it is pointed at that one (`executable_path`), run without its
sandbox as the tests run as root."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
URL_LINE = re.compile(r"^fleet ui: (http://127\.0\.0\.1:(\d+)/)\?token=([A-Za-z0-9_\-]+)$")


def need_browser() -> str:
    """The browser's path; skips (fails in CI, which must run these tests) without one."""
    path = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium")
                                        else None)
    why = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        why = "no playwright in this Python (.ci/setup installs it: the dev extra)"
    if path is None:
        why = "no chromium on PATH (.ci/setup installs Debian's)"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests must run in CI, but cannot: {why}")
        pytest.skip(why)
    assert path is not None
    return path


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """One Chromium (Playwright's Browser) for a test module."""
    path = need_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def shots() -> Path:
    """Where the page's screenshots go: $FLEET_UI_SHOTS, else the artefacts' folder
    ($FLEET_ARTEFACTS, else artefacts/ at the repository's root) under ui/."""
    if os.environ.get("FLEET_UI_SHOTS"):
        out = Path(os.environ["FLEET_UI_SHOTS"])
    else:
        base = Path(os.environ.get("FLEET_ARTEFACTS") or ROOT / "artefacts")
        out = base / "ui"
    out = out if out.is_absolute() else ROOT / out
    out.mkdir(parents=True, exist_ok=True)
    return out


def children(pid: int) -> list[int]:
    """Every descendant of `pid` now (from /proc: each process's parent)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, parent in parents.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


class Ui:
    """`fleet ui --port 0 -i INV...` (no --open: no browser of its own) in `cwd` with `env`
    (the run state the test's other fleet commands share), from its start until `stop()`."""

    def __init__(self, cwd: Path, env: dict[str, str], *inventories: Path,
                 timeout: float = 60) -> None:
        self.log = cwd / "fleet-ui.err"
        args = [a for inv in inventories for a in ("-i", str(inv))]
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleet", "ui", "--port", "0", *args],
                cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                stdin=subprocess.DEVNULL)
        try:
            line = self._first_line(timeout)
        except BaseException:
            self.stop()
            raise
        m = URL_LINE.match(line)
        assert m, f"fleet ui printed {line!r}, not its URL line\n{self.said()}"
        self.base, self.port, self.token = m.group(1), int(m.group(2)), m.group(3)

    def _first_line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                assert line, f"fleet ui ended before its URL (exit {self.proc.wait()})\n" \
                    f"{self.said()}"
                return line.rstrip("\n")
            assert self.proc.poll() is None, \
                f"fleet ui ended before its URL (exit {self.proc.returncode})\n{self.said()}"
        raise AssertionError(f"no URL line from fleet ui in {timeout}s\n{self.said()}")

    def url(self, path: str = "/", token: str | None = None) -> str:
        """`path` on this server, with the token in the query (the right one by default)."""
        return f"{self.base}{path.lstrip('/')}?token={self.token if token is None else token}"

    def said(self) -> str:
        """What fleet ui wrote on stderr so far (for a failing test's message)."""
        try:
            return "fleet ui's stderr:\n" + self.log.read_text()
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> list[int]:
        """SIGTERM (as Ctrl-C or a service manager would end it), then SIGKILL after `timeout`;
        the pids of its descendants that outlived it (each then killed by its pid), which a
        clean end leaves none of."""
        kids = children(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        deadline = time.monotonic() + 5
        left = [k for k in kids if os.path.exists(f"/proc/{k}")]
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [k for k in left if os.path.exists(f"/proc/{k}")]
        for k in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(k, signal.SIGKILL)
        return left


def request(url: str, method: str = "GET", headers: dict[str, str] | None = None,
            body: bytes | None = None) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of one plain HTTP request, an error status included."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - http on loopback
            return r.status, r.read().decode(errors="replace"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), dict(e.headers)
