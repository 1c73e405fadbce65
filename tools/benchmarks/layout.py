"""fedsim's image models in torch's default layout and channels-last, the layout :func:`fedsim.models.build_model`
gives them: one client's local epoch and one evaluation pass each way, on CPU.

For each model (``lenet5`` on 1x28x28, ``cnn`` on 1x28x28 and on 3x32x32, 10 classes): a local epoch of
``--steps`` SGD steps (momentum 0.9) at batch 32 through fedsim's own loop (``train_epochs``) from the same initial
weights, and the forward pass of one 512-row evaluation chunk. Prints the median milliseconds of ``--repeats``
runs of each (the two layouts in turn), their ratio, and the largest difference between the two layouts' weights
after the epoch. With torchvision installed, the same for FedOD's detector (``build_detector``, FedOD's defaults
on the ``scenes`` benchmark's 128x128 images, 4 classes): ``--detector-steps`` SGD steps of the FCOS loss at batch
16, and ``detect`` on 16 images.

    python -m tools.benchmarks.layout [--steps 16 --detector-steps 4 --threads 1 --repeats 11]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

from fedsim.data.base import ArraySplit
from fedsim.methods.common.training import CHUNK, train_epochs
from fedsim.models import build_model
from fedsim.optim import SGD
from tools.benchmarks.measure import machine

CASES = {
    "lenet5, 1x28x28": ("lenet5", (1, 28, 28)),
    "cnn, 1x28x28": ("cnn", (1, 28, 28)),
    "cnn, 3x32x32": ("cnn", (3, 32, 32)),
}


def interleaved_ms(functions: list, repeats: int) -> list[float]:
    """The median milliseconds of each function, run in turn ``repeats`` times (drift and warm-up hit all alike)."""
    for function in functions:
        function()  # warm-up: allocator, oneDNN's primitive cache
    times: list[list[float]] = [[] for _ in functions]
    for _ in range(repeats):
        for function, series in zip(functions, times):
            started = time.perf_counter()
            function()
            series.append(time.perf_counter() - started)
    return [1000 * statistics.median(series) for series in times]


def epoch(model, split: ArraySplit):
    trained = copy.deepcopy(model)
    optimizer = SGD(trained.parameters(), lr=0.05, momentum=0.9)
    train_epochs(trained, split, 1, 32, optimizer, seed=0, device=torch.device("cpu"))
    return trained


def compare_layouts(fast, train, evaluate, repeats: int) -> list[float]:
    """[train ms default, train ms channels-last, eval ms default, eval ms channels-last, weight difference] of
    ``fast`` (channels-last) and its copy in torch's default layout; ``train(model)`` trains a copy of ``model``
    and returns it (in training mode), ``evaluate(model)`` runs one evaluation pass."""
    plain = copy.deepcopy(fast).to(memory_format=torch.contiguous_format)
    figures = interleaved_ms([lambda m=m: train(m) for m in (plain, fast)], repeats)
    with torch.no_grad():
        plain.eval(), fast.eval()
        figures += interleaved_ms([lambda m=m: evaluate(m) for m in (plain, fast)], repeats)
    a, b = train(plain), train(fast)
    figures.append(max(float((p - q).detach().abs().max()) for p, q in zip(a.parameters(), b.parameters())))
    return figures


def compare(name: str, shape: tuple[int, ...], steps: int, repeats: int) -> list[float]:
    """:func:`compare_layouts` for a classifier: an epoch of ``train_epochs`` and one ``CHUNK``-row forward pass."""
    torch.manual_seed(0)
    fast = build_model(SimpleNamespace(name=name, hidden=84 if name == "lenet5" else 128), shape, 10)
    rng = np.random.default_rng(0)
    split = ArraySplit(rng.standard_normal((32 * steps, *shape), dtype=np.float32), rng.integers(0, 10, 32 * steps))
    chunk = torch.from_numpy(rng.standard_normal((CHUNK, *shape), dtype=np.float32))
    return compare_layouts(fast, lambda m: epoch(m, split), lambda m: m(chunk), repeats)


def compare_detector(steps: int, repeats: int) -> list[float]:
    """:func:`compare_layouts` for FedOD's detector: ``steps`` SGD steps of the FCOS loss and one ``detect``."""
    from fedsim.models.detector import DetectorSpec, build_detector

    fast = build_detector(DetectorSpec(num_classes=4, image_size=128), seed=0)
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(steps, 16, 3, 128, 128, generator=generator)
    corners = torch.rand(steps, 16, 2, generator=generator) * 64
    boxes = torch.cat([corners, corners + 24 + 40 * torch.rand(steps, 16, 2, generator=generator)], -1)
    labels = torch.randint(0, 4, (steps, 16), generator=generator)

    def train(model):
        trained = copy.deepcopy(model)
        trained.train()
        optimizer = SGD(trained.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
        for step in range(steps):
            targets = [{"boxes": b[None], "labels": y[None]} for b, y in zip(boxes[step], labels[step])]
            losses = trained.loss(trained.maps(images[step]), targets)
            optimizer.zero_grad()
            sum(losses.values()).backward()
            optimizer.step()
        return trained

    return compare_layouts(fast, train, lambda m: m.detect(images[0]), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16, help="SGD steps per epoch (16: 500 images at batch 32)")
    parser.add_argument("--detector-steps", type=int, default=4, help="the detector's SGD steps (batch 16)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"one client's epoch ({args.steps} steps at batch 32) and a {CHUNK}-row evaluation pass, "
        f"{args.threads} thread(s), {machine()}"
    )
    print(
        f"{'model':20s} {'epoch ms':>9s} {'channels-last':>13s} {'ratio':>6s} {'eval ms':>8s} "
        f"{'channels-last':>13s} {'ratio':>6s} {'max |dw|':>9s}"
    )
    rows = {label: (compare, (name, shape, args.steps)) for label, (name, shape) in CASES.items()}
    try:
        import torchvision  # noqa: F401 (the detection extra)

        rows["detector, 3x128x128"] = (compare_detector, (args.detector_steps,))
    except (ImportError, RuntimeError) as exc:
        print(f"detector left out: torchvision does not import ({type(exc).__name__})")
    for label, (function, arguments) in rows.items():
        train, train_cl, ev, ev_cl, diff = function(*arguments, args.repeats)
        print(
            f"{label:20s} {train:9.1f} {train_cl:13.1f} {train_cl / train:5.2f}x {ev:8.1f} {ev_cl:13.1f} "
            f"{ev_cl / ev:5.2f}x {diff:9.1e}"
        )


if __name__ == "__main__":
    main()
