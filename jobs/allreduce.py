"""A tiny all_reduce: every rank adds its rank+1; each prints rank, host and the reduced value."""

import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(device)
    value = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    status = "ok" if value.item() == expected else f"WRONG (expected {expected:g})"
    print(f"rank {rank}/{world} on {socket.gethostname()}: all_reduce = {value.item():g} {status}",
          flush=True)
    dist.destroy_process_group()
    if status != "ok":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
