"""The lab's page (`fleet ui`) in a real Chromium, driven by Playwright, against testbed hosts: the
lab shows a GPU held by a colleague's process (the stand-in nvidia-smi) and follows it live, a
detached run's page shows its nodes and a line printed after the page opened within 2 s, a
node's `<script>` shows as text, the stop button stops the run (and nothing of it is left on the
hosts), and a request without the token is refused (403). A screenshot of each page is kept
(tests/uibed.py: $FLEET_UI_SHOTS, else artefacts/ui/)."""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import CLI, _need_testbed
from tests.e2e.test_e2e_stream import command_job
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed
from tests.uibed import Ui, browser, need_browser, request, shots

pytestmark = pytest.mark.e2e

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0}
LIVE_S = 2.0  # a node's line on the page within this, from when the node was told to print it
WAIT_S = 60.0  # the bound on anything else the page waits for (a look at the hosts, a stop)

# Rank RANK: says it is up, prints hostile markup as a job may, then a step line every
# 0.5 s until stopped; once ~/ui.go exists (the test writes it on one host), prints the word
# in it once, as "late line WORD".
JOB = '''import os, sys, time
rank = int(os.environ["RANK"])
print(f"node rank {rank} up", flush=True)
print("<script>document.title = 'pwned'; window.__pwned = 1</script>", flush=True)
print('<img src="x" onerror="window.__pwned = 2">', flush=True)
go, told, tick = os.path.expanduser("~/ui.go"), False, 0
while True:
    if not told and os.path.exists(go):
        print(f"late line {open(go).read().strip()}", flush=True)
        told = True
    if tick % 10 == 0:
        step = tick // 10
        print(f"step {step} loss={2.0 / (1 + step * 0.2 + rank * 0.1):.4f} "
              f"step_ms={40 + 7 * rank + step % 5}", flush=True)
    tick += 1
    time.sleep(0.05)
'''
METRICS = '[metrics]\nloss = "loss=(?P<v>[0-9.]+)"\nstep_ms = "step_ms=(?P<v>[0-9]+)"\n'
HELLO = "import socket\nprint('hello from', socket.gethostname(), flush=True)\n"


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    """Two hosts; node1 has two GPUs, one of them held by alice's process (at 35% use); node2
    one GPU, idle."""
    _need_testbed()
    need_browser()
    with Testbed(2, colleagues=("alice",)) as bed:
        bed.fake_gpus("node2", {"gpus": [H100], "apps": []})
        yield bed


@pytest.fixture(scope="module")
def alice(tb: Testbed) -> int:
    """alice's process on node1's GPU 1 (its pid as node1 sees it)."""
    pid = tb.start_as("node1", "alice", "sleep", "600")
    tb.fake_gpus("node1", {"gpus": [H100, {**H100, "utilization": 35}],
                           "apps": [{"gpu": 1, "pid": pid, "used_mib": 18432}]})
    return pid


@pytest.fixture(scope="module")
def cli(tb: Testbed, tmp_path_factory: pytest.TempPathFactory) -> CLI:
    """The module's scratch directory and run state, shared by its fleet commands and its
    `fleet ui` (which lists the runs recorded there)."""
    tmp = tmp_path_factory.mktemp("ui")
    tb.inventory(tmp / "inv.toml")
    return CLI(tmp)


@pytest.fixture(scope="module")
def ui(cli: CLI) -> Iterator[Ui]:
    server = Ui(cli.cwd, cli.env, cli.cwd / "inv.toml")
    print(f"\nfleet ui: {server.base} (screenshots: {shots()})")
    try:
        yield server
    finally:
        left = server.stop()
    assert not left, f"fleet ui's processes outlived it: {left}\n{server.said()}"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    """A fresh page (a context of its own: nothing left from another test), 1280 wide."""
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    try:
        yield page
    finally:
        context.close()


