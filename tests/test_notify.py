"""`[notify]`'s pure parts: the config (job and user file), URL redaction, the message, the
notice of each end, the webhook bodies, and the detached watcher's verdict from a run dir."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from fleet.config.job import load_job
from fleet.config.notify import Format, Notify, redact
from fleet.console import Console
from fleet.errors import ConfigError, Interrupted, JobFailed, RunStopped
from fleet.nodeside import notify_watch
from fleet.run import notify
from fleet.run.notify import Notice, Told


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
    assert j.notify.wanted
    assert not load_job(job(tmp_path)).notify.wanted


@pytest.mark.parametrize(("body", "key", "words"), [
    ('webhook = "ftp://x/y"', "notify.webhook", "http:// or https:// URL"),
    ('webhook = "https:///nohost"', "notify.webhook", "with a host"),
    ('webhook = "https://h/a b"', "notify.webhook", "spaces"),
    ('webhook = "https://h/x"\nformat = "teams"', "notify.format", "slack, ntfy, json"),
    ('format = "json"', "notify.format", "only used with webhook"),
    ("command = []", "notify.command", "must name a program"),
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


FAILED = Notice("mnist-1a2b", "mnist", "failed", 3723.0, "run mnist-1a2b failed (logs: ...)",
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
    long = Notice("r", "j", "failed", 5, "x", ("first failure: n", *[f"l{i}" for i in range(99)]))
    lines = notify.message(long).splitlines()
    assert len(lines) == 2 + notify.TRACE_LINES + 1
    assert lines[2] == "first failure: n" and lines[-1] == "l98"
    assert "line(s) left out" in lines[3]


def test_hang_verdict_in_message() -> None:
    hung = Notice("r", "j", "hung", 65, "run r hung on node2", (), "rank 3 on node2 is in f()")
    assert notify.message(hung).splitlines() == [
        "fleet: run r (j) hung after 1m 05s", "run r hung on node2", "hang: rank 3 on node2 is "
        "in f()"]


@pytest.mark.parametrize(("exc", "state"), [
    (None, "succeeded"),
    (Interrupted("SIGINT", "the job was stopped on every node"), "stopped"),
    (RunStopped("run r was stopped by fleet stop during the wait"), "stopped"),
    (JobFailed("node2: the master's launcher ended"), "failed"),
])
def test_notice_of_each_end(exc: BaseException | None, state: str) -> None:
    told = Told("j", 100.0, run_id="r")
    n = notify.notice(told, exc, 112.0)
    assert n is not None and n.state == state and n.seconds == 12.0
    assert n.said == ("" if exc is None else str(exc))


def test_notice_once_decided_and_when_nothing_to_tell() -> None:
    told = Told("j", 0.0, run_id="r", state="hung", said="run r hung: x", hang="x")
    n = notify.notice(told, JobFailed("run r hung: x"), 1.0)
    assert n is not None and (n.state, n.said, n.hang) == ("hung", "run r hung: x", "x")
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
    assert [notify.duration(s) for s in (0, 59.9, 61, 3600, 7322)] == [
        "0s", "59s", "1m 01s", "1h 00m", "2h 02m"]
    assert notify_watch.duration(7322) == notify.duration(7322)


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
