"""Host-key trust: known_hosts files, keys pinned in the inventory, accept-new, never auto-add."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import paramiko

from fleet.config.given import given as given
from fleet.config.given import trust_command as trust_command
from fleet.config.inventory import Host
from fleet.config.pinned import parse_pinned

_LOCK = threading.Lock()  # known_hosts files are appended to from parallel connections


class UnknownHostKey(paramiko.SSHException):  # type: ignore[misc]
    """The server offered a key that no known_hosts file and no pin knows."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        self.hostname, self.key = hostname, key
        super().__init__(f"unknown host key for {hostname}")


def fingerprint(key: paramiko.PKey | None) -> str:
    if key is None:
        return "unknown"
    return f"{key.get_name()} {key.fingerprint}"


def key_name(hostname: str, port: int) -> str:
    """How known_hosts names a host (what paramiko looks up)."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


@dataclass
class Trust:
    """Where one connection's host keys come from, and where accepted new keys go."""

    files: list[str]
    write_to: str | None  # set when ssh_config says StrictHostKeyChecking accept-new


class FleetPolicy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    """Unknown keys stop the connection, unless ssh_config asked for accept-new."""

    def __init__(self, trust: Trust) -> None:
        self.trust = trust

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str,
                         key: paramiko.PKey) -> None:
        if self.trust.write_to is None:
            raise UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _LOCK:
            path = os.path.expanduser(self.trust.write_to)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def known_hosts_files(cfg: Any, host: Host | None) -> list[str]:
    """The known_hosts files fleet reads for a host, the one OpenSSH writes to first: as
    OpenSSH, ssh_config's UserKnownHostsFile replaces ~/.ssh/known_hosts; the inventory's
    `known_hosts` comes on top."""
    files = [os.path.expanduser(p) for p in str(cfg.get("userknownhostsfile", "")).split()]
    files = files or [os.path.expanduser("~/.ssh/known_hosts")]
    if host is not None and host.known_hosts:
        files.append(os.path.expanduser(host.known_hosts))
    return files


def record_file(cfg: Any, host: Host | None) -> str:
    """Where an accepted key is written so that fleet (and ssh) read it again: the inventory's
    own known_hosts file if it names one, else the first file ssh_config says."""
    if host is not None and host.known_hosts:
        return os.path.expanduser(host.known_hosts)
    return known_hosts_files(cfg, None)[0]


def apply(conn: Any, host: Host | None) -> None:
    """Make a Fabric connection (and each ProxyJump hop) verify host keys as fleet does."""
    cfg = conn.ssh_config
    files = known_hosts_files(cfg, host)
    client: paramiko.SSHClient = conn.client
    for path in files:
        if os.path.isfile(path):
            client.get_host_keys().load(path)
    # "StrictHostKeyChecking no" is not honoured: fleet never turns verification off.
    accept_new = str(cfg.get("stricthostkeychecking", "")).lower() == "accept-new"
    client.set_missing_host_key_policy(FleetPolicy(Trust(files, files[0] if accept_new
                                                         else None)))
    if host is not None and host.host_key:
        pinned = parse_pinned(host.host_key)
        name = key_name(conn.host, int(conn.port))
        keys = client.get_host_keys()
        if name in keys:
            del keys[name]  # the pin is the whole truth for this host
        keys.add(name, pinned.get_name(), pinned)
    gateway = getattr(conn, "gateway", None)
    if gateway is not None and not isinstance(gateway, str):
        apply(gateway, None)
