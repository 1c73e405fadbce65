"""Each paper's trial on the CPU and on the GPU: wall seconds, speed-up and the GPU's busy share.

    python -m tools.benchmarks.gpu_check [--cpu-only] [--papers feddadil,fada,fedod] [--cpus-per-client 1]
                                         [--no-ray] [--no-kernels]

Without CUDA it prints one line saying so and exits 0; ``--cpu-only`` first times the CPU trials. With CUDA, for
each paper one small trial (:data:`TRIALS`, a few rounds of its experiment on fewer images) runs twice in this
process, every client on the CPU (``resources.cpus_per_client`` torch threads), then every client on ``cuda``: the
local backend's round loop with the clients' device that the Ray backend gives a client actor with
``--gpus-per-client`` (:class:`DeviceExecutor`). Each row prints as soon as it is measured: paper, trial, CPU
seconds, GPU seconds, speed-up, the GPU's busy share, peak GPU memory and both runs' target accuracy. Then, unless
``--no-ray``, the FADA trial once more through Ray with 0.5 GPU per client actor (cluster start included), and,
unless ``--no-kernels``, the milliseconds of one training step of a digits CNN and of FedOD's detector in torch's
default layout, channels-last, and channels-last under bfloat16 autocast (fedsim uses channels-last and float32).

Busy share: NVML's GPU utilization (the share of its last sample period, 1/6 s to 1 s, in which a kernel ran),
read with ``torch.cuda.utilization()`` (or ``nvidia-smi`` where pynvml is missing) every 0.1 s in a thread while the
trial runs, averaged. Times are wall seconds of the round loop, the clients' data loaded from the disk cache in it
(built before the first run), after an untimed warm-up run of the same stages on each device (:data:`WARMUP`).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from fedsim.api import checked_federation, make_config, run_experiment
from fedsim.data.scenario import forget_domain_data, load_client_data
from fedsim.errors import first_line
from fedsim.runtime import LocalExecutor, Server, Simulator

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["run.tensorboard=false", "run.checkpoint_every=0", "run.progress=false"]
TRIALS = {
    "feddadil": (
        "FedDaDiL, digits -> usps, 3 rounds (1 encoder round), 1000 images/domain",
        None,
        ["method.name=feddadil", "data.benchmark=digits", "data.target=usps", "run.rounds=3", "run.eval_every=3"]
        + ["method.encoder_rounds=1", "data.max_train_per_domain=1000"],
    ),
    "fada": (
        "FADA III, digits -> usps, 2 rounds, 1000 images/domain",
        "experiments/configs/digits-fada.yaml",
        ["data.target=usps", "run.rounds=2", "data.max_train_per_domain=1000"],
    ),
    "fedod": (
        "FedOD, scenes 128 px -> dusk, 2 rounds (the last evaluated), 40 base / 20 client / 20 distill steps",
        "experiments/configs/scenes-fedod.yaml",
        ["run.rounds=2", "run.eval_every=2", "method.base_iters=40", "method.client_iters=20"]
        + ["method.distill_iters=20"],
    ),
}
"""paper -> (trial, config file or None, dotted settings): the papers' settings (experiments/specs/*.yaml), fewer
rounds and images than a full trial, more than ``--quick``."""
WARMUP = {
    "feddadil": ("run.rounds=2", "run.eval_every=2", "data.max_train_per_domain=50"),
    "fada": ("run.rounds=1", "data.max_train_per_domain=50"),
    "fedod": ("data.variant=tiny", "run.rounds=1", "run.eval_every=1", "method.base_iters=1", "method.client_iters=1")
    + ("method.distill_iters=1",),
}
"""paper -> settings of an untimed run of the same stages on each device before the timed ones: the imports, the
CUDA modules and the kernels' first calls are not counted in either column."""
RAY_GPUS_PER_CLIENT = 0.5
SAMPLE_S = 0.1


class DeviceExecutor(LocalExecutor):
    """The local backend's executor with every client on ``device`` (as a Ray client actor with GPUs runs them)."""

    def __init__(self, config, federation, device: str):
        super().__init__(config, federation, device=device)


