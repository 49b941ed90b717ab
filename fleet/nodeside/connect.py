"""Whether a TCP connection to ADDRESS PORT opens from this node (IPv4 or IPv6): exit 0 if it
does, else 1 with why on stdout. With `--each ADDRESS PORT ...`, every pair tried at once, one
line per pair in its order ("INDEX ok" or "INDEX fail WHY"), exit 0: one command for the master's
check of every worker. fleet runs it with the node's python (-I -S: nothing of the node's site
can change it), standard library only, Python 3.8+."""

from __future__ import annotations

import socket
import sys
import threading

TIMEOUT_S = 5.0


def each(argv: list[str]) -> int:
    pairs = [(argv[i], argv[i + 1]) for i in range(0, len(argv) - 1, 2)]
    said = ["fail no answer"] * len(pairs)

    def one(i: int, addr: str, port: str) -> None:
        try:
            socket.create_connection((addr, int(port)), timeout=TIMEOUT_S).close()
            said[i] = "ok"
        except (OSError, ValueError) as e:
            said[i] = "fail " + " ".join(str(e).split())

    threads = [threading.Thread(target=one, args=(i, a, p)) for i, (a, p) in enumerate(pairs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i, line in enumerate(said):
        print(i, line)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--each"]:
        return each(argv[1:])
    try:
        socket.create_connection((argv[0], int(argv[1])), timeout=TIMEOUT_S).close()
    except OSError as e:
        print(e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
