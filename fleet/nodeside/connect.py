"""Whether a TCP connection to ADDRESS PORT opens from this node (IPv4 or IPv6): exit 0 if it
does, else 1 with why on stdout. fleet runs it with the node's python (-I -S: nothing of the
node's site can change it), standard library only, Python 3.8+."""

from __future__ import annotations

import socket
import sys

TIMEOUT_S = 5.0


def main(argv: list[str]) -> int:
    try:
        socket.create_connection((argv[0], int(argv[1])), timeout=TIMEOUT_S).close()
    except OSError as e:
        print(e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
