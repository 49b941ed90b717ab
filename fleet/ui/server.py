"""`fleet ui`'s web server: the page (fleet/ui/static), its JSON (fleet.ui.data), its live
streams and its buttons (fleet.ui.live), behind one token.

Every request needs the token fleet ui printed: in the URL's query (`?token=`, any page), the
`X-Fleet-Token` header, or the cookie a page sets; compared in constant time. A button's POST
needs the header (a cookie alone is what another site's form would send). FleetError is said
by one handler, as the CLI's is."""

from __future__ import annotations

import contextlib
import hmac
import html
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from fleet.errors import ExitCode, FleetError, RunNotFound, UsageError
from fleet.ui import data, live

STATIC = Path(__file__).with_name("static")
COOKIE = "fleet_token"
HEADER = "x-fleet-token"
REFUSED = "403: this page needs the token `fleet ui` printed (its URL's ?token=...)\n"
# The page's own files only: no inline script, nothing from elsewhere.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' "
                               "'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store"}
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
DURATION = re.compile(r"[0-9]{1,4}[smhd]")


@dataclass
class Ui:
    """What one `fleet ui` serves: its token, the inventories of its lab page, where pulls go."""

    token: str
    inventories: list[Path]
    workdir: Path
    lab: live.Lab = field(init=False)

    def __post_init__(self) -> None:
        self.lab = live.Lab(self.inventories)


def granted(token: str, method: str, query: str | None, header: str | None,
            cookie: str | None) -> bool:
    """Whether a request carries the token: any of its three places for a GET, the header
    for anything else."""
    def same(given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), token.encode())

    if method in ("GET", "HEAD"):
        return same(query) or same(header) or same(cookie)
    return same(header)


class TokenGate:
    """Refuses (403) every request without the token, before any route sees it."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if not granted(self.token, request.method, request.query_params.get("token"),
                       request.headers.get(HEADER), request.cookies.get(COOKIE)):
            await PlainTextResponse(REFUSED, status_code=403, headers=HEADERS)(
                scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (k.lower().encode(), v.encode()) for k, v in HEADERS.items()
                    if k.lower().encode() not in have]
            await send(message)

        await self.app(scope, receive, with_headers)


def make_app(ui: Ui) -> ASGIApp:
    """The whole server, behind its token gate."""

    def page(name: str) -> Any:
        async def serve(request: Request) -> Response:
            run_id = request.path_params.get("run_id", "")
            text = (STATIC / "page.html").read_text()
            for mark, value in (("__FLEET_TOKEN__", ui.token), ("__FLEET_PAGE__", name),
                                ("__FLEET_RUN__", run_id)):
                text = text.replace(mark, html.escape(value, quote=True))
            response = Response(text, media_type="text/html; charset=utf-8")
            if request.query_params.get("token"):
                response.set_cookie(COOKIE, ui.token, httponly=True, samesite="strict",
                                    path="/")
            return response
        return serve

    async def lab(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(ui.lab.look))

    async def lab_stream(request: Request) -> Response:
        return StreamingResponse(ui.lab.stream(), media_type="text/event-stream")

    async def runs(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(data.runs))

    async def one_run(request: Request) -> Response:
        rec = data.load(request.path_params["run_id"])
        return JSONResponse(await run_in_threadpool(data.run, rec))

    async def run_stream(request: Request) -> Response:
        rec = data.load(request.path_params["run_id"])
        return StreamingResponse(live.follow(rec.run_id), media_type="text/event-stream")

    async def diff(request: Request) -> Response:
        from fleet.lifecycle import answers

        a = data.load(request.path_params["run_id"])
        b = data.load(request.query_params.get("other", ""))
        lines = await run_in_threadpool(answers.diff, a, b)
        return JSONResponse({"a": a.run_id, "b": b.run_id, "lines": lines})

    async def stop(request: Request) -> Response:
        rec = data.load(request.path_params["run_id"])
        return JSONResponse(await live.act(["stop", rec.run_id], ui.workdir))

    async def pull(request: Request) -> Response:
        rec = data.load(request.path_params["run_id"])
        asked = await _body(request)
        every = ["--all"] if asked.get("all") is True else []
        return JSONResponse(await live.act(["pull", rec.run_id, *every], ui.workdir))

    async def reserve(request: Request) -> Response:
        asked = await _body(request)
        inv, target = _target(ui, asked)
        took = str(asked.get("for") or "4h")
        if not DURATION.fullmatch(took):
            raise UsageError(f"for: {took[:40]!r}: a duration such as 30m, 4h, 2d")
        note = asked.get("note") or ""
        if not isinstance(note, str) or len(note) > 200:
            raise UsageError("note: at most 200 characters of text")
        return JSONResponse(await live.act(
            ["reserve", target, "-i", str(inv), f"--for={took}", f"--note={note}"],
            ui.workdir))

    async def release(request: Request) -> Response:
        inv, target = _target(ui, await _body(request))
        return JSONResponse(await live.act(["release", target, "-i", str(inv)], ui.workdir))

    routes = [
        Route("/", page("lab")), Route("/runs", page("runs")),
        Route("/run/{run_id}", page("run")),
        Route("/api/lab", lab), Route("/api/lab/stream", lab_stream),
        Route("/api/runs", runs), Route("/api/run/{run_id}", one_run),
        Route("/api/run/{run_id}/stream", run_stream),
        Route("/api/run/{run_id}/diff", diff),
        Route("/api/run/{run_id}/stop", stop, methods=["POST"]),
        Route("/api/run/{run_id}/pull", pull, methods=["POST"]),
        Route("/api/reserve", reserve, methods=["POST"]),
        Route("/api/release", release, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(ui.lab.close)  # the lab's connections closed

    app = Starlette(routes=routes, exception_handlers={FleetError: _said}, lifespan=lifespan)
    return TokenGate(app, ui.token)


async def _said(request: Request, exc: Exception) -> Response:
    """The one handler: a FleetError as JSON with its words and fleet's exit code."""
    code = getattr(exc, "exit_code", ExitCode.INTERNAL)
    status = HTTPStatus.NOT_FOUND if isinstance(exc, RunNotFound) else HTTPStatus.BAD_REQUEST
    return JSONResponse({"error": str(exc), "exit_code": int(code)}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    try:
        asked = await request.json()
    except ValueError:
        raise UsageError("the request's body is not JSON") from None
    if not isinstance(asked, dict):
        raise UsageError("the request's body is not a JSON object")
    return asked


def _target(ui: Ui, asked: dict[str, Any]) -> tuple[Path, str]:
    """A lease's inventory (one the page was started with, never a path of the page's own) and
    its `HOST[:GPUS]`."""
    inv = next((p for p in ui.inventories if str(p) == asked.get("inventory")), None)
    if inv is None:
        raise UsageError("inventory: not one this page shows")
    host = asked.get("host")
    if not isinstance(host, str) or not HOST.fullmatch(host):
        raise UsageError("host: a host's name")
    gpus = asked.get("gpus")
    if gpus is None:
        return inv, host
    if not isinstance(gpus, list) or not gpus or not all(
            isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1024 for g in gpus):
        raise UsageError("gpus: a list of GPU indices")
    return inv, f"{host}:{','.join(str(g) for g in sorted(set(gpus)))}"
