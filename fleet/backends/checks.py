"""What `fleet check` reports on either backend: one Check per host and thing, the checks of a
connection (login shell, rc files that print, SFTP) or why there is none and what to do, and the
view they are printed as (problems first, passing checks folded per host)."""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from enum import Enum

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from fleet.config import hostkeys
from fleet.config.inventory import Host, TransportKind
from fleet.console import Console, Meaning
from fleet.errors import CommandTimedOut, FleetError
from fleet.transport import SSHTransport, Transport, ssh_connection
from fleet.transport.group import reason


class Status(Enum):
    PASS = "pass"
    WARN = "warn"  # it will run, but something is worth fixing
    FAIL = "fail"  # it will not run as it is


@dataclass(frozen=True)
class Check:
    host: str
    name: str
    status: Status
    detail: str
    fix: str = ""


RC_FIX = ("scp, rsync and sshd's external sftp-server (Debian's default) break on such output: "
          "print only in interactive shells (bash: `[[ $- == *i* ]] || return` at the top of "
          "~/.bashrc; zsh: move it from ~/.zshenv to ~/.zshrc; fish: `status is-interactive; or "
          "exit`; tcsh: `if ($?prompt) then ... endif`)")


def connection_checks(t: Transport) -> list[Check]:
    """How the node takes commands and files: login shell, rc files that print, SFTP."""
    name = t.host.name
    out = [Check(name, "ssh", Status.PASS, f"{t.host.transport} {t.host.address}"
                 + (f", login shell {t.shell}" if t.shell else ""))]
    noise = [line for line in t.noise.splitlines() if line.strip()]
    if noise:
        out.append(Check(name, "rc files", Status.WARN,
                         f"the login shell prints {len(noise)} line(s) for every command: "
                         f"{noise[0][:60]!r} (fleet ignores them)", RC_FIX))
    if isinstance(t, SSHTransport):
        if t.sftp_available():
            out.append(Check(name, "sftp", Status.PASS, "available"))
        elif t.sftp_garbled:
            out.append(Check(name, "sftp", Status.WARN, f"not usable ({t.sftp_problem}): fleet "
                             "sends files over the exec channel (verified, a little slower)",
                             RC_FIX))
        else:
            out.append(Check(name, "sftp", Status.WARN, f"not available ({t.sftp_problem}): "
                             "fleet sends files over the exec channel (verified, a little "
                             "slower)", "nothing to do; a `Subsystem sftp` line in sshd_config "
                             "makes large syncs faster"))
    return out


_MEANING = {Status.FAIL: Meaning.FAIL, Status.WARN: Meaning.WARN, Status.PASS: Meaning.OK}
HEADERS = ("HOST", "CHECK", "STATUS", "DETAIL")


def view(console: Console, checks: list[Check], verbose: bool = False) -> str:
    """The checks as `fleet check` prints them: the failures, then the warnings, each with its
    fix, then one line per host naming the checks it passed; with `verbose`, every row in host
    order instead. A table that fits the terminal, coloured by status, or plain columns."""
    order = {n: i for i, n in enumerate(dict.fromkeys(c.host for c in checks))}
    by_host = sorted(checks, key=lambda c: order[c.host])
    rows: list[list[str]] = []
    meanings: list[Meaning | None] = []

    def add(c: Check) -> None:
        rows.append([c.host, c.name, c.status.value.upper(), c.detail])
        meanings.append(_MEANING[c.status])
        if c.fix and c.status is not Status.PASS:
            rows.append(["", "", "", f"fix: {c.fix}"])
            meanings.append(None)

    if verbose:
        for c in by_host:
            add(c)
        return console.table(HEADERS, rows, meanings)
    for status in (Status.FAIL, Status.WARN):
        for c in same_once([c for c in by_host if c.status is status]):
            add(c)
    for host in order:
        passed = [c.name for c in by_host if c.host == host and c.status is Status.PASS]
        if passed:
            rows.append([host, f"{len(passed)} passed", "PASS", ", ".join(passed)])
            meanings.append(Meaning.OK)
    return console.table(HEADERS, rows, meanings)


def same_once(checks: list[Check]) -> list[Check]:
    """Checks that said the same (check, status, words and fix) on several hosts, as one row
    naming them all (`node1, node2, node3`), where the first of them stood."""
    groups: dict[tuple[str, Status, str, str], list[str]] = {}
    for c in checks:
        groups.setdefault((c.name, c.status, c.detail, c.fix), []).append(c.host)
    return [Check(", ".join(hosts), *key) for key, hosts in groups.items()]


def summary(checks: list[Check]) -> str:
    failed = sum(c.status is Status.FAIL for c in checks)
    warned = sum(c.status is Status.WARN for c in checks)
    return f"{failed} failed, {warned} warning(s), {len(checks) - failed - warned} passed"


def differ(checks: list[Check]) -> list[str]:
    """The checks that pass on some hosts and not on others (hosts that differ), in order."""
    seen: dict[str, set[Status]] = {}
    for c in checks:
        seen.setdefault(c.name, set()).add(c.status)
    return [name for name, got in seen.items() if Status.PASS in got and len(got) > 1]


@dataclass(frozen=True)
class Endpoint:
    """Where a connection went, as ssh_config resolved the host's name."""

    user: str
    address: str
    port: int


