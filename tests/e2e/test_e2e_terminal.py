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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.conftest import ROOT, _need_testbed
from tests.e2e.test_e2e_up import assert_nothing_left, run_id_of
from tests.testbed import Testbed

pytestmark = pytest.mark.e2e

COLUMNS, ROWS = 80, 24
MB = 1 << 20
POLL_S = 0.1  # between captures
LIMIT_S = 240.0  # the whole run's bound
SPINNER = re.compile("[\u2800-\u28ff]")  # rich's "dots" frames: braille
BAR = re.compile(r"fleet: data [\d.]+ \w+ of [\d.]+ \w+ (in place|on each of 2 nodes), "
                 r"[\d.]+ \w+/s, (\d+s left|time left: estimating)")
JOINING = re.compile(r"workers joining: (\d)/4")
RENDEZVOUS = re.compile(r"waiting for the rendezvous \S+:29500 to open on node1")


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


def make_job(tmp_path: Path, data_mb: int = 48) -> Path:
    """The all_reduce job (2 hosts x 2 processes) with 48 MiB of data: enough for the transfer's
    bar (shown above 8 MiB) through an uplink held to 160 Mbit/s."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(ROOT / "jobs" / "allreduce.py", code / "allreduce.py")
    data = tmp_path / "data"
    data.mkdir()
    for i in range(data_mb // 16):
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


class Session:
    """`fleet up` with these arguments in a pane of its own; `watch()` captures the pane until
    fleet ends, calling `look(last line, screen)` on every capture; `keep` saves a capture."""

    def __init__(self, tb: Testbed, tmp_path: Path, name: str, *args: str) -> None:
        self.tb, self.done = tb, tmp_path / "exit-code"
        fleet = shlex.join([sys.executable, "-m", "fleet", "up", *args])
        # The pane stays after fleet ends (sleep): its last screen is fleet's alone.
        self.command = (f"cd {shlex.quote(str(tmp_path))} && {fleet}; echo $? > "
                        f"{shlex.quote(str(self.done))}; sleep 600")
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("NO_COLOR", "FLEET_PLAIN", "TMUX", "COLUMNS", "LINES")}
        self.env.update({"FLEET_STATE_DIR": str(tmp_path / ".fleet"),
                         "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"})
        self.out = artefacts(name)
        print(f"terminal captures: {self.out}")
        self.saved: dict[str, str] = {}
        self.pane: Pane | None = None

    def keep(self, moment: str, screen: str) -> None:
        self.saved[moment] = screen
        (self.out / f"{len(self.saved):02d}-{moment}.txt").write_text(screen)

    def watch(self, look: Callable[[str, str], None]) -> str:
        """Until fleet ends (bounded by count and time); fleet's exit code."""
        self.pane = pane = Pane(self.command, self.env)
        try:
            deadline = time.monotonic() + LIMIT_S
            for _ in range(int(LIMIT_S / POLL_S)):
                if self.done.exists() or time.monotonic() > deadline:
                    break
                screen = pane.capture()
                look((screen.rstrip("\n").splitlines() or [""])[-1], screen)
                time.sleep(POLL_S)
            assert self.done.exists(), \
                f"fleet up did not end within {LIMIT_S:.0f}s:\n{pane.capture()}"
            time.sleep(0.3)  # the last write reaches the pane
            self.keep("end", pane.capture())
            self.keep("end-colours", pane.capture(colours=True))
            self.keep("end-history", pane.capture(history=True))
        finally:
            pane.kill()
        return self.done.read_text().strip()

    def assert_clean(self) -> None:
        """Nothing drawn in place outgrew the pane, and none of it is left at the end."""
        for moment, screen in self.saved.items():
            assert not wide(screen), \
                f"{moment}: drawn wider than {COLUMNS} columns: {wide(screen)}"
        leftovers = [line for line in self.saved["end-history"].splitlines()
                     if SPINNER.search(line) or "joining:" in line or "joined:" in line
                     or " in place, " in line or "waiting for the rendezvous" in line]
        assert not leftovers, f"redrawn lines left on the screen: {leftovers}"


def test_fleet_up_in_an_80_column_terminal(tb: Testbed, tmp_path: Path) -> None:
    job = make_job(tmp_path)
    tb.inventory(tmp_path / "inv.toml")
    s = Session(tb, tmp_path, "fleet-up-80x24", str(job))

    def look(last: str, screen: str) -> None:
        if "transfer" not in s.saved and BAR.search(last):
            s.keep("transfer", screen)
            s.keep("transfer-colours", s.pane.capture(colours=True) if s.pane else "")
        shown = JOINING.search(last)
        if shown:  # never more than have started (the hosts' own record, read after)
            assert int(shown.group(1)) <= workers_started(tb), last
        if "joining" not in s.saved and shown:
            s.keep("joining", screen)
            s.keep("joining-colours", s.pane.capture(colours=True) if s.pane else "")
        if "joined" not in s.saved and "workers joined: 4/4" in last:
            assert workers_started(tb) == 4
            s.keep("joined", screen)

    tb.shape_uplink("160mbit")
    try:
        code = s.watch(look)
    finally:
        tb.shape_uplink(None)
    history = s.saved["end-history"]
    assert code == "0", history
    # During the transfer: the bar, one line at the bottom, with its words.
    assert "transfer" in s.saved, f"no transfer bar was seen:\n{history}"
    bar = s.saved["transfer"].rstrip("\n").splitlines()[-1]
    assert BAR.search(bar) and cell_len(bar) < COLUMNS, bar
    # While torchrun imports torch and the nodes meet: the count, true (0 to 4 of 4).
    assert "joining" in s.saved, f"no 'workers joining' was seen:\n{history}"
    spinner = s.saved["joining"].rstrip("\n").splitlines()[-1]
    assert SPINNER.match(spinner) and JOINING.search(spinner) and cell_len(spinner) < COLUMNS
    # The end: the job's lines and the final word, and nothing drawn in place left behind.
    assert re.search(r"fleet: run \S+ succeeded on all 2 node\(s\)", s.saved["end"]), \
        s.saved["end"]
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"{host} r{rank} | rank {rank}/4 on {host}: all_reduce = 10 ok" in history
    s.assert_clean()
    assert "\x1b[32m" in s.saved["end-colours"]  # the success in green: colour by meaning
    assert_nothing_left(tb, run_id_of(history))


def test_detach_has_a_spinner_until_the_rendezvous_is_open(tb: Testbed, tmp_path: Path) -> None:
    job = make_job(tmp_path, data_mb=0)
    tb.inventory(tmp_path / "inv.toml")
    s = Session(tb, tmp_path, "fleet-up-detach-80x24", str(job), "--detach")

    def look(last: str, screen: str) -> None:
        if "rendezvous" not in s.saved and SPINNER.match(last) and RENDEZVOUS.search(last):
            s.keep("rendezvous", screen)

    code = s.watch(look)
    history = s.saved["end-history"]
    assert code == "0", history
    assert "rendezvous" in s.saved, f"no spinner while the rendezvous opened:\n{history}"
    assert "started (pid" in s.saved["rendezvous"]  # after `started`
    end = s.saved["end"]
    assert re.search(r"node1  rendezvous \S+:29500 is open\n", end), end
    assert re.search(r"run \S+ started; follow it with `fleet logs -f \S+`", end), end
    s.assert_clean()
    assert_nothing_left(tb, run_id_of(history), timeout=90)  # the job ends by itself
