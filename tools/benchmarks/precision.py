"""One training step of the TEP windows' 1-D CNN (34 variables x 600 steps, 29 classes) in float32 and under bfloat16
autocast (``run.precision``), on the CPU (one torch thread unless ``--threads``) or ``--device cuda``.

    python -m tools.benchmarks.precision [--batch 32] [--steps 10] [--threads 1] [--device cpu]

Prints the median milliseconds of one SGD step (forward, backward, update) for each precision and their ratio, after
three untimed warm-up steps; the step is the training loop's (``fedsim.methods.common.training``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

from fedsim.methods.common import precision
from fedsim.models import build_model
from fedsim.optim import SGD


def step_ms(mode: str, batch: int, steps: int, device: torch.device) -> float:
    torch.manual_seed(0)
    model = build_model(SimpleNamespace(name="auto", hidden=128), (34, 600), 29).to(device).train()
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(batch, 34, 600, device=device), torch.randint(0, 29, (batch,), device=device)
    times = []
    with precision.using(mode):
        for index in range(steps + 3):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            with precision.autocast(device):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            if index >= 3:
                times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    fp32 = step_ms("fp32", args.batch, args.steps, device)
    bf16 = step_ms("bf16", args.batch, args.steps, device)
    print(f"TEP windows CNN, batch {args.batch}, {device} ({args.threads} thread(s)), torch {torch.__version__}")
    print(f"fp32 {fp32:8.1f} ms a step\nbf16 {bf16:8.1f} ms a step\nbf16 / fp32 speed-up {fp32 / bf16:.2f}x")


if __name__ == "__main__":
    main()