def utilization_reader() -> tuple[str, Optional[Callable[[], float]]]:
    """(how the GPU's utilization is read, a function giving it in percent), or (reason, None) when it cannot be."""
    try:
        torch.cuda.utilization()
        return "torch.cuda.utilization() (NVML)", torch.cuda.utilization
    except Exception:  # noqa: BLE001 (pynvml missing or NVML refused: try the command line)
        pass
    command = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
    try:
        subprocess.run(command, capture_output=True, check=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "not readable (no pynvml, no nvidia-smi)", None
    return "nvidia-smi utilization.gpu", lambda: float(
        subprocess.run(command, capture_output=True, text=True).stdout.split()[0]
    )


class BusySampler:
    """The GPU's utilization read every :data:`SAMPLE_S` seconds in a thread while the ``with`` block runs."""

    def __init__(self, read: Optional[Callable[[], float]]):
        self.read, self.samples = read, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            try:
                self.samples.append(float(self.read()))
            except Exception:  # noqa: BLE001 (one failed read leaves a gap, not a crash of the check)
                pass

    def __enter__(self) -> "BusySampler":
        if self.read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def share(self) -> Optional[float]:
        """The mean utilization as a share in [0, 1]; None without samples."""
        return statistics.fmean(self.samples) / 100 if self.samples else None


def trial_config(paper: str, cpus_per_client: float, extra: tuple[str, ...] = ()):
    _, path, settings = TRIALS[paper]
    values = dict(item.split("=", 1) for item in [*settings, *COMMON, f"resources.cpus_per_client={cpus_per_client}"])
    values.update(item.split("=", 1) for item in extra)
    return make_config(ROOT / path if path else None, set={"run.backend": "local", **values})


def prepared_federation(config):
    """The trial's federation, every client's data built and cached on disk first and then let go: each timed run
    loads the same files."""
    federation = checked_federation(config)
    for client_id in federation.client_ids:
        load_client_data(config.data, federation, client_id)
    forget_domain_data(config.data)
    return federation


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing to wait for elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_trial(config, federation, device: torch.device) -> tuple[float, dict]:
    """Wall seconds of the trial's round loop with every client on ``device``, and its summary."""
    server = Server(config, federation, DeviceExecutor(config, federation, str(device)))
    try:
        sync(device)
        started = time.perf_counter()
        summary = Simulator(config, server, None).run()
        sync(device)
        return time.perf_counter() - started, summary
    finally:
        server.close()


def fmt(value: Optional[float], spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def paper_row(paper: str, args, read) -> None:
    """Time one paper's trial on the CPU (and on the GPU when there is one); print its row."""
    label = TRIALS[paper][0]
    config = trial_config(paper, args.cpus_per_client)
    federation = prepared_federation(config)
    warm = trial_config(paper, args.cpus_per_client, WARMUP[paper])
    warm_federation = prepared_federation(warm)
    for device in [torch.device("cpu")] + ([] if args.cpu_only else [args.device]):
        timed_trial(warm, warm_federation, device)
    cpu_s, cpu_summary = timed_trial(config, federation, torch.device("cpu"))
    gpu_s = busy = peak = gpu_summary = None
    if not args.cpu_only:
        cuda = args.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(args.device)
        with BusySampler(read) as sampler:
            gpu_s, gpu_summary = timed_trial(config, federation, args.device)
        busy, peak = sampler.share(), torch.cuda.max_memory_allocated(args.device) / 2**20 if cuda else None
    speedup = cpu_s / gpu_s if gpu_s else None
    accuracy = f"{cpu_summary.get('target_accuracy', float('nan')):.4f}"
    if gpu_summary is not None:
        accuracy += f" / {gpu_summary.get('target_accuracy', float('nan')):.4f}"
    print(
        f"{paper:9s} {cpu_s:7.1f} {fmt(gpu_s, '7.1f'):>7s} {fmt(speedup, '6.2f'):>6s}x {fmt(busy, '8.0%'):>8s} "
        f"{fmt(peak, '8.0f'):>8s}  {accuracy:17s} {label}",
        flush=True,
    )


def ray_row(read) -> None:
    """The FADA trial through Ray, 0.5 GPU per client actor: wall seconds with the cluster's start, busy share."""
    extra = (f"resources.gpus_per_client={RAY_GPUS_PER_CLIENT}", "run.backend=ray", "ray.max_actors=2")
    config = trial_config("fada", 1, extra)
    try:
        with BusySampler(read) as sampler:
            started = time.perf_counter()
            result = run_experiment(config)
            seconds = time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 (the rows measured so far stand; say why this one is missing)
        print(f"fada through Ray: failed ({first_line(exc)})", flush=True)
        return
    print(
        f"fada, Ray, {RAY_GPUS_PER_CLIENT} GPU per client actor (2 actors): {seconds:.1f} s with the cluster's "
        f"start, GPU busy {fmt(sampler.share(), '.0%')}, target accuracy {result.summary.get('target_accuracy'):.4f}",
        flush=True,
    )


def step_ms(model: torch.nn.Module, step: Callable, bf16: bool, steps: int, device: torch.device) -> float:
    """Median milliseconds of one SGD step (``step(model)`` returns the loss), the device synchronized."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    times = []
    for index in range(steps + 3):  # three warm-up steps: cuDNN's algorithm choice, the allocator
        sync(device)
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = step(model)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync(device)
        if index >= 3:
            times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def kernel_cases(device: torch.device) -> dict[str, tuple[Callable[[], torch.nn.Module], Callable]]:
    """label -> (a fresh model on ``device`` in fedsim's layout, its step's loss): a digits CNN, FedOD's detector."""
    from types import SimpleNamespace

    from fedsim.models import build_model

    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(32, 3, 28, 28, generator=g).to(device), torch.randint(0, 10, (32,), generator=g).to(device)
    cases = {
        "cnn 3x28x28, batch 32": (
            lambda: build_model(SimpleNamespace(name="cnn", hidden=128), (3, 28, 28), 10).to(device),
            lambda m: torch.nn.functional.cross_entropy(m(x), y),
        )
    }
    try:
        from fedsim.models.detector import DetectorSpec, build_detector
    except Exception:  # noqa: BLE001 (the detection extra is optional)
        return cases
    images = torch.rand(16, 3, 128, 128, generator=g).to(device)
    corners = torch.rand(16, 2, generator=g) * 64
    boxes = torch.cat([corners, corners + 24 + 40 * torch.rand(16, 2, generator=g)], -1).to(device)
    targets = [{"boxes": b[None], "labels": torch.tensor([1], device=device)} for b in boxes]
    cases["FCOS detector 3x128x128, batch 16"] = (
        lambda: build_detector(DetectorSpec(num_classes=4, image_size=128), seed=0).to(device),
        lambda m: sum(m.loss(m.maps(images), targets).values()),
    )
    return cases


def kernel_rows(device: torch.device, steps: int = 20) -> None:
    """One training step's milliseconds per layout and precision, for each of :func:`kernel_cases`."""
    print(f"\n{'one training step (median ms)':36s} {'default':>8s} {'ch-last':>8s} {'ch-last bf16':>13s}", flush=True)
    for label, (build, step) in kernel_cases(device).items():
        cells = []
        for layout, bf16 in (
            (torch.contiguous_format, False),
            (torch.channels_last, False),
            (torch.channels_last, True),
        ):
            try:
                cells.append(f"{step_ms(build().to(memory_format=layout).train(), step, bf16, steps, device):.2f}")
            except Exception as exc:  # noqa: BLE001 (an unsupported kernel leaves its cell empty)
                cells.append(f"failed: {first_line(exc)[:40]}")
        print(f"{label:36s} {cells[0]:>8s} {cells[1]:>8s} {cells[2]:>13s}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-only", action="store_true", help="time the CPU trials, also without a GPU")
    parser.add_argument("--papers", default=",".join(TRIALS), help=f"comma-separated, of {', '.join(TRIALS)}")
    parser.add_argument("--cpus-per-client", type=float, default=1.0, help="torch threads of a CPU client")
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray row")
    parser.add_argument("--no-kernels", action="store_true", help="leave out the layout and precision rows")
    parser.add_argument("--device", default="cuda", help="the GPU column's torch device (cpu: a dry run of the script)")
    args = parser.parse_args(argv)
    args.device = torch.device(args.device)
    args.papers = [p.strip() for p in args.papers.split(",") if p.strip()]
    unknown = sorted(set(args.papers) - set(TRIALS))
    if unknown:
        parser.error(f"unknown papers {unknown}: choose from {sorted(TRIALS)}")
    return args


def header(args) -> Optional[Callable[[], float]]:
    """Print what is measured and how; returns the reader of the GPU's utilization (None: not read)."""
    source, read = "-", None
    if not args.cpu_only and args.device.type == "cuda":
        started = time.perf_counter()
        torch.zeros(1, device=args.device).sum().item()  # the CUDA context, outside every timing
        name = torch.cuda.get_device_name(args.device)
        print(f"GPU: {name}, CUDA started in {time.perf_counter() - started:.1f} s", flush=True)
        source, read = utilization_reader()
    print(f"torch {torch.__version__}, {args.cpus_per_client:g} CPU thread(s) per client; GPU busy share: {source}")
    print(
        f"{'paper':9s} {'CPU s':>7s} {'GPU s':>7s} {'speed':>7s} {'GPU busy':>8s} {'peak MiB':>8s}  "
        f"{'target acc CPU/GPU':17s} trial",
        flush=True,
    )
    return read


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = args.device.type == "cuda" and not torch.cuda.is_available()
    if missing and not args.cpu_only:
        print("no GPU: torch.cuda.is_available() is False, nothing measured (--cpu-only times the CPU trials)")
        return 0
    args.cpu_only = args.cpu_only or missing
    read = header(args)
    for paper in args.papers:
        paper_row(paper, args, read)
    if args.cpu_only:
        if missing:
            print("no GPU: torch.cuda.is_available() is False, the GPU columns are empty")
        return 0
    if not args.no_ray and args.device.type == "cuda":
        ray_row(read)
    if not args.no_kernels:
        kernel_rows(args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
