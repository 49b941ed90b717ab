"""The bulk of a transfer through OpenSSH's `ssh` where it is installed: its crypto runs in C,
in a process of its own, where paramiko cuts every 32 KiB packet in Python. Trust as fleet's:
the same known_hosts files, StrictHostKeyChecking=yes, BatchMode, the user, port and keys
fleet resolved; no user config read (`-F /dev/null`), so nothing there can loosen it. Where the
binary cannot do what fleet's connection does (a pinned key, a jump host), fleet's own
connection carries the stream (`why_not`)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from fleet.config import hostkeys
from fleet.config.inventory import Host, TransportKind
from fleet.transport.framing import BOOT
from fleet.transport.process import ProcessPipe

OFF = "FLEET_OPENSSH"  # "0": never use the binary (fleet's own connection carries everything)
# AES-GCM first (one pass, AES-NI), as fleet's own connection asks; the rest are OpenSSH's
# since 6.5, so that an older server still agrees.
CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
           "aes128-ctr,aes192-ctr,aes256-ctr")
ALIVE_S = 5  # as fleet's own connection's keepalive
# A stream shorter than this stays on fleet's own connection: `ssh` logs in anew (a key
# exchange, an authentication: about 0.1 s), which paramiko's cost per byte pays back only
# past some tens of MB (a touched-only transfer sends nothing but times).
BULK_MIN = 64 << 20


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom `ssh` logs in, and what it trusts, as fleet resolved them from the
    inventory and ssh_config."""

    address: str  # ssh_config's HostName applied
    port: int
    user: str
    identities: tuple[str, ...]
    known_hosts: tuple[str, ...]
    connect_timeout: float


def argv(ssh: str, ep: Endpoint, command: str) -> list[str]:
    """The `ssh` command line that runs `command` on the endpoint, pure."""
    opts = {
        "BatchMode": "yes",  # never a prompt: a key or password it lacks is a failure
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": " ".join(ep.known_hosts),
        "GlobalKnownHostsFile": "/dev/null",  # fleet reads no system-wide file either
        "UpdateHostKeys": "no",
        "CheckHostIP": "no",  # before OpenSSH 8.5 it adds the address to known_hosts: no writes
        "HashKnownHosts": "no",
        "ControlMaster": "no",
        "ControlPath": "none",
        "ClearAllForwardings": "yes",
        "ProxyCommand": "none",
        "ProxyJump": "none",
        "ConnectTimeout": str(max(1, math.ceil(ep.connect_timeout))),
        "ServerAliveInterval": str(ALIVE_S),
        "ServerAliveCountMax": "3",
        "Ciphers": CIPHERS,
        "LogLevel": "ERROR",
    }
    out = [ssh, "-F", "/dev/null", "-T", "-x", "-a"]
    for k, v in opts.items():
        out += ["-o", f"{k}={v}"]
    for key in ep.identities:
        out += ["-i", key]
    return [*out, "-p", str(ep.port), "-l", ep.user, "--", ep.address, command]


def _plain(path: str) -> bool:
    """A path ssh reads as written: it splits option values at blanks and expands % tokens and
    (from OpenSSH 8.4) ${VAR}: fleet's own connection reads such a path literally, so the two
    would decide trust from two files."""
    return bool(path) and not any(c.isspace() or c in "%$\"'\\" for c in path)


def why_not(host: Host, conn: Any, ssh: str | None) -> str | None:
    """Why the binary must not carry this host's stream (fleet's own connection does), or None.
    `conn`: fleet's Fabric connection for the host, not opened (ssh_config applied)."""
    if os.environ.get(OFF, "") == "0":
        return f"{OFF}=0"
    if host.transport is not TransportKind.SSH:
        return "not an SSH host"
    if ssh is None:
        return "no `ssh` installed"
    if host.host_key:
        return "its host key is pinned in the inventory"
    if getattr(conn, "gateway", None):
        return "it is reached through a jump host or ProxyCommand"
    ep = endpoint(host, conn)
    if not ep.user or not ep.address or ep.address.startswith("-"):
        return "no plain user and address"
    if not all(_plain(p) for p in (*ep.known_hosts, *ep.identities)):
        return "a key or known_hosts path that ssh would read otherwise (blanks, %, $, quotes)"
    return None


def endpoint(host: Host, conn: Any) -> Endpoint:
    keys = conn.connect_kwargs.get("key_filename") or []
    keys = [keys] if isinstance(keys, str) else list(keys)
    return Endpoint(str(conn.host), int(conn.port), str(conn.user or ""),
                    tuple(dict.fromkeys(os.path.expanduser(k) for k in keys)),
                    tuple(hostkeys.known_hosts_files(conn.ssh_config, host)),
                    host.connect_timeout)


@functools.cache
def binary() -> str | None:
    return shutil.which("ssh")


def command(host: Host) -> list[str] | str:
    """The argv prefix-to-be for this host's bulk stream (ending in BOOT), or why not."""
    from fleet.transport.connection import ssh_connection

    conn = ssh_connection(host)
    ssh = binary()
    why = why_not(host, conn, ssh)
    if why is not None or ssh is None:
        return why or "no `ssh` installed"
    return argv(ssh, endpoint(host, conn), BOOT)


class OpenSSHPipe(ProcessPipe):
    """`ssh` as a subprocess: its stdin and stdout are the remote program's, its stderr the
    program's and ssh's own (an error message's tail)."""

    def __init__(self, args: list[str], script: str) -> None:
        super().__init__(args)
        with contextlib.suppress(OSError):  # it ended at once: recv() sees the end, why() says
            self.send(script.encode() + b"\n")

    def why(self) -> str:
        """Once it ended: the last line it wrote on stderr (ssh's own reason), or ''."""
        self.status(5)
        self._errs.join(1)
        lines = self.err().strip().splitlines()
        return lines[-1] if lines else ""

    def close(self) -> None:
        self._close_stdin()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            self.p.kill()  # ssh itself: the remote program sees its stdin end and exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.p.wait(5)
