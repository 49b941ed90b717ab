"""`[notify]`'s pure parts: the config (job and user file), URL redaction, the message, the
notice of each end, the webhook bodies, and the detached watcher's verdict from a run dir."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import json
import socket
import socketserver
import ssl
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fleet.config.job import load_job
from fleet.config.notify import Format, Notify, redact
from fleet.console import Console
from fleet.errors import ConfigError, Interrupted, JobFailed, RunStopped
from fleet.lifecycle import notify
from fleet.lifecycle.notify import Notice, NoticeState, Told
from fleet.nodeside import notify_watch
from fleet.nodeside.shared import run_end


def job(tmp_path: Path, notify_toml: str = "") -> Path:
    (tmp_path / "t.py").write_text("print(1)\n")
    p = tmp_path / "job.toml"
    p.write_text(f'inventory = "inv.toml"\nscript = "t.py"\n{notify_toml}')
    return p


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    return tmp_path / "cfg" / "fleet" / "config.toml"


def test_job_notify_is_read(tmp_path: Path) -> None:
    j = load_job(job(tmp_path, '[notify]\nwebhook = "https://ntfy.sh/secret-topic"\n'
                                'format = "ntfy"\ncommand = ["notify-send", "fleet"]\n'))
    assert j.notify == Notify("https://ntfy.sh/secret-topic", Format.NTFY,
                              ("notify-send", "fleet"), str(j.path))
    assert j.notify.wanted and not j.notify.from_master
    assert not load_job(job(tmp_path)).notify.wanted
    asked = load_job(job(tmp_path, '[notify]\nwebhook = "https://h/x"\nfrom_master = true\n'))
    assert asked.notify.from_master and asked.notify.view()["from_master"] is True
    assert j.notify.view()["command"] == ["notify-send", "***"]  # an argument may be a token


@pytest.mark.parametrize(("body", "key", "words"), [
    ('webhook = "ftp://x/y"', "notify.webhook", "http:// or https:// URL"),
    ('webhook = "https:///nohost"', "notify.webhook", "with a host"),
    ('webhook = "https://h/a b"', "notify.webhook", "spaces"),
    ('webhook = "https://h/x"\nformat = "teams"', "notify.format", "slack, ntfy, json"),
    ('format = "json"', "notify.format", "only used with webhook"),
    ("command = []", "notify.command", "must name a program"),
    ("from_master = true", "notify.from_master", "only used with webhook"),
    ('webhook = "https://h/x"\nfrom_master = "yes"', "notify.from_master", "must be"),
    ("command = \"notify-send\"", "notify.command", "list of strings"),
    ('webhok = "https://h/x"', "notify.webhok", "did you mean webhook"),
])
def test_bad_notify_names_file_and_key(tmp_path: Path, body: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(job(tmp_path, f"[notify]\n{body}\n"))
    assert e.value.key == key
    assert words in str(e.value)
    assert "secret" not in str(e.value)


def test_a_bad_url_is_not_printed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_job(job(tmp_path, '[notify]\nwebhook = "hxxp://hooks/T0K3N"\n'))
    assert "T0K3N" not in str(e.value)


def test_user_config_serves_jobs_without_their_own(tmp_path: Path,
                                                    no_user_config: Path) -> None:
    no_user_config.parent.mkdir(parents=True)
    no_user_config.write_text('[notify]\nwebhook = "https://hooks.slack.com/services/T/B/X"\n')
    assert load_job(job(tmp_path)).notify.webhook == "https://hooks.slack.com/services/T/B/X"
    # The job's table replaces the user's whole: an empty one turns word off for this job.
    assert not load_job(job(tmp_path, "[notify]\n")).notify.wanted
    no_user_config.write_text('[notify]\nwebhook = "https://h/x"\n[other]\n')
    with pytest.raises(ConfigError) as e:
        load_job(job(tmp_path))
    assert e.value.path == str(no_user_config) and e.value.key == "other"


@pytest.mark.parametrize(("url", "shown"), [
    ("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/..."),
    ("http://127.0.0.1:8080/topic?auth=tok", "http://127.0.0.1:8080/..."),
    ("https://user:pw@ntfy.example/t", "https://ntfy.example/..."),
    ("http://[fd00::1]:9/x", "http://[fd00::1]:9/..."),
])
def test_redact_keeps_scheme_and_host_only(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert Notify(url).view()["webhook"] == shown


FAILED = Notice("mnist-1a2b", "mnist", NoticeState.FAILED, 3723.0,
                "run mnist-1a2b failed (logs: ...)",
                ("first failure: node2 (node rank 1), rank 3 (local rank 1), exit code 1:",
                 "    Traceback (most recent call last):", "    ZeroDivisionError: \x1b[31m"))


def test_message_carries_state_duration_and_failure() -> None:
    text = notify.message(FAILED)
    lines = text.splitlines()
    assert lines[0] == "fleet: run mnist-1a2b (mnist) failed after 1h 02m"
    assert lines[1] == "run mnist-1a2b failed (logs: ...)"
    assert lines[2].startswith("first failure: node2 (node rank 1), rank 3")
    assert lines[-1] == "    ZeroDivisionError: ^[[31m"  # a node's words, never obeyed


def test_message_bounds_a_long_traceback() -> None:
    long = Notice("r", "j", NoticeState.FAILED, 5, "x",
                  ("first failure: n", *[f"l{i}" for i in range(99)]))
    lines = notify.message(long).splitlines()
    assert len(lines) == 2 + notify.TRACE_LINES + 1
    assert lines[2] == "first failure: n" and lines[-1] == "l98"
    assert "line(s) left out" in lines[3]


def test_hang_verdict_in_message() -> None:
    hung = Notice("r", "j", NoticeState.HUNG, 65, "run r hung on node2", (),
                  "rank 3 on node2 is in f()")
    assert notify.message(hung).splitlines() == [
        "fleet: run r (j) hung after 1m 05s", "run r hung on node2", "hang: rank 3 on node2 is "
        "in f()"]


@pytest.mark.parametrize(("exc", "state"), [
    (None, NoticeState.SUCCEEDED),
    (Interrupted("SIGINT", "the job was stopped on every node"), NoticeState.STOPPED),
    (RunStopped("run r was stopped by fleet stop during the wait"), NoticeState.STOPPED),
    (JobFailed("node2: the master's launcher ended"), NoticeState.FAILED),
])
def test_notice_of_each_end(exc: BaseException | None, state: NoticeState) -> None:
    told = Told("j", 100.0, run_id="r")
    n = notify.notice(told, exc, 112.0)
    assert n is not None and n.state is state and n.seconds == 12.0
    assert n.said == ("" if exc is None else str(exc))


def test_notice_once_decided_and_when_nothing_to_tell() -> None:
    told = Told("j", 0.0, run_id="r", state=NoticeState.HUNG, said="run r hung: x", hang="x")
    n = notify.notice(told, JobFailed("run r hung: x"), 1.0)
    assert n is not None and (n.state, n.said, n.hang) == (NoticeState.HUNG, "run r hung: x", "x")
    assert notify.notice(Told("j", 0.0), JobFailed("x"), 1.0) is None  # never prepared
    assert notify.notice(Told("j", 0.0, run_id="r", detached=True), None, 1.0) is None


def test_webhook_bodies() -> None:
    slack = notify.request("https://h/x", Format.SLACK, FAILED)
    assert json.loads(slack.data) == {"text": notify.message(FAILED)}  # type: ignore[arg-type]
    assert slack.get_header("Content-type") == "application/json"
    ntfy = notify.request("https://h/x", Format.NTFY, FAILED)
    assert ntfy.data == notify.message(FAILED).encode()
    assert ntfy.get_header("Title") == notify.headline(FAILED)
    full = json.loads(notify.request("https://h/x", Format.JSON, FAILED).data)  # type: ignore[arg-type]
    assert full["state"] == "failed" and full["run"] == "mnist-1a2b"
    assert full["failure"] == list(FAILED.failure) and full["text"] == notify.message(FAILED)


def test_unreachable_webhook_is_a_warning_without_the_url(capsys: pytest.CaptureFixture[str],
                                                          ) -> None:
    cfg = Notify("http://127.0.0.1:9/T0K3N", command=(sys.executable, "-c", "exit(3)"))
    notify.send(cfg, FAILED, Console())
    err = capsys.readouterr().err
    assert "warning: notify: http://127.0.0.1:9/... was not told: it could not be reached" in err
    assert "warning: notify: the command" in err and "it exited 3" in err
    assert "T0K3N" not in err


def test_local_command_gets_message_and_env(tmp_path: Path) -> None:
    out = tmp_path / "got"
    code = ("import os,sys;open(sys.argv[1],'w').write(os.environ['FLEET_STATE']+'|'"
            "+os.environ['FLEET_RUN']+'|'+sys.stdin.read())")
    assert notify.run_command((sys.executable, "-c", code, str(out)), FAILED) is None
    assert out.read_text() == "failed|mnist-1a2b|" + notify.message(FAILED)


def test_duration_words() -> None:
    assert [run_end.duration(s) for s in (0, 59.9, 61, 3600, 7322)] == [
        "0s", "59s", "1m 01s", "1h 00m", "2h 02m"]



def run_dir(tmp_path: Path, code: str | None, log: str = "", stopped: str = "") -> str:
    d = tmp_path / "run"
    d.mkdir(parents=True)
    (d / "started").write_text("1000\n")
    if code is not None:
        (d / "exit_code").write_text(code + "\n")
    (d / "node.log").write_text(log)
    if stopped:
        (d / "stopped").write_text(stopped)
    return str(d)


CFG = {"node": "node1", "run_id": "r1", "job": "j", "format": "slack", "webhook": "http://h/x",
       "where": "http://h/...", "proof": hashlib.sha256(b"key=K").hexdigest()}


def test_watcher_verdicts(tmp_path: Path) -> None:
    ok = run_dir(tmp_path / "a", "0")
    assert notify_watch.verdict(ok, CFG)[:3] == (
        "succeeded", "node1's part succeeded (exit 0); seen on node1 (the master) alone: a "
        "detached run's other nodes are not watched (`fleet status r1`)", [])
    log = "hello\nTraceback (most recent call last):\n  File \"t.py\"\nValueError: bad\x1b[0m\n"
    state, said, failure, _ = notify_watch.verdict(run_dir(tmp_path / "b", "1", log), CFG)
    assert state == "failed" and said.startswith("node1's part failed (exit 1)")
    assert failure == ["node1's last traceback:", "    Traceback (most recent call last):",
                       "      File \"t.py\"", "    ValueError: bad?[0m"]
    stop = run_dir(tmp_path / "c", "143", stopped="fleet stop\nkey=K\n")
    assert notify_watch.verdict(stop, CFG)[:2] == (
        "stopped", "node1 was stopped by fleet stop (exit 143); seen on node1 (the master) "
        "alone: a detached run's other nodes are not watched (`fleet status r1`)")
    # The job can write a stop record too: without fleet's proof it is not a stop.
    forged = run_dir(tmp_path / "d", "0", stopped="fleet stop\nkey=forged\n")
    assert notify_watch.verdict(forged, CFG)[0] == "succeeded"


def test_watcher_request_matches_fleets(tmp_path: Path) -> None:
    req = notify_watch.request({**CFG, "format": "json"}, "failed", "w", ["a"], 61)
    body = json.loads(req.data)  # type: ignore[arg-type]
    assert body["text"] == "fleet: run r1 (j) failed after 1m 01s\nw\na"
    assert body["state"] == "failed" and body["failure"] == ["a"]


class Trickle:
    """A webhook on this machine that takes the request, then answers one byte every `gap`
    seconds (with `tls`, over TLS with that (cert, key) pair): each socket operation gets its
    byte in time, the answer does not end (for `ends_after` seconds). `cut` is set once the
    client has gone; `finished` once the trickle ran its course without the client going."""

    def __init__(self, addr: str = "127.0.0.1", gap: float = 0.2,
                 tls: tuple[Path, Path] | None = None, ends_after: float = 30) -> None:
        self.server = socket.create_server((addr, 0))
        self.port = self.server.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://{addr}:{self.port}/hooks/T0K3N"
        self.gap, self.ends_after = gap, ends_after
        self.context: ssl.SSLContext | None = None
        if tls is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(*tls)
        self.asked = threading.Event()
        self.cut, self.finished = threading.Event(), threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        end = time.monotonic() + self.ends_after  # bounded, so that a test that fails ends
        try:
            if self.context is not None:
                conn = self.context.wrap_socket(conn, server_side=True)
            conn.recv(65536)
            self.asked.set()
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"." * 10000:
                if time.monotonic() > end:
                    break
                conn.sendall(bytes([byte]))
                time.sleep(self.gap)
            self.finished.set()
        except OSError:
            self.cut.set()
        finally:
            conn.close()

    def close(self) -> None:
        self.server.close()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that signs itself, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem, key_pem = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert_pem, key_pem


def hook_request(url: str) -> urllib.request.Request:
    return notify.request(url, Format.SLACK, FAILED)


def test_a_trickling_webhook_is_cut_at_the_bound_of_the_whole_send() -> None:
    """urlopen's timeout is per socket operation: a byte every 0.2 s held it until the server
    gave up. The whole send is bounded now, and its socket shut at the bound."""
    hook = Trickle()
    try:
        why = notify_watch.post(hook_request(hook.url), 1.0)
        assert why == "it had not answered after 1s (a slow or stalled server)"
        assert hook.asked.is_set() and not hook.finished.is_set()  # the trickle goes on 30 s
        assert hook.cut.wait(5)  # the connection was shut, not left to the trickle
    finally:
        hook.close()


def test_a_send_given_up_while_connecting_sends_nothing(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Review LOW 10: a connection still inside connect() when the bound passed had no socket
    to shut; it sent its request once connected, after post() had said "had not answered",
    and the watcher's retry told the webhook twice. Now it is closed unused."""
    server = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []
    heard = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            conn.settimeout(10)
            with conn:
                got.append(conn.recv(65536))
        heard.set()

    threading.Thread(target=serve, daemon=True).start()
    real = socket.create_connection

    def slow(*args: object, **kw: object) -> socket.socket:
        time.sleep(1.0)  # a connect that outlasts the 0.2 s bound
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "create_connection", slow)
    try:
        url = f"http://127.0.0.1:{server.getsockname()[1]}/hooks/T0K3N"
        why = notify_watch.post(hook_request(url), 0.2)
        assert why == "it had not answered after 0.2s (a slow or stalled server)"
        assert heard.wait(10)
        assert got == [b""], "the request was sent after the send was given up"
    finally:
        server.close()


