"""`fleet doctor`'s look at one node: its CPUs (cores this process may use, the share of time
the hypervisor stole over an interval, thermal throttling in that interval), its memory, and
its disk in the workdir (a bounded file written and flushed to the device, then read back with
the page cache dropped for it, then removed). One line per figure ("KEY VALUE..."), a line
"error KEY WHY" where a figure could not be taken. Argv: DIRECTORY BYTES SECONDS. Run with the
node's python -I -S, standard library only, Python 3.8+."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import sys
import time

BLOCK = 1 << 20


def _ticks() -> tuple[int, int]:
    """(all ticks, steal ticks) of /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu "):
                values = [int(v) for v in line.split()[1:]]
                return sum(values[:8]), values[7] if len(values) > 7 else 0
    raise OSError("no cpu line in /proc/stat")


def _throttles() -> int:
    total = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/thermal_throttle/core_throttle_count"):
        try:
            with open(path) as f:
                total += int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
    return total


def cpu(seconds: float) -> None:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 0
    print("cores", cores, os.cpu_count() or 0)
    try:
        a, throttled = _ticks(), _throttles()
        time.sleep(seconds)
        b = _ticks()
        print("steal", b[1] - a[1], b[0] - a[0])
        print("throttle", _throttles() - throttled)
    except (OSError, ValueError) as e:
        print("error cpu", e)


def memory() -> None:
    try:
        with open("/proc/meminfo") as f:
            kib = {k.strip(): v.split()[0] for k, _, v in (line.partition(":") for line in f)
                   if v.strip()}
        print("memory", int(kib["MemTotal"]) * 1024, int(kib.get("MemAvailable", 0)) * 1024)
    except (OSError, KeyError, ValueError, IndexError) as e:
        print("error memory", e)


def disk(directory: str, size: int) -> None:
    path = os.path.join(os.path.expanduser(directory), f".fleet-doctor-{os.getpid()}")
    block = os.urandom(BLOCK)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            t0 = time.perf_counter()
            done = 0
            while done < size:
                done += os.write(fd, block[:min(BLOCK, size - done)])
            os.fdatasync(fd)
            print("write", done, f"{time.perf_counter() - t0:.6f}")
            if hasattr(os, "posix_fadvise"):  # the read must come from the device
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            t0 = time.perf_counter()
            got = 0
            while True:
                part = os.read(fd, BLOCK)
                if not part:
                    break
                got += len(part)
            print("read", got, f"{time.perf_counter() - t0:.6f}")
        finally:
            os.close(fd)
    except OSError as e:
        print("error disk", " ".join(str(e).split()))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _ended(signum: int, frame: object) -> None:
    raise SystemExit(1)  # `timeout` ends it: the file is still removed (finally)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _ended)
    cpu(float(argv[2]))
    memory()
    disk(argv[0], int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
