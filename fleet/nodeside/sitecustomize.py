"""fleet's sitecustomize, on the PYTHONPATH of a fleet run's processes (<run dir>/site).

In a worker a launcher started (RANK and LOCAL_RANK in its environment), it records which global
rank this local rank is, in <run dir>/ranks/<local rank>, before the script prints anything:
that is how fleet tags log lines with global ranks where the rendezvous assigns them at launch
(c10d, or a process count torchrun decides). It also lets `fleet dump` take the worker's stack
(see _register_stack_dump). Nothing else changes, and the sitecustomize that
this one shadows (a distribution's, a virtualenv's) still runs after it."""

import os
import sys

from fleet.nodeside.shared.nodemap import RANKS, RUN_DIR_VAR, STACKS


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
try:
    _chain()
except Exception as e:  # as python does for a failing sitecustomize: say so, go on
    print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(e).__name__}: {e}",
          file=sys.stderr)
