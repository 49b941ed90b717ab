"""The pure parts of forwarding (PORT[:LOCALPORT], the job's `forward` key, `[RUN] PORT`), and
the relay itself over a local node (a plain socket): both ways, many at once, a refused port
said while the listener goes on, nothing left listening after close."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from fleet.cli.forward import split_args
from fleet.config.inventory import Host
from fleet.config.job import load_job
from fleet.config.schema import PortSpec, parse_port_spec
from fleet.console import Console
from fleet.errors import ConfigError, UsageError
from fleet.transport.forward import Forward, Tunnel
from fleet.transport.local import LocalTransport
from tests.builders import write_job


@pytest.mark.parametrize(("text", "spec"), [("6006", PortSpec(6006)),
                                            ("6006:16006", PortSpec(6006, 16006)),
                                            (" 1:65535", PortSpec(1, 65535))])
def test_port_specs(text: str, spec: PortSpec) -> None:
    assert parse_port_spec(text) == spec


@pytest.mark.parametrize("text", ["", "x", "6006:", ":6006", "0", "70000", "6006:0", "1:2:3",
                                  "-1", "6006:abc"])
def test_bad_port_specs(text: str) -> None:
    with pytest.raises(ValueError, match="PORT|between 1 and 65535"):
        parse_port_spec(text)


def test_run_and_port_words() -> None:
    assert split_args(["6006"]) == (None, PortSpec(6006))
    assert split_args(["mnist-49b0", "8888:18888"]) == ("mnist-49b0", PortSpec(8888, 18888))
    for words in ([], ["a", "b", "c"], ["mnist", "port"]):
        with pytest.raises(UsageError):
            split_args(words)


def _job(tmp_path: Path, forward: str) -> Path:
    return write_job(tmp_path, f"{forward}\n", script="t.py", script_text="")


def test_the_jobs_forward_key(tmp_path: Path) -> None:
    assert load_job(_job(tmp_path, "")).forward == ()
    job = load_job(_job(tmp_path, 'forward = [6006, "8888:18888"]'))
    assert job.forward == (PortSpec(6006), PortSpec(8888, 18888))
    for bad, says in [("forward = 6006", "forward: must be a list"),
                      ('forward = [6006, true]', r"forward\[1\]: must be a port"),
                      ('forward = ["6006:x"]', r"forward\[0\]: '6006:x' is not PORT"),
                      ('forward = [0]', r"forward\[0\]: .*between 1 and 65535"),
                      ('forward = ["1:7000", "2:7000"]', "local port is named twice")]:
        with pytest.raises(ConfigError, match=says):
            load_job(_job(tmp_path, bad))


def _echo_server() -> tuple[socket.socket, int]:
    """A server that answers each connection with what it read, upper-cased, then closes."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve(c: socket.socket) -> None:
        with c:
            data = b""
            while chunk := c.recv(65536):
                data += chunk
            c.sendall(data.upper())

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv, srv.getsockname()[1]


def _ask(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(data)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := c.recv(65536):
            got += chunk
        return got


def _ended_at_once(port: int) -> bool:
    """A connection the forward closes without an answer (it may close before we even send)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        try:
            return c.recv(10) == b""
        except ConnectionResetError:
            return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_relay_over_a_local_node_both_ways_many_at_once() -> None:
    srv, port = _echo_server()
    said: list[str] = []
    tunnel = Tunnel(LocalTransport(Host(name="here", address="localhost", transport="local")),
                    "here")
    f = Forward(tunnel, PortSpec(port), said.append).open()
    try:
        assert f.url == f"http://127.0.0.1:{f.local}/" and f.local != port
        big = bytes(range(97, 123)) * 40000  # ~1 MB: a half close must not cut the answer
        results: list[bytes] = []
        threads = [threading.Thread(target=lambda: results.append(_ask(f.local, big)))
                   for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert results == [big.upper()] * 8
    finally:
        f.close()
        srv.close()
    assert not said
    with pytest.raises(OSError):  # nothing listens there any more
        socket.create_connection(("127.0.0.1", f.local), timeout=2)


def test_a_refused_port_is_said_and_the_listener_goes_on() -> None:
    closed = _free_port()
    said: list[str] = []
    tunnel = Tunnel(LocalTransport(Host(name="here", address="localhost", transport="local")),
                    "here")
    f = Forward(tunnel, PortSpec(closed), said.append).open()
    try:
        assert _ended_at_once(f.local)
        assert _ended_at_once(f.local)
        assert len(said) == 2
        assert said[0].startswith(f"here: nothing accepts connections on 127.0.0.1:{closed} "
                                  "there (connection refused)")
        assert f.lost is None and not f.ended.is_set()
    finally:
        f.close()


def test_a_local_port_in_use_is_refused() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        taken = busy.getsockname()[1]
        tunnel = Tunnel(LocalTransport(Host(name="here", address="localhost",
                                            transport="local")), "here")
        with pytest.raises(UsageError, match=f"cannot listen on 127.0.0.1:{taken} here"):
            Forward(tunnel, PortSpec(1, taken), Console().info).open()
