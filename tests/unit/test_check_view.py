"""`fleet check`'s view (problems first, passing checks folded per host) and its advice for a
connection that failed, chosen from the real cause."""

from __future__ import annotations

import errno
import io
import re
import socket

import paramiko
import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from fleet.backends.checks import (
    Check,
    Endpoint,
    Status,
    connect_advice,
    known_line,
    summary,
    view,
)
from fleet.config import hostkeys
from fleet.console import Console
from fleet.errors import CommandTimedOut, TransportError

CHECKS = [
    Check("gpu-a", "ssh", Status.PASS, "ssh 10.0.0.1"),
    Check("gpu-a", "sftp", Status.PASS, "available"),
    Check("gpu-a", "clock", Status.WARN, "+3.1s from this machine", "run NTP"),
    Check("gpu-b", "ssh", Status.PASS, "ssh 10.0.0.2"),
    Check("gpu-b", "torch", Status.FAIL, "1.0 here, 2.4 on gpu-a", "install the same torch"),
    Check("gpu-a", "disk", Status.PASS, "80 GiB free"),
    Check("gpu-b", "disk", Status.WARN, "5 GiB free", "free space"),
]


def plain() -> Console:
    return Console(out=io.StringIO(), err=io.StringIO())


def test_problems_first_then_one_line_per_host() -> None:
    lines = view(plain(), CHECKS).splitlines()
    assert re.match(r"^HOST\s+CHECK\s+STATUS\s+DETAIL$", lines[0])
    assert re.match(r"^gpu-b\s+torch\s+FAIL\s+1\.0 here, 2\.4 on gpu-a$", lines[1])
    assert re.match(r"^\s+fix: install the same torch$", lines[2])
    assert re.match(r"^gpu-a\s+clock\s+WARN\s+\+3\.1s", lines[3])
    assert re.match(r"^\s+fix: run NTP$", lines[4])
    assert re.match(r"^gpu-b\s+disk\s+WARN\s+5 GiB free$", lines[5])
    assert re.match(r"^gpu-a\s+3 passed\s+PASS\s+ssh, sftp, disk$", lines[7])
    assert re.match(r"^gpu-b\s+1 passed\s+PASS\s+ssh$", lines[8])
    assert len(lines) == 9


def test_verbose_shows_every_row_host_by_host() -> None:
    lines = view(plain(), CHECKS, verbose=True).splitlines()
    rows = [re.split(r"\s{2,}", line.strip())[:3] for line in lines[1:]
            if not line.lstrip().startswith("fix:")]
    assert rows == [["gpu-a", "ssh", "PASS"], ["gpu-a", "sftp", "PASS"],
                    ["gpu-a", "clock", "WARN"], ["gpu-a", "disk", "PASS"],
                    ["gpu-b", "ssh", "PASS"], ["gpu-b", "torch", "FAIL"],
                    ["gpu-b", "disk", "WARN"]]
    assert sum("fix:" in line for line in lines) == 3


def test_a_host_with_nothing_passed_has_no_fold_line() -> None:
    out = view(plain(), [Check("gpu-c", "ssh", Status.FAIL, "refused", "start sshd")])
    assert "passed" not in out and out.splitlines()[1].startswith("gpu-c")


