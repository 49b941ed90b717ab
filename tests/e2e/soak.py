"""The soak: many cycles of a failing run on the same hosts leave nothing behind. Three files
(test_e2e_soak_1..3) run it on three testbeds of their own, at once where CI has room, 30
cycles in all: a leak in any cycle stays on its hosts and is found at the end."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import CLI
from tests.e2e.test_e2e_up import run_id_of
from tests.testbed import Testbed

SOAK_SCRIPT = '''
import os, sys, time
print(f"rank {os.environ['RANK']} up", flush=True)
if os.environ["RANK"] == "2":
    time.sleep(0.5)
    sys.exit("injected failure")
time.sleep(120)
'''


def soak(cli: CLI, tb3: Testbed, tmp_path: Path) -> None:
    """Cycles of up / injected failure / stop / rm on 3 hosts, then nothing of any of them may be
    left anywhere (FLEET_SOAK_CYCLES cycles, 10 by default, in each of the soak's files)."""
    cycles = int(os.environ.get("FLEET_SOAK_CYCLES", "10"))
    tb3.inventory(tmp_path / "inv.toml")
    (tmp_path / "soak.py").write_text(SOAK_SCRIPT)
    job = tmp_path / "soak.toml"
    job.write_text('inventory = "inv.toml"\nscript = "soak.py"\n[rendezvous]\nport = 29551\n')
    run_ids = []
    for _ in range(cycles):
        r = cli("up", str(job), timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "injected failure" in r.stderr
        run_ids.append(run_id_of(r.stderr))
        assert cli("stop", run_ids[-1]).returncode == 0
        removed = cli("rm", run_ids[-1])
        assert removed.returncode == 0, removed.stderr
    for h in tb3.hosts:
        left = [p for rid in run_ids for p in tb3.run_processes(h.name, rid)]
        assert not left, f"{h.name}: processes of the soak left: {left}"
        listeners = tb3.exec(h.name, "ss", "-Hltn", "sport = :29551").stdout.strip()
        assert not listeners, f"{h.name}: still listening on the rendezvous port: {listeners}"
        runs = h.home / "fleet" / "runs"
        assert not (list(runs.iterdir()) if runs.exists() else []), f"{h.name}: run dirs left"
    assert not (cli.cwd / ".fleet" / "runs").exists() or \
        not list((cli.cwd / ".fleet" / "runs").iterdir())
