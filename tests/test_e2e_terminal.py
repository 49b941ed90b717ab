"""What a person sees: the real `fleet up` on testbed hosts inside a tmux terminal of 80 columns x
24 rows, its pane captured during the transfer, while the workers join and at the end; what a
person must see is there, and nothing drawn in place outgrows the width or is left behind. Every
capture is kept (under $FLEET_ARTEFACTS, else artefacts/terminal/ at the repository's root)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.conftest import ROOT, _need_testbed
from tests.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

COLUMNS, ROWS = 80, 24
MB = 1 << 20
POLL_S = 0.1  # between captures
LIMIT_S = 240.0  # the whole run's bound
SPINNER = re.compile("[\u2800-\u28ff]")  # rich's "dots" frames: braille
BAR = re.compile(r"fleet: data [\d.]+ \w+ of [\d.]+ \w+ in place, [\d.]+ \w+/s, \d+s left")
JOINING = re.compile(r"workers joining: (\d)/4")


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    _need_testbed()
    if shutil.which("tmux") is None:
        pytest.fail("tmux is missing (.ci/setup installs it)")
    with Testbed(2) as bed:
        yield bed


def artefacts(name: str) -> Path:
    base = Path(os.environ["FLEET_ARTEFACTS"]) if os.environ.get("FLEET_ARTEFACTS") \
        else ROOT / "artefacts"
    out = base / "terminal" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


class Pane:
    """A detached tmux session of its own (a socket of its own), 80x24, running one command."""

    def __init__(self, command: str, env: dict[str, str]) -> None:
        self.socket = f"fleet-term-{os.getpid()}-{time.monotonic_ns()}"
        self.env = env
        self.tmux("new-session", "-d", "-x", str(COLUMNS), "-y", str(ROWS), "-s", "fleet",
                  command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], env=self.env, check=True,
                              capture_output=True, text=True, timeout=30).stdout

    def capture(self, colours: bool = False, history: bool = False) -> str:
        """The screen as tmux holds it; with `history`, from the first line on; wrapped lines
        joined (-J): a line drawn wider than the pane shows as one line longer than it."""
        return self.tmux("capture-pane", "-p", "-J", *(["-e"] if colours else []),
                         *(["-S", "-"] if history else []), "-t", "fleet")

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env,
                       capture_output=True, timeout=30)


def make_job(tmp_path: Path) -> Path:
    """The all_reduce job (2 hosts x 2 processes) with 48 MiB of data: enough for the transfer's
    bar (shown above 8 MiB) through an uplink held to 160 Mbit/s."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(ROOT / "jobs" / "allreduce.py", code / "allreduce.py")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        (data / f"shard{i}.bin").write_bytes(os.urandom(16 * MB))
    job = tmp_path / "job.toml"
    job.write_text('inventory = "inv.toml"\nworkdir = "code"\ndata = "data"\n'
                   'script = "allreduce.py"\nnproc_per_node = 2\n'
                   '[rendezvous]\nbackend = "static"\nport = 29500\n')
    return job


def drawn_in_place(line: str) -> bool:
    return bool(SPINNER.search(line) or BAR.search(line))


def wide(screen: str) -> list[str]:
    """Lines drawn in place (a spinner's, the bar's) that took more than one row of the pane
    (joined again by capture -J): a line that wraps cannot be redrawn. fleet's ordinary lines
    may wrap, as any program's do."""
    return [line for line in screen.splitlines()
            if drawn_in_place(line) and cell_len(line) >= COLUMNS]


def workers_started(tb: Testbed) -> int:
    """The ranks recorded on the hosts (each worker's, as it starts): what the count is
    checked against."""
    return sum(len(list((h.home / "fleet" / "runs").glob(f"*/{h.name}/ranks/[0-9]*")))
               for h in tb.hosts)