def _cause(e: BaseException) -> BaseException:
    """The error under fleet's message: what the SSH library or the socket said."""
    seen: set[int] = set()
    while e.__cause__ is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__
    if isinstance(e, NoValidConnectionsError) and e.errors:
        first = next(iter(e.errors.values()))  # paramiko's own connect: one error per address
        if isinstance(first, BaseException):
            return first
    return e


def connect_advice(e: BaseException, at: Endpoint, trust: str,
                   recorded: str = "") -> tuple[str, str]:
    """What a failed connection to `at` was, and what to do, from its real cause: (detail, fix).
    `trust` is the `fleet trust` command for the user's own file; `recorded` says where the
    key that a changed key differs from is kept."""
    cause = _cause(e)
    where = f"{at.address}:{at.port}"
    login = f"{at.user + '@' if at.user else ''}{at.address}"
    try_ssh = f"`ssh -p {at.port} {login} true` with the same key"
    if isinstance(e, CommandTimedOut):  # connected: the first command got no answer in time
        return (str(e), "the login shell did not answer (an rc file that waits for input, or a "
                f"slow home directory): {try_ssh} shows it")
    if isinstance(cause, hostkeys.UnknownHostKey):
        return (f"unknown host key for {cause.hostname} ({hostkeys.fingerprint(cause.key)})",
                f"sshd answered, but fleet does not know its key yet: `{trust}` shows the "
                f"fingerprint; if it is the host's, record it with `{trust} --accept`")
    if isinstance(cause, paramiko.BadHostKeyException):
        return (f"HOST KEY CHANGED for {cause.hostname}: got "
                f"{hostkeys.fingerprint(cause.key)}, expected "
                f"{hostkeys.fingerprint(cause.expected_key)}",
                "someone may be intercepting the connection, or the host was reinstalled: find "
                f"out which first; only if it was reinstalled, remove {recorded or 'its old key'} "
                f"and record the new one with `{trust} --accept`")
    if isinstance(cause, paramiko.AuthenticationException):
        return (f"authentication refused for {login}:{at.port} ({cause})",
                "the host took no key fleet offered: check `identity` in the inventory (or "
                "IdentityFile in ~/.ssh/config), that ssh-agent holds the key, and that its "
                f"public half is in ~/.ssh/authorized_keys of {at.user or 'the user'} there")
    if isinstance(cause, socket.gaierror):
        return (f"cannot connect to {where}: {at.address} does not resolve "
                f"({cause.strerror or cause})",
                "check the host's `address` in the inventory (or its HostName in ~/.ssh/config)")
    if isinstance(cause, ConnectionRefusedError):
        return (f"cannot connect to {where}: connection refused",
                f"check that sshd runs on {where}: nothing listens there (or the host's `port` "
                "is wrong)")
    if isinstance(cause, TimeoutError):
        return (f"cannot connect to {where}: no answer within the connect timeout",
                f"check the address ({at.address}) and that no firewall drops TCP {at.port} on "
                "the way; a slow link needs a longer `connect_timeout` in the inventory")
    if isinstance(cause, OSError) and cause.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return (f"cannot connect to {where}: no route to {at.address}",
                f"check the address ({at.address}) and this machine's network (VPN, routes)")
    detail = str(e) if isinstance(e, FleetError) else f"{type(e).__name__}: {e}"
    if isinstance(cause, paramiko.SSHException):
        return (detail, f"the SSH session with {where} failed: check that sshd listens on that "
                f"port; {try_ssh} shows whether it closes the session (sshd's log there says "
                "why)")
    return (detail, f"{try_ssh} shows what goes wrong")


def known_line(text: str, name: str) -> int | None:
    """The line of a known_hosts file that holds a key for `name` (hashed or not), or None."""
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith(("#", "@")):
            continue  # a comment, or a marked line (@revoked, @cert-authority): not a host key
        for pattern in fields[0].split(","):
            if pattern == name or (pattern.startswith("|1|") and
                                   paramiko.HostKeys.hash_host(name, pattern) == pattern):
                return number
    return None


def ssh_failed(host: Host, e: Exception, trust: str, label: str = "") -> Check:
    """The `ssh` check of a host fleet could not connect to: what happened and the fix that
    matches it (`label`: the name the row has, the host's by default)."""
    name = label or host.name
    if host.transport is TransportKind.LOCAL:
        return Check(name, "ssh", Status.FAIL, reason(e))
    try:
        conn = ssh_connection(host)
        at = Endpoint(str(conn.user or ""), str(conn.host), int(conn.port))
        files = hostkeys.known_hosts_files(conn.ssh_config, host)
    except Exception:  # noqa: BLE001 - the connection failed already; say it as the user wrote it
        at, files = Endpoint(host.user or "", host.address, host.port or 22), []
    cause = _cause(e)
    recorded = ""
    if isinstance(cause, paramiko.BadHostKeyException):
        recorded = _recorded(host, str(cause.hostname), files)
    return Check(name, "ssh", Status.FAIL, *connect_advice(e, at, trust, recorded))


def _recorded(host: Host, key_name: str, files: list[str]) -> str:
    """Where the expected key of a host is kept: its pin, or a known_hosts file and line."""
    if host.host_key:
        return f"the `host_key` pinned for {host.name} in the inventory"
    for path in files:
        try:
            with open(path) as f:
                number = known_line(f.read(), key_name)
        except OSError:
            continue
        if number is not None:
            return f"line {number} of {path} (`ssh-keygen -R '{key_name}' -f {path}`)"
    return ""
