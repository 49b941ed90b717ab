"""`fleet ui`'s server without a browser or a host (Starlette's test client): the token gate on
every route (query, header, cookie; a POST needs the header), the page's placeholders escaped,
the headers that keep a node's text inert, the one error handler, the actions' inputs checked
before any command runs, and server-sent events that stay one event each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fleet.ui import data, live, server

TOKEN = "tok-123_abc"


@pytest.fixture()
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TestClient:
    static = tmp_path / "static"
    static.mkdir()
    (static / "page.html").write_text(
        '<body data-token="__FLEET_TOKEN__" data-page="__FLEET_PAGE__" '
        'data-run="__FLEET_RUN__"></body>')
    (static / "app.js").write_text("// the page\n")
    monkeypatch.setattr(server, "STATIC", static)
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "lab.toml"
    inv.write_text("")
    ui = server.Ui(TOKEN, [inv], tmp_path)
    return TestClient(server.make_app(ui), follow_redirects=False)


def test_the_gate_reads_the_token_where_each_request_may_carry_it() -> None:
    g = server.granted
    assert g(TOKEN, "GET", TOKEN, None, None)
    assert g(TOKEN, "GET", None, TOKEN, None)
    assert g(TOKEN, "GET", None, None, TOKEN)
    assert not g(TOKEN, "GET", None, None, None)
    assert not g(TOKEN, "GET", "tok-124_abc", "x", "")
    assert not g(TOKEN, "GET", TOKEN[:-1], None, None)  # a prefix is no token
    assert g(TOKEN, "POST", None, TOKEN, None)
    assert not g(TOKEN, "POST", TOKEN, None, TOKEN)  # a form or a link from elsewhere: refused


@pytest.mark.parametrize("path", ["/", "/runs", "/run/x", "/api/runs", "/api/lab",
                                  "/api/run/x", "/static/app.js", "/nowhere"])
def test_every_route_without_the_token_is_refused(client: TestClient, path: str) -> None:
    for url in (path, f"{path}?token=wrong"):
        r = client.get(url)
        assert r.status_code == 403, url
        assert "needs the token" in r.text
        assert "__FLEET" not in r.text and TOKEN not in r.text


def test_a_button_needs_the_header_not_the_cookie(client: TestClient) -> None:
    page = client.get(f"/?token={TOKEN}")
    assert page.status_code == 200 and client.cookies.get(server.COOKIE) == TOKEN
    assert client.get("/api/runs").status_code == 200  # the cookie serves a GET
    refused = client.post("/api/run/x/stop", json={})
    assert refused.status_code == 403  # but never a POST: nothing ran
    through = client.post("/api/run/x/stop", json={}, headers={"X-Fleet-Token": TOKEN})
    assert through.status_code == 404  # past the gate: no such run, said as JSON
    assert "no run" in through.json()["error"]


def test_the_page_escapes_what_it_is_given(client: TestClient) -> None:
    r = client.get(f'/run/"><img src=x onerror=alert(1)>?token={TOKEN}')
    assert r.status_code == 200
    assert "<img" not in r.text
    assert 'data-run="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;"' in r.text
    assert f'data-token="{TOKEN}"' in r.text and 'data-page="run"' in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("style-src")[0]
    assert r.headers["x-content-type-options"] == "nosniff"


def test_runs_and_a_run_from_the_records_here(client: TestClient) -> None:
    h = {"X-Fleet-Token": TOKEN}
    assert client.get("/api/runs", headers=h).json() == {"runs": []}
    r = client.get("/api/run/nosuch-run", headers=h)
    assert r.status_code == 404 and r.json()["exit_code"] == 2
    bad = client.get("/api/run/..%2F..%2Fetc", headers=h)
    assert bad.status_code in (400, 404)


@pytest.mark.parametrize("body, why", [
    ({"inventory": "/etc/passwd", "host": "n1"}, "not one this page shows"),
    ({"host": "n1"}, "not one this page shows"),
    ({"inventory": "LAB", "host": "-rf"}, "host: a host's name"),
    ({"inventory": "LAB", "host": "n1;reboot"}, "host: a host's name"),
    ({"inventory": "LAB", "host": "n1", "gpus": ["0"]}, "gpus: a list of GPU indices"),
    ({"inventory": "LAB", "host": "n1", "gpus": [True]}, "gpus: a list of GPU indices"),
    ({"inventory": "LAB", "host": "n1", "gpus": []}, "gpus: a list of GPU indices"),
    ({"inventory": "LAB", "host": "n1", "for": "4h; rm"}, "a duration"),
    ({"inventory": "LAB", "host": "n1", "note": "x" * 201}, "at most 200"),
])
def test_a_lease_asked_for_is_checked_before_anything_runs(
        client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        body: dict[str, object], why: str) -> None:
    ran: list[list[str]] = []

    async def act(args: list[str], cwd: Path) -> dict[str, object]:
        ran.append(args)
        return {"ok": True, "exit_code": 0, "words": ""}

    monkeypatch.setattr(live, "act", act)
    body = {k: (str(tmp_path / "lab.toml") if v == "LAB" else v) for k, v in body.items()}
    r = client.post("/api/reserve", json=body, headers={"X-Fleet-Token": TOKEN})
    assert r.status_code == 400 and why in r.json()["error"]
    assert ran == []


def test_a_lease_becomes_fleets_own_command_line(
        client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    async def act(args: list[str], cwd: Path) -> dict[str, object]:
        ran.append(args)
        return {"ok": True, "exit_code": 0, "words": "reserved"}

    monkeypatch.setattr(live, "act", act)
    inv = str(tmp_path / "lab.toml")
    h = {"X-Fleet-Token": TOKEN}
    r = client.post("/api/reserve", json={"inventory": inv, "host": "n2", "gpus": [3, 1, 3],
                                          "for": "2h", "note": "--all of it"}, headers=h)
    assert r.json() == {"ok": True, "exit_code": 0, "words": "reserved"}
    client.post("/api/release", json={"inventory": inv, "host": "n2"}, headers=h)
    assert ran == [["reserve", "n2:1,3", "-i", inv, "--for=2h", "--note=--all of it"],
                   ["release", "n2", "-i", inv]]
    assert client.post("/api/release", content=b"{", headers=h).json()["error"] == \
        "the request's body is not JSON"


def test_an_event_stays_one_event_whatever_its_text() -> None:
    raw = live.sse("fleet", {"event": "line", "text": "a\n\nevent: end\ndata: {}\r\n"})
    text = raw.decode()
    assert text.count("\n\n") == 1 and text.endswith("\n\n")
    head, body = text.rstrip("\n").split("\n")
    assert head == "event: fleet"
    assert json.loads(body.removeprefix("data: "))["text"].startswith("a\n\nevent: end")


def test_what_fleet_kept_of_a_runs_end_for_the_page(tmp_path: Path) -> None:
    status = {"verdict": {"status": "failed", "said": "run r failed: rank 1 exited 1"}}
    shown = {"outcomes": {"n2": {"status": "failed", "exit_code": 1,
                                 "own_failure": "exit 1", "detail": ""},
                          "n1": {"status": "stopped", "exit_code": 143, "detail": "fail-fast"}},
             "job": {"metrics": {"loss": "loss (?P<v>[0-9.]+)"}}}
    assert data.failure(status, shown) == [
        "run r failed: rank 1 exited 1", "n1: stopped (exit 143) [fail-fast]",
        "n2: failed (exit 1): exit 1"]
    assert data.failure({"verdict": {"status": "succeeded", "said": "ok"}}, shown) == []
    assert data.failure({}, shown) == []
    assert data.metrics(shown) == {"loss": "loss (?P<v>[0-9.]+)"}
    assert data.metrics({"job": {"metrics": "nope"}}) == {} == data.metrics({})
    assert data.hang(tmp_path) is None
    (tmp_path / "stacks-20260101-000000.txt").write_text("run r hung: quiet 60s\nrank 0: x\n")
    (tmp_path / "stacks-20260102-000000.txt").write_text("run r hung again\nrank 1: y\n")
    assert data.hang(tmp_path) == {"verdict": "run r hung again", "stacks": ["rank 1: y"],
                                   "file": "stacks-20260102-000000.txt"}


def test_bad_options_are_said_before_anything_is_served(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    def ui(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fleet", "ui", *args], text=True,
                              capture_output=True, timeout=60, cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "FLEET_STATE_DIR": str(tmp_path),
                                   "PYTHONPATH": str(Path(__file__).resolve().parents[2])})

    r = ui("--listen", "example.org")
    assert r.returncode == 2 and "--listen 'example.org': an IP address" in r.stderr
    r = ui("-i", "nowhere.toml", "--port", "0")
    assert r.returncode == 2 and "--inventory nowhere.toml: file not found" in r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        r = ui("--port", str(taken.getsockname()[1]))
    assert r.returncode == 2 and "cannot serve on 127.0.0.1:" in r.stderr and \
        "--port 0 takes a free port" in r.stderr
    assert r.stdout == ""  # no URL: nothing was served


def test_a_runs_duration_ends_with_the_last_end_fleet_saw() -> None:
    assert data.duration(100.0, 5000.0, [130.0, 160.0]) == 60.0  # kept late by `status`
    assert data.duration(100.0, 190.0, []) == 90.0
    assert data.duration(100.0, None, [])  # goes on: to now
    assert data.duration(100.0, 50.0, []) is None  # a clock that ran backwards: not said
