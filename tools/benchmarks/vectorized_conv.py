"""K LeNet-5 clients' local SGD four ways on CPU: the loop in torch's default layout, the loop with the
convolution weights channels-last (as :func:`fedsim.models.build_model` holds them), ``vmap`` over stacked
parameters (a grouped convolution underneath), and im2col + batched matmul (``unfold`` then ``baddbmm`` per
convolution).

Each client runs ``--steps`` SGD steps (momentum 0.9) at batch 32 on random 28x28 images, one torch thread by
default. The two batched forms hold every client's parameters in one tensor per layer and take one backward pass
for all clients. Prints the median seconds of ``--repeats`` runs of each form and its ratio to the loop. This is
the measurement behind the rule of ``resources.vectorize: auto`` that convolutional models keep the loop on CPU,
and behind their channels-last layout (docs/performance.md).

    python -m tools.benchmarks.vectorized_conv [--clients 10 --steps 16 --threads 1 --repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from tools.benchmarks.measure import machine


def lenet() -> nn.Sequential:
    """The layers of fedsim's ``lenet5`` (fedsim/models/lenet5.py) on 1x28x28 inputs, 10 classes."""
    return nn.Sequential(
        *(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2)),
        *(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10)),
    )


def conv_unfold(x, weight, bias, padding):
    """im2col + batched matmul: x [K, B, C, H, W], weight [K, O, C, k, k] -> [K, B, O, H', W']."""
    clients, batch, channels, height, _ = x.shape
    out_channels, size = weight.shape[1], weight.shape[3]
    cols = F.unfold(x.reshape(clients * batch, channels, height, -1), size, padding=padding)
    side = height + 2 * padding - size + 1
    cols = cols.view(clients, batch, -1, side * side).transpose(1, 2).reshape(clients, channels * size * size, -1)
    out = torch.baddbmm(bias.view(clients, out_channels, 1), weight.view(clients, out_channels, -1), cols)
    return out.view(clients, out_channels, batch, side, side).transpose(1, 2)


def conv_grouped(x, weight, bias, padding):
    """What ``vmap`` makes of a convolution: one grouped convolution, the clients as groups."""
    clients, batch, channels = x.shape[:3]
    out_channels = weight.shape[1]
    folded = x.transpose(0, 1).reshape(batch, clients * channels, *x.shape[3:])
    out = F.conv2d(folded, weight.flatten(0, 1), bias.flatten(), padding=padding, groups=clients)
    return out.view(batch, clients, out_channels, *out.shape[2:]).transpose(0, 1)


def batched_forward(params: list, x: torch.Tensor, conv) -> torch.Tensor:
    def pool(h):
        return F.max_pool2d(h.flatten(0, 1), 2).unflatten(0, h.shape[:2])

    def linear(h, weight, bias):
        return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))

    h = pool(F.relu(conv(x, params[0], params[1], 2)))
    h = pool(F.relu(conv(h, params[2], params[3], 0))).flatten(2)
    h = F.relu(linear(h, params[4], params[5]))
    return linear(F.relu(linear(h, params[6], params[7])), params[8], params[9])


def run_batched(models, xs, ys, conv) -> None:
    params = [
        torch.stack([p.detach() for p in group]).requires_grad_(True)
        for group in zip(*(m.parameters() for m in models))
    ]
    buffers = [torch.zeros_like(p) for p in params]
    clients, steps, batch = ys.shape
    for step in range(steps):
        logits = batched_forward(params, xs[:, step], conv)
        loss = F.cross_entropy(logits.flatten(0, 1), ys[:, step].flatten(), reduction="none").view(clients, batch)
        grads = torch.autograd.grad(loss.mean(1).sum(), params)
        with torch.no_grad():
            for p, g, b in zip(params, grads, buffers):
                p.sub_(0.05 * b.mul_(0.9).add_(g))


def run_loop(models, xs, ys) -> None:
    for k, model in enumerate(models):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(ys.shape[1]):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(xs[k, step]), ys[k, step]).backward()
            optimizer.step()


def median_seconds(function, repeats: int) -> float:
    function()  # warm-up: lazy imports, allocator
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--steps", type=int, default=16, help="SGD steps per client (16: 500 images at batch 32)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = [lenet() for _ in range(args.clients)]
    xs = torch.randn(args.clients, args.steps, 32, 1, 28, 28)
    ys = torch.randint(0, 10, (args.clients, args.steps, 32))
    channels_last = [copy.deepcopy(model).to(memory_format=torch.channels_last) for model in models]
    forms = {
        "loop (one client after the other)": lambda: run_loop(models, xs, ys),
        "loop, channels-last weights": lambda: run_loop(channels_last, xs, ys),
        "vmap form (grouped convolution)": lambda: run_batched(models, xs, ys, conv_grouped),
        "im2col + batched matmul": lambda: run_batched(models, xs, ys, conv_unfold),
    }
    print(f"LeNet-5, {args.clients} clients x {args.steps} steps at batch 32, {args.threads} thread(s), {machine()}")
    loop = None
    for label, function in forms.items():
        seconds = median_seconds(function, args.repeats)
        loop = loop or seconds
        print(f"{label:36s} {seconds:7.3f} s  {seconds / loop:5.2f}x the loop")


if __name__ == "__main__":
    main()
