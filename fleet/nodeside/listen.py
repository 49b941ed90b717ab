"""A test listener for fleet's port checks: listens on PORT (0: any free one) and says whether it
could ("listening PORT PID", or "busy WHY"), accepts (and closes) EXPECT connections, then exits,
or gives up after SECONDS: the port is free again for the job. Argv: PORT SECONDS EXPECT, then a
mark that fleet finds in its command line before it ends it. Run with the node's python,
standard library only, Python 3.8+."""

from __future__ import annotations

import os
import socket
import sys
import time


def listen(port: int) -> socket.socket:
    """IPv4 and IPv6 on one socket where the node has both: nodes may reach it either way."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True,
                                    backlog=64)
    return socket.create_server(("", port), backlog=64)


def main(argv: list[str]) -> int:
    try:
        s = listen(int(argv[0]))
    except OSError as e:
        print(f"busy {e}", flush=True)
        return 0
    print(f"listening {s.getsockname()[1]} {os.getpid()}", flush=True)
    s.settimeout(0.5)
    end = time.monotonic() + float(argv[1])
    left = int(argv[2])
    while left > 0 and time.monotonic() < end:
        try:
            s.accept()[0].close()
            left -= 1
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
