"""A script in the style of PyTorch's ImageNet example: it takes its own distributed arguments
(--dist-url tcp://IP:PORT --world-size NODES --rank NODE --multiprocessing-distributed) and
spawns one worker per local device itself. fleet runs it with `launcher = "command"`.
"""

from __future__ import annotations

import argparse
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(local: int, args: argparse.Namespace, per_node: int) -> None:
    rank = args.rank * per_node + local
    world = args.world_size * per_node
    dist.init_process_group("gloo", init_method=args.dist_url, world_size=world, rank=rank)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    ok = value.item() == world * (world + 1) / 2
    # One write per line: the workers share a stdout, and print() writes the newline apart.
    sys.stdout.write(f"spawned rank {rank}/{world} on {socket.gethostname()}: "
                     f"sum = {value.item():g} {'ok' if ok else 'WRONG'}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dist-url", required=True)
    p.add_argument("--world-size", type=int, required=True, help="number of nodes")
    p.add_argument("--rank", type=int, required=True, help="node rank")
    p.add_argument("--procs", type=int, default=2, help="workers per node")
    p.add_argument("--multiprocessing-distributed", action="store_true")
    args = p.parse_args()
    per_node = args.procs if args.multiprocessing_distributed else 1
    if per_node > 1:
        mp.spawn(worker, nprocs=per_node, args=(args, per_node))
    else:
        worker(0, args, 1)


if __name__ == "__main__":
    main()
