"""`fleet check --collective`: a short all_reduce across every node, bandwidth per message size.

NCCL where GPUs exist, else Gloo on CPU. Rank 0 prints one line per size: the time per
all_reduce, and the algorithm and bus bandwidth as nccl-tests define them
(busbw = algbw * 2 (n - 1) / n).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

SIZES = (1 << 10, 64 << 10, 1 << 20, 8 << 20, 32 << 20)  # bytes
BUDGET_S = 1.5  # per size, after warm-up


def main() -> None:
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    if rank == 0:
        print(f"all_reduce over {world} ranks ({dist.get_backend()}), float32", flush=True)
        print(f"{'size':>10} {'time/op':>10} {'algbw':>12} {'busbw':>12}", flush=True)
    for size in SIZES:
        x = torch.ones(size // 4, device=device)
        for _ in range(2):
            dist.all_reduce(x)
        # Every rank must run the same count: rank 0 sizes it from a short trial, for everyone.
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(x)
        trial = (time.perf_counter() - t0) / 3
        count = torch.tensor([max(3, min(1000, int(BUDGET_S / max(trial, 1e-6))))],
                             device=device)
        dist.broadcast(count, 0)
        iters = int(count.item())
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        per_op = (time.perf_counter() - start) / iters
        algbw = size / per_op / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print(f"{_human(size):>10} {per_op * 1e3:>8.2f}ms {algbw:>8.3f} GB/s "
                  f"{busbw:>8.3f} GB/s", flush=True)
    dist.destroy_process_group()


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} TiB"


if __name__ == "__main__":
    main()
