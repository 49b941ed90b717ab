"""A host key pinned in the inventory (`host_key`), read from its known_hosts text: the inventory
checks it when it loads, fleet.config.hostkeys trusts it when it connects."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko


def parse_pinned(text: str) -> paramiko.PKey:
    """`ssh-ed25519 AAAA...` (as in known_hosts, without the host) to a key; ValueError if not."""
    import paramiko  # here: an inventory without a pinned key (a run's record) loads without it

    parts = text.split()
    if len(parts) < 2:
        raise ValueError("expected '<type> <base64 key>', as a line of known_hosts without the "
                         "host name")
    try:
        blob = base64.b64decode(parts[1], validate=True)
        return paramiko.PKey.from_type_string(parts[0], blob)
    except (binascii.Error, paramiko.SSHException, ValueError, TypeError) as e:
        raise ValueError(f"not a valid {parts[0]} public key: {e}") from e
