"""Transports: run scripts, write files and stream output on one node, over SSH or locally.

The pieces: the Transport interface (base), the banner-proof framing of what a script prints
(framing) and of a stream's lines (lines), this machine as a node (local), a process here as a
pipe (process: a local shell, or OpenSSH's `ssh` in openssh), and SSH (ssh, over the connection
that connection opens, its channels' pieces in channels, kept under sshd's limits by budget).
The rest of fleet takes what it needs from here.
"""

from __future__ import annotations

from collections.abc import Callable

from fleet.config.inventory import Host, TransportKind
from fleet.transport.base import Pipe, Transport
from fleet.transport.connection import ssh_connection
from fleet.transport.framing import Result
from fleet.transport.lines import Partial, Received
from fleet.transport.local import LocalTransport
from fleet.transport.ssh import SSHTransport

__all__ = ["LocalTransport", "Partial", "Pipe", "Received", "Result", "SSHTransport",
           "Transport", "open_transport", "ssh_connection"]


# Each way of reaching a host (an inventory's `transport`) and the class that takes it.
TRANSPORTS: dict[TransportKind, Callable[[Host], Transport]] = {
    TransportKind.SSH: SSHTransport, TransportKind.LOCAL: LocalTransport}


def open_transport(host: Host, hello: bool = True) -> Transport:
    """A connected transport for the host (see Transport.connect); raises TransportError with
    the reason."""
    t = TRANSPORTS[host.transport](host)
    t.connect(hello)
    return t
