"""Trains a small CNN on MNIST with DistributedDataParallel, on GPUs (NCCL) or CPUs (Gloo).

Launched by torchrun (through `fleet up jobs/mnist.toml`), so RANK, LOCAL_RANK and WORLD_SIZE
come from the environment. The data comes from --data (default: $FLEET_DATA_DIR, which fleet
fills by syncing the job's data directory to every node); nothing is downloaded unless
--download is given, and then with certificate checks left on.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("FLEET_DATA_DIR", "data"))
    p.add_argument("--download", action="store_true", help="download MNIST if it is missing")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--log-every", type=int, default=20, help="batches between loss lines")
    p.add_argument("--checkpoint", default="checkpoints/mnist.pt",
                   help="written by rank 0 after every epoch (relative to the code dir)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--fail-after", type=int, default=-1,
                   help="(testing) raise on rank --fail-rank after this many batches")
    p.add_argument("--fail-rank", type=int, default=-1)
    return p.parse_args()


def setup() -> tuple[torch.device, int, int]:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        # Before any CUDA work: otherwise every process also allocates a context on GPU 0.
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    return device, dist.get_rank(), dist.get_world_size()


def load_data(args: argparse.Namespace, rank: int) -> tuple[datasets.MNIST, datasets.MNIST]:
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    if args.download and rank == 0:
        datasets.MNIST(args.data, train=True, download=True)
        datasets.MNIST(args.data, train=False, download=True)
    if args.download:
        dist.barrier()
    try:
        train = datasets.MNIST(args.data, train=True, transform=tf, download=False)
        test = datasets.MNIST(args.data, train=False, transform=tf, download=False)
    except RuntimeError as e:
        raise SystemExit(f"MNIST not found under {Path(args.data).resolve()}: give the job a "
                         "`data` directory (see jobs/make_mnist.py) or pass --download") from e
    return train, test


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    model.eval()
    counts = torch.zeros(2, device=device)  # correct, total: summed over every rank
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            counts[0] += (model(x).argmax(1) == y).sum()
            counts[1] += y.numel()
    dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


@record
def main() -> None:
    args = parse_args()
    device, rank, world = setup()
    train_set, test_set = load_data(args, rank)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    test_sampler = DistributedSampler(test_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    torch.manual_seed(0)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    ckpt_path = Path(args.checkpoint)
    # fleet's [restart] starts attempt 2, 3, ... with FLEET_ATTEMPT set: resume by ourselves,
    # from scratch where no checkpoint was written yet (or rank 0 is a spare, new to the run).
    restarted = int(os.environ.get("FLEET_ATTEMPT", "1")) > 1
    if args.resume or restarted:
        # Rank 0 reads the file (it is on rank 0's node) and hands it to every other rank.
        box = [torch.load(ckpt_path, map_location="cpu") if rank == 0 and ckpt_path.exists()
               else None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None and not restarted:
            raise SystemExit(f"--resume: no checkpoint at {ckpt_path.resolve()} on rank 0")
        if box[0] is None:
            if rank == 0:
                print(f"attempt {os.environ['FLEET_ATTEMPT']}: no checkpoint at {ckpt_path} "
                      "on rank 0: from the start", flush=True)
        else:
            model.load_state_dict(box[0]["model"])
            optimizer.load_state_dict(box[0]["optimizer"])
            start_epoch = box[0]["epoch"] + 1
            if rank == 0:
                print(f"resumed from {ckpt_path} (epoch {start_epoch - 1} done, accuracy "
                      f"{box[0]['accuracy']:.4f})", flush=True)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    if rank == 0:
        print(f"training on {world} process(es), {device.type}, {len(train_set)} images, "
              f"epochs {start_epoch}..{args.epochs - 1}", flush=True)
    step = 0
    for epoch in range(start_epoch, args.epochs):
        train_sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on all ranks
        t0 = t_step = time.monotonic()
        for batch, (x, y) in enumerate(train_loader):
            if step == args.fail_after and rank == args.fail_rank:
                raise RuntimeError(f"injected failure on rank {rank} after {step} batches")
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and batch % args.log_every == 0:
                print(f"epoch {epoch} batch {batch}/{len(train_loader)} loss {loss.item():.4f}",
                      flush=True)
            if (batch + 1) % args.log_every == 0:  # every rank: its own step time (fleet ui)
                now = time.monotonic()
                print(f"step {step} time {(now - t_step) / args.log_every * 1e3:.1f} ms",
                      flush=True)
                t_step = now
        accuracy = evaluate(ddp, test_loader, device)
        if rank == 0:
            print(f"epoch {epoch} done in {time.monotonic() - t0:.1f}s: test accuracy "
                  f"{accuracy:.4f}", flush=True)
            ckpt_path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "accuracy": accuracy}, ckpt_path)
    if rank == 0:
        print("done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