@pytest.fixture(scope="module")
def run(cli: CLI, tb: Testbed) -> Iterator[str]:
    """A finished run (for the runs page to show more than one), then a detached run of JOB on
    both hosts, running until a test stops it (else stopped at the end). --force: alice's
    process may be on node1's GPU 1 (the lab's test), which would refuse them."""
    hello = command_job(cli.cwd, "hello", HELLO, 29841)
    done = cli("up", "--force", str(hello), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    for h in tb.hosts:
        (h.home / "ui.go").unlink(missing_ok=True)
    (cli.cwd / "uijob.py").write_text(JOB)  # under torchrun: ranks, as a training job has
    job = cli.cwd / "uijob.toml"
    job.write_text('inventory = "inv.toml"\nname = "uijob"\nscript = "uijob.py"\n'
                   f"[rendezvous]\nport = 29842\n{METRICS}")
    r = cli("up", "--detach", "--force", str(job), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    try:
        yield run_id
    finally:
        if tb.run_processes("node1", run_id) or tb.run_processes("node2", run_id):
            cli("stop", run_id, timeout=120)


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def open_run(page: Any, ui: Ui, run_id: str) -> None:
    """The run's page, once it shows both nodes and the first lines of both."""
    page.goto(ui.url(f"/run/{run_id}"))
    for host in ("node1", "node2"):
        expect(page.locator(f'#nodes tr[data-host="{host}"]')).to_have_count(1, timeout=WAIT_S
                                                                              * 1000)
    log = page.locator("#log")
    for rank in (0, 1):
        expect(log).to_contain_text(f"node rank {rank} up", timeout=WAIT_S * 1000)


def test_the_lab_shows_a_gpu_held_by_a_colleagues_process(page: Any, ui: Ui, tb: Testbed,
                                                          alice: int) -> None:
    page.goto(ui.url("/"))
    row = page.locator('#lab tr[data-host="node1"][data-gpu="1"]')
    held = row.locator(".holders")
    expect(held).to_contain_text("alice", timeout=WAIT_S * 1000)
    expect(held).to_contain_text(str(alice))
    expect(row).to_contain_text("35%")
    free = page.locator('#lab tr[data-host="node1"][data-gpu="0"] .holders')
    expect(free).not_to_contain_text("alice")
    expect(page.locator('#lab tr[data-host="node2"][data-gpu="0"]')).to_have_count(1)
    # Live: her job works harder, and the page follows without a reload (and its plot of GPU
    # use per host has a step to show).
    tb.fake_gpus("node1", {"gpus": [H100, {**H100, "utilization": 80}],
                           "apps": [{"gpu": 1, "pid": alice, "used_mib": 18432}]})
    expect(row).to_contain_text("80%", timeout=WAIT_S * 1000)
    page.wait_for_timeout(500)
    page.screenshot(path=shots() / "lab.png", full_page=True)
    assert page.errors == [], page.errors


def test_a_lease_notes_markup_shows_as_text(page: Any, ui: Ui, cli: CLI) -> None:
    """What a colleague wrote in a lease (the file on the host) is the page's text too."""
    note = '<img src="x" onerror="window.__pwned = 3"><b>mine</b>'
    took = cli("reserve", "node2:0", "-i", "inv.toml", "--for", "10m", f"--note={note}",
               timeout=120)
    assert took.returncode == 0, took.stdout + took.stderr
    try:
        page.goto(ui.url("/"))
        row = page.locator('#lab tr[data-host="node2"][data-gpu="0"]')
        expect(row).to_contain_text(note, timeout=WAIT_S * 1000)
        assert page.locator("#lab img, #lab b").count() == 0
        assert page.evaluate("window.__pwned") is None
        assert page.errors == [], page.errors
    finally:
        gone = cli("release", "node2:0", "-i", "inv.toml", timeout=120)
        assert gone.returncode == 0, gone.stdout + gone.stderr


def test_no_token_no_page_nor_answer(ui: Ui) -> None:
    refused = "403: this page needs the token"
    for url, headers in ((ui.base, {}),  # no token at all
                         (ui.url("/", token="x" + ui.token[1:]), {}),  # a wrong one
                         (ui.base + "runs", {}),
                         (ui.base + "api/runs", {}),
                         (ui.base + "api/runs", {"X-Fleet-Token": ui.token[:-1]}),
                         (ui.url("/static/app.js", token=""), {})):
        status, body, _ = request(url, headers=headers)
        assert (status, body[:len(refused)]) == (403, refused), (url, status, body[:300])
    status, body, _ = request(ui.base + "api/runs", headers={"X-Fleet-Token": ui.token})
    assert status == 200 and "runs" in json.loads(body), (status, body[:300])
    # An action: a wrong header is refused, and so is the token in the URL (what a link or a
    # form of another site could send), while the header is accepted. No cookie is set: a
    # browser would send 127.0.0.1's cookies to every other server on this machine.
    stop = ui.base + "api/run/20261126-000000-nosuch-0000/stop"
    status, _, _ = request(stop, "POST", {"X-Fleet-Token": "wrong",
                                          "Content-Type": "application/json"}, b"{}")
    assert status == 403
    status, _, headers = request(ui.url("/"))
    assert status == 200
    assert not [k for k in headers if k.lower() == "set-cookie"], headers
    status, body, _ = request(f"{stop}?token={ui.token}", "POST",
                              {"Content-Type": "application/json"}, b"{}")
    assert status == 403, (status, body[:300])
    status, body, _ = request(stop, "POST", {"X-Fleet-Token": ui.token,
                                             "Content-Type": "application/json"}, b"{}")
    assert status != 403, (status, body[:300])


def test_the_runs_page_lists_the_runs(page: Any, ui: Ui, run: str) -> None:
    page.goto(ui.url("/runs"))
    row = page.locator(f'#runs tr[data-run="{run}"]')
    expect(row.locator("td.state")).to_have_text(re.compile(r"\s*running\s*"),
                                                 timeout=WAIT_S * 1000)
    rows = page.locator("#runs tr[data-run]")
    expect(rows).to_have_count(2)
    expect(rows.filter(has_text="succeeded")).to_have_count(1)
    page.screenshot(path=shots() / "runs.png", full_page=True)
    page.fill("#runs-filter", "uijob")
    expect(row).to_be_visible()
    expect(rows.filter(has_text="succeeded")).to_be_hidden()
    assert page.errors == [], page.errors


def test_a_line_printed_after_the_run_page_opened_shows_within_2_s(
        page: Any, ui: Ui, tb: Testbed, run: str) -> None:
    open_run(page, ui, run)
    for host in ("node1", "node2"):
        expect(page.locator(f'#nodes tr[data-host="{host}"] td.state')).to_contain_text(
            "running")
    expect(page.locator("#run-state")).to_have_text("running")
    word = secrets.token_hex(6)
    line = page.locator("#log div.line", has_text=f"late line {word}")
    expect(line).to_have_count(0)
    go = tb.host("node2").home / "ui.go"
    tmp = go.with_name(".ui.go.tmp")
    tmp.write_text(f"{word}\n")
    os.replace(tmp, go)  # whole, at once: the moment the node can see it
    told = time.monotonic()
    expect(line).to_have_count(1, timeout=max(1.0, (told + LIVE_S - time.monotonic()) * 1000))
    took = time.monotonic() - told
    print(f"\nthe node's line on the page {took:.2f}s after the node was told to print it")
    expect(line.locator("span.tag")).to_contain_text("node2")
    # The picture: a few more steps in the log and the plots; the page's top down to the plots
    # (the manifest below them is long).
    expect(page.locator('#plots div.plot[data-metric="step_ms"]')).to_have_count(1)
    page.wait_for_timeout(1500)
    page.set_viewport_size({"width": 1280, "height": 1500})
    page.screenshot(path=shots() / "run.png")
    assert page.errors == [], page.errors


def test_a_nodes_markup_shows_as_text(page: Any, ui: Ui, run: str) -> None:
    open_run(page, ui, run)
    texts = page.locator("#log div.line span.text")
    script = "<script>document.title = 'pwned'; window.__pwned = 1</script>"
    img = '<img src="x" onerror="window.__pwned = 2">'
    for hostile in (script, img):
        expect(texts.filter(has_text=hostile)).to_have_count(2)  # one a node
    assert page.locator("#log script, #log img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert page.title() != "pwned"
    assert page.errors == [], page.errors


def test_the_stop_button_stops_the_run(page: Any, ui: Ui, tb: Testbed, cli: CLI,
                                       run: str) -> None:
    open_run(page, ui, run)
    asked: list[str] = []
    answers = [False, True]  # "Cancel" first, then "OK"
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.method == "POST" else None)

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        if answers.pop(0):
            dialog.accept()
        else:
            dialog.dismiss()

    page.on("dialog", answer)
    page.click("#stop")
    page.wait_for_timeout(500)
    assert len(asked) == 1 and sent == [], (asked, sent)  # asked, declined: nothing sent
    expect(page.locator("#run-state")).to_have_text("running")
    page.click("#stop")
    expect(page.locator("#run-state")).to_have_text("stopped", timeout=WAIT_S * 1000)
    assert len(asked) == 2 and [u.split("?")[0] for u in sent] == [
        f"{ui.base}api/run/{run}/stop"], (asked, sent)
    for host in ("node1", "node2"):
        expect(page.locator(f'#nodes tr[data-host="{host}"] td.state')).to_contain_text(
            "stopped", timeout=WAIT_S * 1000)
    assert_nothing_left(tb, run)
    st = cli("status", run, "--json", timeout=120)  # and fleet's record says so
    assert json.loads(st.stdout)["status"] == "stopped", st.stdout + st.stderr
    assert page.errors == [], page.errors
