"""`fleet doctor`'s link test between two nodes, never through the laptop. Two modes:

  sink SECONDS EXPECT MARK: listens on any free port (IPv4 and IPv6 where the node has both),
    says "listening PORT PID", then serves EXPECT connections (each in its own thread) and
    exits, or gives up after SECONDS. A connection sends one line (the number of pings), that
    many 32-byte pings, each echoed at once, then bytes until it shuts its side: the sink
    answers "BYTES SECONDS" (what arrived, from its first byte to the end) and closes.
  send ADDRESS PORT SOURCE SECONDS PINGS: the other end of one such connection (from SOURCE,
    the node's own address on the interface fleet chose; "-" lets the kernel choose), bytes
    sent for SECONDS. Prints "rtt MEDIAN_US MIN_US" and "bulk BYTES SECONDS" (the sink's
    word), or "fail WHY".

fleet ends a sink by its PID (MARK is in its command line) once the rounds are done. Run with
the node's python -I -S, standard library only, Python 3.8+."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

PING = 32
CHUNK = 256 * 1024
CONNECT_S = 5.0
DRAIN_S = 30.0  # what a slow link still holds in its buffers when the sender stops


def _exact(conn: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        part = conn.recv(n - len(got))
        if not part:
            raise OSError("the other end closed the connection")
        got += part
    return got


def _line(conn: socket.socket, limit: int = 64) -> str:
    got = b""
    while not got.endswith(b"\n"):
        part = conn.recv(1)
        if not part or len(got) > limit:
            raise OSError("no line")
        got += part
    return got.decode("ascii", "replace").strip()


def _serve(conn: socket.socket, deadline: float) -> None:
    try:
        conn.settimeout(max(deadline - time.monotonic(), 1.0))
        pings = min(int(_line(conn)), 1000)
        for _ in range(pings):
            conn.sendall(_exact(conn, PING))
        total, first = 0, 0.0
        while True:
            part = conn.recv(CHUNK)
            if not part:
                break
            if not total:
                first = time.monotonic()
            total += len(part)
        spent = time.monotonic() - first if total else 0.0
        conn.sendall(f"{total} {spent:.6f}\n".encode())
    except (OSError, ValueError):
        pass
    finally:
        conn.close()


def _listen() -> socket.socket:
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True,
                                        backlog=64)
        except OSError:
            pass
    return socket.create_server(("", 0), backlog=64)


def sink(seconds: float, expect: int) -> int:
    try:
        s = _listen()
    except OSError as e:
        print(f"busy {e}", flush=True)
        return 0
    print(f"listening {s.getsockname()[1]} {os.getpid()}", flush=True)
    deadline = time.monotonic() + seconds
    s.settimeout(0.5)
    threads: list[threading.Thread] = []
    while len(threads) < expect and time.monotonic() < deadline:
        try:
            conn, _ = s.accept()
        except OSError:
            continue
        th = threading.Thread(target=_serve, args=(conn, deadline), daemon=True)
        th.start()
        threads.append(th)
    s.close()
    for th in threads:
        th.join(max(deadline - time.monotonic(), 0.0))
    return 0


def send(addr: str, port: int, source: str, seconds: float, pings: int) -> int:
    try:
        src = None if source == "-" else (source, 0)
        conn = socket.create_connection((addr, port), timeout=CONNECT_S, source_address=src)
    except OSError as e:
        print("fail", " ".join(str(e).split()) or "no connection")
        return 0
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(f"{pings}\n".encode())
        times = []
        for _ in range(pings):
            t0 = time.perf_counter()
            conn.sendall(b"p" * PING)
            _exact(conn, PING)
            times.append(time.perf_counter() - t0)
        times.sort()
        if times:
            print(f"rtt {times[len(times) // 2] * 1e6:.1f} {times[0] * 1e6:.1f}")
        block = b"\0" * CHUNK
        end = time.monotonic() + seconds
        conn.settimeout(max(seconds, 1.0) + DRAIN_S)
        while time.monotonic() < end:
            conn.sendall(block)
        conn.shutdown(socket.SHUT_WR)
        print("bulk", _line(conn))
    except (OSError, ValueError) as e:
        print("fail", " ".join(str(e).split()) or "the connection broke")
    finally:
        conn.close()
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["sink"]:
        return sink(float(argv[1]), int(argv[2]))
    return send(argv[1], int(argv[2]), argv[3], float(argv[4]), int(argv[5]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
