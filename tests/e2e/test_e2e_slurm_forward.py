"""`fleet forward` on a detached Slurm run, through the real CLI, to the master node's server."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_e2e_forward import fetched, interrupted, port_free, started, url_in
from tests.e2e.test_e2e_lifetime import wait_for
from tests.e2e.test_e2e_slurm import fleet, job_id_of, processes, run_id_of
from tests.slurmbed import Slurm

pytestmark = pytest.mark.e2e

# Each node serves who.txt (its node rank and hostname) on 0.0.0.0:PORT, until stopped.
SERVER = '''import functools, http.server, os, socket, tempfile
www = tempfile.mkdtemp()
with open(f"{www}/who.txt", "w") as f:
    f.write(f"node rank {os.environ['GROUP_RANK']} on {socket.gethostname()}")
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=www)
server = http.server.ThreadingHTTPServer(("0.0.0.0", PORT), handler)
print(f"serving on PORT", flush=True)
server.serve_forever()
'''
PORT = 18471  # on the compute nodes


def test_forward_to_the_master_of_a_slurm_run(slurm: Slurm, tmp_path: Path) -> None:
    d = slurm.tb.dir / "sfwd"
    d.mkdir()
    (d / "serve.py").write_text(SERVER.replace("PORT", str(PORT)))
    (d / "job.toml").write_text('inventory = "cluster.toml"\nscript = "serve.py"\n'
                                'nproc_per_node = 1\n[rendezvous]\nport = 29641\n')
    (d / "cluster.toml").write_text(f'[slurm]\nlogin = "localhost"\nnodes = 2\n'
                                    f'partition = "{slurm.partition}"\ntime = 10\n'
                                    f'workdir = "{slurm.tb.dir}/fleet"\n'
                                    f'python = "{sys.executable}"\n')
    cli = fleet(slurm, tmp_path)
    r = cli("up", str(d / "job.toml"), "--detach", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id, job = run_id_of(r.stderr), job_id_of(r.stderr)
    p = None
    try:
        deadline = time.monotonic() + 60
        while not all(processes(slurm, job).values()):
            assert time.monotonic() < deadline, "the job never ran on both nodes"
            time.sleep(0.5)
        out, err = tmp_path / "fwd.out", tmp_path / "fwd.err"
        p = started(cli, "forward", run_id, str(PORT), out=out, err=err)
        wait_for(lambda: "http://" in out.read_text() or p.poll() is not None, 60,
                 "the forward's URL")
        assert p.poll() is None, out.read_text() + err.read_text()
        url = url_in(out)
        assert out.read_text().strip() == url  # stdout: the URL alone
        assert f"node1  port {PORT} forwarded: {url}" in err.read_text(), err.read_text()
        assert fetched(url + "who.txt") == "node rank 0 on node1"
        said = interrupted(p, err)
        assert f"interrupted (SIGINT): the forward to node1:{PORT} was closed (the run goes " \
               "on)" in said
        assert port_free(url)
    finally:
        if p is not None and p.poll() is None:
            p.kill()
        cli("stop", run_id)
