"""Runs the benchmarks: `python -m bench.run [--quick] [--only NAME]`, tables on stdout."""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.common import ROOT, Config, Table, snapshot
from tests.testbed import available

BENCHMARKS = ("start", "fanout", "teardown", "end", "stop", "logs", "footprint", "sync", "data",
              "restart", "scale", "doctor", "straggler", "queue")


def machine() -> str:
    mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
    return (f"{os.cpu_count()} CPU cores, {int(mem) / 2**20:.0f} GiB, {platform.system()} "
            f"{platform.release()}, python {platform.python_version()}; every host is a network "
            "namespace of this one machine (tests/testbed.py)")


def run_one(name: str, cfg: Config) -> tuple[list[Table], str | None]:
    module = importlib.import_module(f"bench.{name}")
    try:
        return module.run(cfg), None
    except Exception:
        return [], traceback.format_exc()


def interrupt(signum: int, frame: object) -> None:
    """SIGTERM or SIGHUP: unwind like Ctrl-C, so that every testbed is torn down."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer repeats and host counts")
    ap.add_argument("--only", choices=BENCHMARKS, action="append",
                    help="run only this benchmark (repeatable)")
    ap.add_argument("--out", type=Path, help="also write the tables (markdown) to this file")
    args = ap.parse_args(argv)
    why = available()
    if why is not None:
        print(f"bench: the testbed cannot run here: {why}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with `&`
    os.chdir(ROOT)
    snap = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    try:
        cfg = Config(quick=args.quick)
        return run_all(cfg, args.only or list(BENCHMARKS), args.out, snapshot(snap))
    finally:
        shutil.rmtree(snap, ignore_errors=True)


def run_all(cfg: Config, names: list[str], out: Path | None, source: str) -> int:
    header = (f"fleet benchmarks ({'quick' if cfg.quick else 'full'}), "
              f"{time.strftime('%Y-%m-%d %H:%M')}\n\nmachine: {machine()}"
              + "; every host has PID, mount and UTS namespaces of its own\n\n"
              f"fleet: {source} (a copy taken at the start is what runs)\n")
    print(header, flush=True)
    parts, failed = [header], []
    start = time.monotonic()
    for name in names:
        t0 = time.monotonic()
        tables, error = run_one(name, cfg)
        for table in tables:
            text = table.render()
            print(text + "\n", flush=True)
            parts.append(text + "\n")
            failed += [f"{name}: {p}" for p in table.problems]
        if error:
            print(f"bench: {name} FAILED:\n{error}", file=sys.stderr, flush=True)
            failed.append(f"{name}: {error.strip().splitlines()[-1]}")
        print(f"({name}: {time.monotonic() - t0:.0f} s)\n", flush=True)
    print(f"total {time.monotonic() - start:.0f} s", flush=True)
    if out:
        out.write_text("\n".join(parts))
    for f in failed:
        print(f"bench: problem: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
