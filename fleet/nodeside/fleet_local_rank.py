"""Runs a script written for `python -m torch.distributed.launch` under torchrun: the local rank
as an argument, spelt as the script parses it (--local-rank, or --local_rank before torch 2.0).

    python -m torch.distributed.run ... fleet_local_rank.py FLAG (SCRIPT | -m MODULE) [ARGS...]
"""

import os
import runpy
import sys


def main() -> None:
    flag, rest = sys.argv[1], sys.argv[2:]
    local = os.environ["LOCAL_RANK"]
    if rest[0] == "-m":
        module, args = rest[1], rest[2:]
        sys.argv = [module, f"{flag}={local}", *args]
        sys.path[0] = os.getcwd()  # as `python -m` has it
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = rest[0], rest[1:]
        sys.argv = [script, f"{flag}={local}", *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