def test_fleet_up_in_an_80_column_terminal(tb: Testbed, tmp_path: Path) -> None:
    job = make_job(tmp_path)
    tb.inventory(tmp_path / "inv.toml")
    done = tmp_path / "exit-code"
    fleet = shlex.join([sys.executable, "-m", "fleet", "up", str(job)])
    # The pane stays after fleet ends (sleep): its last screen is fleet's alone.
    command = f"cd {shlex.quote(str(tmp_path))} && {fleet}; echo $? > {done}; sleep 600"
    env = {k: v for k, v in os.environ.items()
           if k not in ("NO_COLOR", "FLEET_PLAIN", "TMUX", "COLUMNS", "LINES")}
    env.update({"FLEET_STATE_DIR": str(tmp_path / ".fleet"), "PYTHONPATH": str(ROOT),
                "TERM": "xterm-256color"})
    out = artefacts("fleet-up-80x24")
    print(f"terminal captures: {out}")
    saved: dict[str, str] = {}

    def keep(moment: str, screen: str) -> None:
        saved[moment] = screen
        (out / f"{len(saved):02d}-{moment}.txt").write_text(screen)

    tb.shape_uplink("160mbit")
    pane = Pane(command, env)
    try:
        deadline = time.monotonic() + LIMIT_S
        for _ in range(int(LIMIT_S / POLL_S)):
            if done.exists() or time.monotonic() > deadline:
                break
            screen = pane.capture()
            last = screen.rstrip("\n").splitlines()[-1:] or [""]
            if "transfer" not in saved and BAR.search(last[0]):
                keep("transfer", screen)
                keep("transfer-colours", pane.capture(colours=True))
            shown = JOINING.search(last[0])
            if shown:  # never more than have started (the hosts' own record, read after)
                assert int(shown.group(1)) <= workers_started(tb), last[0]
            if "joining" not in saved and shown:
                keep("joining", screen)
                keep("joining-colours", pane.capture(colours=True))
            if "joined" not in saved and "workers joined: 4/4" in last[0]:
                assert workers_started(tb) == 4
                keep("joined", screen)
            time.sleep(POLL_S)
        assert done.exists(), f"fleet up did not end within {LIMIT_S:.0f}s:\n{pane.capture()}"
        time.sleep(0.3)  # the last write reaches the pane
        keep("end", pane.capture())
        keep("end-colours", pane.capture(colours=True))
        keep("end-history", pane.capture(history=True))
    finally:
        pane.kill()
        tb.shape_uplink(None)

    history = saved["end-history"]
    assert done.read_text().strip() == "0", history
    # During the transfer: the bar, one line at the bottom, with its words.
    assert "transfer" in saved, f"no transfer bar was seen:\n{history}"
    bar = saved["transfer"].rstrip("\n").splitlines()[-1]
    assert BAR.search(bar) and cell_len(bar) < COLUMNS, bar
    # While torchrun imports torch and the nodes meet: the count, true (0 to 4 of 4).
    assert "joining" in saved, f"no 'workers joining' was seen:\n{history}"
    spinner = saved["joining"].rstrip("\n").splitlines()[-1]
    assert SPINNER.match(spinner) and JOINING.search(spinner) and cell_len(spinner) < COLUMNS
    # The end: the job's lines and the final word, and nothing drawn in place left behind.
    end = saved["end"]
    assert re.search(r"fleet: run \S+ succeeded on all 2 node\(s\)", end), end
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"{host} r{rank} | rank {rank}/4 on {host}: all_reduce = 10 ok" in history
    for moment, screen in saved.items():
        assert not wide(screen), f"{moment}: drawn wider than {COLUMNS} columns: {wide(screen)}"
    leftovers = [line for line in history.splitlines()
                 if SPINNER.search(line) or "joining:" in line or "joined:" in line
                 or " in place, " in line]
    assert not leftovers, f"redrawn lines left on the screen: {leftovers}"
    # Colour reaches the terminal.
    assert "\x1b[" in saved["end-colours"]
    assert_nothing_left(tb, run_id_of(history))
