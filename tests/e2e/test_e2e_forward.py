"""`fleet forward` through the real CLI on testbed hosts: a small HTTP server a job starts on
node2 (bound to the node's 127.0.0.1 only) fetched through the printed URL on this machine's
loopback; Ctrl-C ends it with exit 130, no traceback, the local port free; a port nothing
listens on is said per connection while the forward keeps listening; `forward = [PORT]` in the
job reaches the master's server while `fleet up` is attached."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import CLI
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

# Every node serves who.txt (its node rank and hostname) on 127.0.0.1:argv[2], until stopped.
SERVER = '''import functools, http.server, socket, sys, tempfile
rank, port = int(sys.argv[1]), int(sys.argv[2])
www = tempfile.mkdtemp()
with open(f"{www}/who.txt", "w") as f:
    f.write(f"node rank {rank} on {socket.gethostname()}")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=www)
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
print(f"serving on {port}", flush=True)
server.serve_forever()
'''
PORT = 18461  # on the nodes


def server_job(tmp_path: Path, name: str, rdzv: int, forward: str = "") -> Path:
    (tmp_path / f"{name}.py").write_text(SERVER)
    job = tmp_path / f"{name}.toml"
    job.write_text(f'inventory = "inv.toml"\nname = "{name}"\nlauncher = "command"\n'
                   f'command = ["{{python}}", "{name}.py", "{{node_rank}}", "{PORT}"]\n'
                   f"{forward}[rendezvous]\nport = {rdzv}\n")
    return job


def started(cli: CLI, *args: str, out: Path, err: Path) -> subprocess.Popen[str]:
    """fleet in its own process, stdout and stderr in files (read while it runs)."""
    with open(out, "w") as o, open(err, "w") as e:
        return subprocess.Popen([sys.executable, "-m", "fleet", *args], cwd=cli.cwd,
                                env=cli.env, stdout=o, stderr=e, text=True,
                                stdin=subprocess.DEVNULL)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback, http only
        return str(r.read().decode())


def fetched(url: str, timeout: float = 60) -> str:
    """The page, once the node's server answers (it may still be starting)."""
    got: list[str] = []

    def ok() -> bool:
        try:
            got.append(fetch(url))
        except OSError:
            return False
        return True

    wait_for(ok, timeout, f"an answer through {url}")
    return got[-1]


def url_in(path: Path) -> str:
    m = re.search(r"http://127\.0\.0\.1:(\d+)/", path.read_text())
    assert m, path.read_text()
    return m.group(0)


def port_free(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1].rstrip("/"))
    with socket.socket() as s:
        # Connections the forward closed first may linger in TIME_WAIT: no listener is left.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def interrupted(p: subprocess.Popen[str], err: Path) -> str:
    p.send_signal(signal.SIGINT)
    assert p.wait(30) == 130, err.read_text()
    text = err.read_text()
    assert "Traceback" not in text, text
    return text


def test_forward_to_node2_then_ctrl_c_and_a_closed_port(cli: CLI, tb2: Testbed,
                                                        tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    r = cli("up", "--detach", str(server_job(tmp_path, "served", 29611)), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stderr)
    procs: list[subprocess.Popen[str]] = []
    try:
        out, err = tmp_path / "fwd.out", tmp_path / "fwd.err"
        procs.append(p := started(cli, "forward", run_id, str(PORT), "--node", "node2",
                                  out=out, err=err))
        wait_for(lambda: "http://" in out.read_text(), 60, "the forward's URL")
        url = url_in(out)
        assert out.read_text().strip() == url  # stdout: the URL alone
        assert f"node2  port {PORT} forwarded: {url}" in err.read_text()
        assert fetched(url + "who.txt") == "node rank 1 on node2"
        # Several at once, each its own channel.
        assert all(fetch(url + "who.txt") == "node rank 1 on node2" for _ in range(5))
        said = interrupted(p, err)
        assert f"interrupted (SIGINT): the forward to node2:{PORT} was closed (the run goes " \
               "on)" in said
        assert port_free(url)

        # Nothing listens on port 9 of node2: said per connection; the forward goes on.
        out, err = tmp_path / "closed.out", tmp_path / "closed.err"
        procs.append(p := started(cli, "forward", run_id, "9", "--node", "node2", out=out,
                                  err=err))
        wait_for(lambda: "http://" in out.read_text(), 60, "the forward's URL")
        url = url_in(out)
        with pytest.raises(OSError):
            fetch(url)
        wait_for(lambda: "nothing accepts connections on 127.0.0.1:9" in err.read_text(), 30,
                 "the refusal said")
        assert "node2: nothing accepts connections on 127.0.0.1:9 there" in err.read_text()
        assert p.poll() is None, err.read_text()  # still listening
        interrupted(p, err)
        assert port_free(url)

        r = cli("forward", run_id, str(PORT), "--node", "node7")
        assert r.returncode == 2
        assert f"run {run_id} has no node 'node7'; its nodes: node1, node2" in r.stderr
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        cli("stop", run_id)
    assert_nothing_left(tb2, run_id)


def test_the_jobs_forward_while_up_is_attached(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = server_job(tmp_path, "declared", 29613, forward=f"forward = [{PORT}]\n")
    out, err = tmp_path / "up.out", tmp_path / "up.err"
    p = started(cli, "up", str(job), out=out, err=err)
    try:
        wait_for(lambda: "forwarded: http://" in err.read_text(), 120, "the job's forward")
        url = url_in(err)
        assert fetched(url + "who.txt") == "node rank 0 on node1"  # the master's
        said = interrupted(p, err)
    finally:
        if p.poll() is None:
            p.kill()
    assert said.count("forwarded: http://") == 1
    assert port_free(url)
    assert_nothing_left(tb2, run_id_of(said))


def test_the_jobs_forward_while_logs_follow(cli: CLI, tb2: Testbed, tmp_path: Path) -> None:
    tb2.inventory(tmp_path / "inv.toml")
    job = server_job(tmp_path, "followed", 29615, forward=f"forward = [{PORT}]\n")
    r = cli("up", "--detach", str(job), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "forwarded" not in r.stderr  # detached: nothing is forwarded
    run_id = run_id_of(r.stderr)
    out, err = tmp_path / "logs.out", tmp_path / "logs.err"
    p = started(cli, "logs", "-f", run_id, out=out, err=err)
    try:
        wait_for(lambda: "forwarded: http://" in err.read_text(), 60, "the job's forward")
        url = url_in(err)
        assert fetched(url + "who.txt") == "node rank 0 on node1"
        interrupted(p, err)
        assert port_free(url)
    finally:
        if p.poll() is None:
            p.kill()
        cli("stop", run_id)
    assert_nothing_left(tb2, run_id)
