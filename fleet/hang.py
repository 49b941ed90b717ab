"""Hangs: take every rank's stack on every node (fleet.stacks), say which rank is different,
and keep what was seen in the run's local record. Used by `fleet up`'s watchdog (then the run
is stopped) and by `fleet dump` (the run goes on)."""

from __future__ import annotations

import base64
import time
from pathlib import Path

from fleet import stacks
from fleet.group import each, reason
from fleet.shell import sh
from fleet.transport import Transport

FR_MAX_BYTES = 64 << 20  # a flight recorder dump larger than this stays on its node


def take(nodes: dict[str, tuple[Transport, str]], run_id: str,
         keep: Path | None = None, hung: bool = False) -> tuple[list[str], list[str]]:
    """(the report's lines, per node that could not be asked a line) for the nodes: name ->
    (transport, run dir), in order. NCCL flight recorder dumps are copied under `keep`. `hung`:
    the watchdog saw silence (the verdict's words depend on it)."""

    def one(pair: tuple[Transport, str]) -> stacks.NodeDump:
        t, run_dir = pair
        d = stacks.dump(t, run_dir, run_id)
        if keep is not None:
            keep_records(t, d, run_dir, keep)
        return d

    results = each(nodes.items(), one)
    dumps = [r for r in results.values() if isinstance(r, stacks.NodeDump)]
    problems = [f"{name}: could not take its stacks: {reason(r)}"
                for name, r in results.items() if isinstance(r, Exception)]
    return stacks.report(dumps, hung), problems


def keep_records(t: Transport, d: stacks.NodeDump, run_dir: str, keep: Path) -> None:
    """Copy a node's NCCL flight recorder dumps (those not too large) from its run dir, read
    through `t`, to keep/flight-recorder/<node>/."""
    for name, size in d.flight_records:
        if size <= FR_MAX_BYTES:
            fetch(t, f"{run_dir}/{name}", keep / "flight-recorder" / d.host / name)


def fetch(t: Transport, path: str, to: Path) -> None:
    """One file from the node, as base64 over the command channel (SFTP may be missing)."""
    out = t.run(sh("base64", path), timeout=120, what=f"read {path}").check(t.host.name).out
    to.parent.mkdir(parents=True, exist_ok=True)
    to.write_bytes(base64.b64decode("".join(out.split())))


def save(record_dir: Path, title: str, lines: list[str]) -> Path:
    """Keep a dump in the run's record: stacks-<time>.txt."""
    path = record_dir / f"stacks-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    path.write_text(title + "\n" + "\n".join(lines) + "\n")
    return path