def test_summary_counts() -> None:
    assert summary(CHECKS) == "1 failed, 2 warning(s), 4 passed"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_table_fits_and_is_coloured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("FLEET_PLAIN", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    long = Check("gpu-b", "reach master", Status.FAIL, "cannot open TCP to the master " * 6,
                 "a firewall blocks port 29500 " * 4)
    out = view(Console(out=_Tty(), err=_Tty()), [*CHECKS, long])
    shown = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    assert "\x1b[1;31m" in out and "\x1b[33m" in out and "\x1b[32m" in out  # red, yellow, green
    # The long detail wraps inside its column: no line starts left of it.
    column = shown.splitlines()[0].index("DETAIL")
    assert all(line[:column].strip() == "" for line in shown.splitlines()
               if "cannot open TCP" in line and not line.startswith("gpu-b"))


AT = Endpoint("alice", "10.0.0.7", 2222)
TRUST = "fleet trust jobs/mnist.toml"


def key() -> paramiko.PKey:
    return paramiko.RSAKey.generate(1024)


def wrapped(cause: BaseException) -> TransportError:
    """As fleet.transport.connection raises it: its own message over the library's error."""
    try:
        raise TransportError("cannot connect") from cause
    except TransportError as e:
        return e


def test_unknown_key_names_the_users_file() -> None:
    k = key()
    detail, fix = connect_advice(wrapped(hostkeys.UnknownHostKey("[10.0.0.7]:2222", k)),
                                 AT, TRUST)
    assert detail == f"unknown host key for [10.0.0.7]:2222 ({hostkeys.fingerprint(k)})"
    assert "`fleet trust jobs/mnist.toml --accept`" in fix
    assert "sshd" not in fix.replace("sshd answered", "") and "INVENTORY" not in fix


def test_changed_key_points_at_the_recorded_line() -> None:
    e = paramiko.BadHostKeyException("[10.0.0.7]:2222", key(), key())
    detail, fix = connect_advice(wrapped(e), AT, TRUST, "line 3 of /home/a/.ssh/known_hosts")
    assert detail.startswith("HOST KEY CHANGED for [10.0.0.7]:2222: got ssh-rsa")
    assert "remove line 3 of /home/a/.ssh/known_hosts" in fix
    assert "intercepting" in fix and f"`{TRUST} --accept`" in fix


@pytest.mark.parametrize(("cause", "detail", "fix"), [
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
     "cannot connect to 10.0.0.7:2222: connection refused",
     "check that sshd runs on 10.0.0.7:2222: nothing listens there"),
    (NoValidConnectionsError({("10.0.0.7", 2222): ConnectionRefusedError(
        errno.ECONNREFUSED, "Connection refused")}),
     "cannot connect to 10.0.0.7:2222: connection refused", "check that sshd runs on"),
    (TimeoutError("timed out"), "cannot connect to 10.0.0.7:2222: no answer",
     "no firewall drops TCP 2222"),
    (OSError(errno.EHOSTUNREACH, "No route to host"),
     "cannot connect to 10.0.0.7:2222: no route to 10.0.0.7", "this machine's network"),
    (socket.gaierror(-2, "Name or service not known"),
     "cannot connect to 10.0.0.7:2222: 10.0.0.7 does not resolve (Name or service",
     "`address` in the inventory"),
    (paramiko.AuthenticationException("Authentication failed."),
     "authentication refused for alice@10.0.0.7:2222", "ssh-agent holds the key"),
    (paramiko.SSHException("Error reading SSH protocol banner"),
     "cannot connect", "check that sshd listens on that port"),
])
def test_each_cause_has_its_own_advice(cause: BaseException, detail: str, fix: str) -> None:
    said, advice = connect_advice(wrapped(cause), AT, TRUST)
    assert said.startswith(detail) and fix in advice, (said, advice)
    if not isinstance(cause, (ConnectionRefusedError, NoValidConnectionsError)):
        assert "sshd runs" not in advice  # the advice of a refusal only
    assert "fleet trust" not in advice  # a key's advice only


def test_a_command_that_timed_out_after_connecting_is_no_firewall() -> None:
    try:
        raise CommandTimedOut("gpu-a", "hello", 30) from TimeoutError("timed out")
    except CommandTimedOut as e:
        said, advice = connect_advice(e, AT, TRUST)
    assert said == "gpu-a: no answer to hello after 30s"
    assert "login shell did not answer" in advice and "firewall" not in advice


def test_an_unknown_cause_says_how_to_see_it() -> None:
    said, advice = connect_advice(TransportError("something else"), AT, TRUST)
    assert said == "something else"
    assert advice == "`ssh -p 2222 alice@10.0.0.7 true` with the same key shows what goes wrong"


def test_known_line_finds_plain_ported_and_hashed_names() -> None:
    hashed = paramiko.HostKeys.hash_host("[10.0.0.9]:2200")
    text = ("# comment\n"
            "@cert-authority *.lab ssh-ed25519 AAAA\n"
            "other,10.0.0.7 ssh-ed25519 AAAA\n"
            "[10.0.0.7]:2222 ssh-ed25519 AAAB\n"
            f"{hashed} ssh-ed25519 AAAC\n")
    assert known_line(text, "10.0.0.7") == 3
    assert known_line(text, "[10.0.0.7]:2222") == 4
    assert known_line(text, "[10.0.0.9]:2200") == 5
    assert known_line(text, "10.0.0.8") is None
    assert known_line(text, "*.lab") is None  # a CA line holds no host key
