"""`fleet trust`: show each host's key fingerprint and record the keys the user accepts."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import paramiko

from fleet.config import hostkeys
from fleet.config.inventory import Host, Inventory, TransportKind
from fleet.config.job import load_job
from fleet.config.schema import load_toml
from fleet.errors import ConfigError, UsageError
from fleet.transport import ssh_connection
from fleet.transport.group import each
from fleet.waits import named, over


class KeyState(Enum):
    """Whether fleet trusts the key a host offers; `fleet trust` prints the value in capitals."""

    KNOWN = "known"  # recorded (known_hosts, or pinned in the inventory)
    NEW = "new"  # not recorded anywhere fleet reads: --accept records it
    CHANGED = "changed"  # differs from the recorded one
    UNREACHABLE = "unreachable"  # no key seen: the host did not answer


@dataclass(frozen=True)
class KeyStatus:
    host: str
    state: KeyState
    key_host: str = ""  # the name known_hosts uses for it ("[addr]:port" off port 22)
    key: paramiko.PKey | None = None
    detail: str = ""
    record_to: str = ""  # the known_hosts file fleet reads for this host, to record it in


def inventory_for(path: Path, inventory: Path | None = None) -> Path:
    """The inventory whose hosts `fleet trust` asks: `path` itself where it is one (it has
    `hosts` or a `[slurm]` table), else that of the job file `path` (or `inventory`, as -i
    overrides a job's own everywhere)."""
    data = load_toml(path, "job or inventory")
    if "hosts" in data or "slurm" in data:
        if inventory is not None:
            raise UsageError(f"{path} is an inventory: give -i only with a job file")
        return path
    if not {"script", "module", "command", "inventory"} & set(data):
        raise ConfigError(path, None, "neither a job file (it would have `script`, `module` or "
                                      "`command`) nor an inventory (`[[hosts]]` or `[slurm]`)")
    return load_job(path, inventory).inventory


def survey_host(host: Host) -> KeyStatus:
    """What key the host offers and whether fleet already trusts it (no command is run)."""
    conn = ssh_connection(host)
    to = hostkeys.record_file(conn.ssh_config, host)
    try:
        conn.open()
    except hostkeys.UnknownHostKey as e:
        return KeyStatus(host.name, KeyState.NEW, e.hostname, e.key,
                         "" if e.hostname == hostkeys.key_name(conn.host, int(conn.port))
                         else f"(the ProxyJump hop {e.hostname})", to)
    except paramiko.BadHostKeyException as e:
        return KeyStatus(host.name, KeyState.CHANGED, hostkeys.key_name(conn.host, int(conn.port)),
                         e.key, f"expected {hostkeys.fingerprint(e.expected_key)}", to)
    except paramiko.AuthenticationException:
        pass  # the key was checked before authentication: it is known
    except (paramiko.SSHException, OSError) as e:
        return KeyStatus(host.name, KeyState.UNREACHABLE, detail=str(e))
    finally:
        transport = conn.client.get_transport()
        key = transport.get_remote_server_key() if transport is not None else None
        conn.close()
    return KeyStatus(host.name, KeyState.KNOWN, hostkeys.key_name(conn.host, int(conn.port)), key,
                     record_to=to)


def survey(inventory: Inventory) -> list[KeyStatus]:
    ssh_hosts = [h for h in inventory.every_host if h.transport is TransportKind.SSH]
    with over("each host's key", (h.name for h in ssh_hosts)) as wait:
        results = each(named((h.name, h) for h in ssh_hosts), wait.tracked(survey_host))
    return [r if isinstance(r, KeyStatus) else KeyStatus(name, KeyState.UNREACHABLE, detail=str(r))
            for name, r in results.items()]


def record_known_hosts(statuses: list[KeyStatus]) -> dict[str, int]:
    """Append each new key to the known_hosts file fleet reads for its host; per file, how
    many were recorded."""
    written: dict[str, int] = {}
    for s in statuses:
        if s.state is not KeyState.NEW or s.key is None or not s.record_to:
            continue
        os.makedirs(os.path.dirname(s.record_to) or ".", exist_ok=True)
        with open(s.record_to, "a") as f:
            f.write(f"{s.key_host} {s.key.get_name()} {s.key.get_base64()}\n")
        written[s.record_to] = written.get(s.record_to, 0) + 1
    return written


def _after(pin: str) -> Callable[[re.Match[str]], str]:
    return lambda m: f"{m.group(1)}\n{pin}"


def record_inventory(statuses: list[KeyStatus], path: Path, cluster: bool = False) -> int:
    """Pin new keys in the inventory, as `host_key = "..."` under each host's name line (a
    Slurm cluster's login node: under its `[slurm]` line)."""
    text = path.read_text()
    count = 0
    for s in statuses:
        # Never pin a ProxyJump hop's key (detail names the hop).
        if s.state is not KeyState.NEW or s.key is None or s.detail:
            continue
        line = re.compile(r"^(\s*\[slurm\][ \t]*(?:#.*)?)$" if cluster else
                          rf'^(\s*name\s*=\s*"{re.escape(s.host)}"\s*)$', re.M)
        pin = f'host_key = "{s.key.get_name()} {s.key.get_base64()}"'
        text, n = line.subn(_after(pin), text, count=1)
        count += n
    path.write_text(text)
    return count
