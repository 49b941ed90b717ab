"""The job of the straggler tests and of bench/straggler.py: a synchronous training step's shape,
compute (matmuls on one CPU thread, in `forward`) then a Gloo all_reduce of a 256 KiB gradient,
repeated for `--seconds`. Every `--every` steps each rank prints its mean step time and its
process's CPU time a step (every thread's):
`rank R on HOST step N step_s 0.2104 cpu_s 0.1311`.
The ranks end together, well: a rank whose time is up says so inside the all_reduce itself (its
first element), so every rank sees the same sum and none is left waiting for a rank that has
gone."""

from __future__ import annotations

import argparse
import socket
import time

import torch
import torch.distributed as dist

GRADIENT = 1 << 16  # floats all-reduced every step (256 KiB)


def forward(x: torch.Tensor, w: torch.Tensor, matmuls: int) -> torch.Tensor:
    for _ in range(matmuls):
        x = torch.tanh(x @ w)
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=90.0, help="how long the loop runs")
    ap.add_argument("--size", type=int, default=256, help="side of the square matrices")
    ap.add_argument("--matmuls", type=int, default=160, help="matmuls in a step")
    ap.add_argument("--every", type=int, default=5, help="steps between two lines")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    rank, host = dist.get_rank(), socket.gethostname()
    x = torch.randn(a.size, a.size)
    w = torch.randn(a.size, a.size) / a.size ** 0.5
    grad = torch.zeros(GRADIENT)
    print(f"rank {rank} on {host} ready", flush=True)
    start = last = time.monotonic()
    cpu = time.process_time()
    step = 0
    while True:
        y = forward(x, w, a.matmuls)
        grad.fill_(float(y.mean()))
        grad[0] = 1.0 if time.monotonic() - start >= a.seconds else 0.0
        dist.all_reduce(grad)
        step += 1
        if step % a.every == 0:
            now, used = time.monotonic(), time.process_time()
            print(f"rank {rank} on {host} step {step} step_s {(now - last) / a.every:.4f} "
                  f"cpu_s {(used - cpu) / a.every:.4f}", flush=True)
            last, cpu = now, used
        if grad[0].item() > 0:
            break
    print(f"rank {rank} on {host} done after {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