def test_a_trickle_over_tls_is_cut_and_tls_stays_verified(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed(tmp_path)
    hook = Trickle(tls=(cert, key))
    try:
        refused = notify_watch.post(hook_request(hook.url), 5.0)
        assert refused is not None and "CERTIFICATE_VERIFY_FAILED" in refused, refused
        assert hook.cut.wait(5) and not hook.asked.is_set()  # refused before any request
        hook.cut.clear()
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the system's trust, as OpenSSL reads it
        why = notify_watch.post(hook_request(hook.url), 1.0)
        assert why == "it had not answered after 1s (a slow or stalled server)", why
        assert hook.asked.is_set() and not hook.finished.is_set()  # the trickle goes on 30 s
        assert hook.cut.wait(5)  # the connection was shut, not left to the trickle
    finally:
        hook.close()


def test_a_webhooks_answers_in_words_of_its_own() -> None:
    """A plain answer is taken at once; a refusal's reason is the server's text: printable."""
    answers = iter([b"HTTP/1.1 204 No Content\r\n\r\n",
                    b"HTTP/1.1 403 Go \x1b[31maway\r\nContent-Length: 0\r\n\r\n"])

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(65536)
            self.request.sendall(next(answers))

    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/x"
        assert notify_watch.post(hook_request(url), 5.0) is None
        assert notify_watch.post(hook_request(url), 5.0) == "it answered HTTP 403 Go ?[31maway"
        server.shutdown()
