"""`fleet doctor`'s ring all-reduce: one process per node, a 1 MiB float32 all_reduce a few
times (NCCL on GPU 0 where torch sees a GPU, else Gloo), over the interface fleet chose; rank 0
prints "busbw BACKEND BYTES_PER_S" as nccl-tests define the bus bandwidth (algbw * 2 (n - 1) /
n), or "fail WHY". Argv: MASTER_ADDR PORT RANK WORLD INTERFACE ("-": let torch choose). Run
with the node's python -I (torch is the one import beyond the standard library), bounded by
`timeout` on the node."""

from __future__ import annotations

import os
import sys
import time

SIZE = 1 << 20
ITERS = 5


def main(argv: list[str]) -> int:
    addr, port, rank, world, iface = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    if iface != "-":
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = iface
    try:
        import datetime

        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        backend = "nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(0)
        host = f"[{addr}]" if ":" in addr else addr
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        x = torch.ones(SIZE // 4, device="cuda" if cuda else "cpu")
        dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(x)
        if cuda:
            torch.cuda.synchronize()
        per_op = (time.perf_counter() - t0) / ITERS
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - said to fleet, which names the host
        print("fail", " ".join(f"{type(e).__name__}: {e}".split())[:300], flush=True)
        return 0
    if rank == 0:
        print("busbw", backend, f"{SIZE / per_op * 2 * (world - 1) / world:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
