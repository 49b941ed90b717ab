"""fleet's sitecustomize, on the PYTHONPATH of a fleet run's processes (<run dir>/site).

In a worker a launcher started (RANK and LOCAL_RANK in its environment), it records which global
rank this local rank is, in <run dir>/ranks/<local rank>, before the script prints anything:
that is how fleet tags log lines with global ranks where the rendezvous assigns them at launch
(c10d, or a process count torchrun decides). It also lets `fleet dump` take the worker's stack
(see _register_stack_dump), and samples where the worker spends its time for `fleet top` and the
straggler watch (see _start_sampler; FLEET_SAMPLING=0 turns it off). Nothing else changes, and
the sitecustomize that this one shadows (a distribution's, a virtualenv's) still runs after
it."""

import os
import sys

from fleet.nodeside.shared.nodemap import RANKS, RUN_DIR_VAR, SAMPLES, SAMPLING_VAR, STACKS
from fleet.nodeside.shared.sampling import (
    SAMPLE_HZ,
    WRITE_S,
    Window,
    cgroup_cpu_stat,
    classify,
    stack,
    throttling,
)


def _record_rank() -> None:
    run_dir, rank, local = (os.environ.get(k) for k in (RUN_DIR_VAR, "RANK", "LOCAL_RANK"))
    if not (run_dir and rank and local and rank.isdigit() and local.isdigit()):
        return
    ranks = os.path.join(run_dir, RANKS)
    try:
        os.makedirs(ranks, exist_ok=True)
        tmp = os.path.join(ranks, f".{local}.{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(rank + "\n")
        os.replace(tmp, os.path.join(ranks, local))
    except OSError:
        pass  # never the reason a job fails


def _register_stack_dump() -> None:
    """In a worker, Python's faulthandler writes every thread's stack to <run dir>/stacks/<pid>
    on SIGRTMIN+7, a signal nothing sends but `fleet dump` (and fleet's hang watchdog): the
    job behaves exactly as before until one is asked for."""
    run_dir, rank, local = (os.environ.get(k) for k in (RUN_DIR_VAR, "RANK", "LOCAL_RANK"))
    if not (run_dir and rank and rank.isdigit()):
        return
    import faulthandler
    import signal

    global _stack_file
    sig = int(signal.SIGRTMIN) + 7
    stacks = os.path.join(run_dir, STACKS)
    pid = os.getpid()
    try:
        os.makedirs(stacks, exist_ok=True)
        # Appending: fleet empties the file before each dump, and the next one starts at 0.
        _stack_file = open(os.path.join(stacks, str(pid)), "a")  # noqa: SIM115 (kept open)
        faulthandler.register(sig, file=_stack_file, all_threads=True, chain=False)
        tmp = os.path.join(stacks, f".{pid}.who")
        with open(tmp, "w") as f:
            f.write(f"rank={rank} local={local or ''}\nsig={sig}\n")
        os.replace(tmp, os.path.join(stacks, f"{pid}.who"))
    except (OSError, ValueError, RuntimeError):
        pass  # never the reason a job fails


_stack_file = None


def _start_sampler() -> None:
    """In a worker, a daemon thread that looks at the main thread's stack SAMPLE_HZ times a
    second and writes where it was to <run dir>/samples/<pid> every WRITE_S
    (fleet/nodeside/shared/sampling.py). No signal and no ptrace: the job sees nothing of it but
    a thread that sleeps. It ends by itself once its file cannot be written."""
    run_dir, rank, local = (os.environ.get(k) for k in (RUN_DIR_VAR, "RANK", "LOCAL_RANK"))
    if not (run_dir and rank and rank.isdigit()) or os.environ.get(SAMPLING_VAR) == "0":
        return
    import threading
    import time

    main = threading.main_thread().ident or 0
    pid = os.getpid()
    out = os.path.join(run_dir, SAMPLES, str(pid))
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
    except OSError:
        return
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def counters() -> tuple[int, int] | tuple[None, None]:
        # Looked up each time: a process can be moved to another cgroup while it runs.
        try:
            with open("/proc/self/cgroup") as f:
                stats = cgroup_cpu_stat(f.read())
        except OSError:
            stats = []
        stat = next((p for p in stats if os.path.isfile(p)), None)
        if stat is None:
            return None, None
        try:
            with open(stat) as f:
                got = throttling(f.read())
        except OSError:
            got = None
        return got if got is not None else (None, None)

    def rss() -> int | None:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            return None

    def loop() -> None:
        w = Window()
        step = 1.0 / SAMPLE_HZ
        failures = 0
        written = 0.0
        was_joined = False
        while failures < 5:
            time.sleep(step)
            frames = stack(sys._current_frames().get(main))  # noqa: SLF001 (its one view)
            now = time.time()
            w.add(now, *classify(frames))
            if now - written < WRITE_S:
                continue
            written = now
            w.mark(now, time.process_time(), *counters())
            dist = sys.modules.get("torch.distributed")
            try:
                joined = bool(dist is not None and dist.is_available() and dist.is_initialized())
            except Exception:  # noqa: BLE001 - a half-imported torch: not joined yet
                joined = False
            if joined and not was_joined:  # the import and the rendezvous are no step's compute
                w = Window()
                w.mark(now, time.process_time(), *counters())
            was_joined = joined
            text = w.summary(int(rank), int(local) if local and local.isdigit() else -1, pid,
                             joined, now, rss())
            try:
                tmp = f"{out}.tmp"
                with open(tmp, "w") as f:
                    f.write(text)
                os.replace(tmp, out)
                failures = 0
            except OSError:
                failures += 1

    threading.Thread(target=loop, name="fleet-sampler", daemon=True).start()


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one this file shadows."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_record_rank()
_register_stack_dump()
_start_sampler()
try:
    _chain()
except Exception as e:  # as python does for a failing sitecustomize: say so, go on
    print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}",
          file=sys.stderr)
