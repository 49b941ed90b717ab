"""What `fleet ps` prints: the recorded runs (or the runs alive on an inventory's hosts) as a
table with a header, its columns as wide as their longest cell (a long state such as
"unreachable (may still be running)" moves no other column out of line), and words where
there is nothing to list."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.cli.app import echo

if TYPE_CHECKING:
    from fleet.run.record import RunRecord

RUNS = ("RUN", "STATE", "STARTED", "NODES")
ALIVE = ("RUN", "STATE", "HOST", "AS NODE")
NO_RUN = "no run recorded here (`fleet up JOB` starts one)"


def run_rows(runs: list[RunRecord], states: dict[str, str],
             nodes: dict[str, list[str]]) -> list[list[str]]:
    """One row a run: its id, its state as said, its start (local time), its hosts."""
    return [[r.run_id, states[r.run_id],
             time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started)),
             ",".join(nodes.get(r.run_id, []))] for r in runs]


def alive_rows(found: dict[str, list[str]]) -> list[list[str]]:
    """One row per run directory held on a host (`RUN/NODE` as the host's locks name it)."""
    return [[held.partition("/")[0], "running", host, held.partition("/")[2]]
            for host, held_there in found.items() for held in held_there]


def nothing_alive(path: Path, answered: int, unreachable: int) -> str:
    """`ps --hosts` when no host runs anything: said, naming how many hosts were asked."""
    hosts = f"{answered} host{'s' if answered != 1 else ''}"
    if not unreachable:
        return f"no run is running on any of the {hosts} of {path}" if answered > 1 else \
            f"no run is running on the one host of {path}"
    if not answered:
        return f"no host of {path} answered: nothing is known to run"
    return f"no run is running on the {hosts} of {path} that answered ({unreachable} " \
        "unreachable)"


def show(headers: tuple[str, ...], rows: list[list[str]]) -> None:
    """The table on stdout: drawn by rich to the terminal's width on a terminal, else plain
    columns two spaces apart (fleet.console.Console.table)."""
    from fleet.console import Console

    echo(Console().table(headers, rows))


def runs(records: list[RunRecord], all_runs: bool) -> None:
    """Each run with its state: its record's where finished, else asked (all runs at once)."""
    if not [r for r in records if not r.parent]:
        echo(NO_RUN)
        return
    from fleet.lifecycle import answers, attempts
    from fleet.transport.group import each, reason

    hosts_of = {r.run_id: [n.host.name for n in attempts.records(r)[-1].nodes]
                for r in records if not r.parent}
    records = [r for r in records if not r.parent]  # a restart's attempts: with their run
    records = records if all_runs else records[-10:]
    from fleet import waits
    from fleet.console import Console

    with waits.shown_by(Console().hosts_waiting):
        results = each(((r.run_id, r) for r in records), answers.ps_word)
    states = {k: r if isinstance(r, str) else f"unknown ({reason(r)})"
              for k, r in results.items()}
    show(RUNS, run_rows(records, states, hosts_of))


def alive(path: Path) -> int:
    """`ps --hosts`: the runs alive on the inventory's hosts, whoever started them; the exit
    code (3 when a host could not be asked)."""
    from fleet.config.inventory import Host, load_inventory
    from fleet.console import Console
    from fleet.errors import once
    from fleet.facts import run_state
    from fleet.transport import open_transport
    from fleet.transport.group import each, reason
    from fleet.waits import named

    inv = load_inventory(path)
    hosts = [h.name for h in inv.every_host]
    with Console().hosts_waiting("the runs on each host", hosts) as wait:
        def held(h: Host) -> list[str]:
            wait.start(h.name, "its connection")
            with open_transport(h) as t:
                wait.start(h.name, "")
                return run_state.held_by(t, f"{t.path(t.host.workdir)}/runs")

        results = each(named((h.name, h) for h in inv.every_host), wait.tracked(held))
    found = {name: r for name, r in results.items() if not isinstance(r, Exception)}
    for line in once({name: f"unreachable: {reason(r)}" for name, r in results.items()
                      if isinstance(r, Exception)}):
        echo(line, err=True)
    rows = alive_rows(found)
    if rows:
        show(ALIVE, rows)
    else:
        echo(nothing_alive(path, len(found), len(results) - len(found)))
    return 3 if len(found) < len(results) else 0
