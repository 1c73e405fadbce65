"""One TEP window simulated by tep-studio and by fedsim's compiled loop, side by side in one process on one thread.

    python -m tools.benchmarks.tep_simulation [--mode mode1] [--idv 1] [--hours 30] [--repeats 3]

Both start from ``TennesseeEastmanProcess.reset(mode=...)`` with the same seed under Ricker's controller and run
``--hours`` of control intervals (0.01 h, RK4 at 0.0005 h inside) with IDV ``--idv`` on (0: none), recording the
window's 34 variables every 3 min: tep-studio's ``advance`` and ``RickerMultiLoopController`` from Python
(:func:`fedsim.data.benchmarks.tep_simulation.record_window`) against :class:`tep_compiled.CompiledPlant`. The
compiled functions are loaded (numba's cache, or compiled) by an untimed short run first. Prints the best of
``--repeats`` wall times of each, the speed-up, and whether the two windows are bit-identical.
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from fedsim.data.benchmarks import tep_simulation as sim  # noqa: E402
from fedsim.data.benchmarks.tep_compiled import CompiledPlant  # noqa: E402

SEED = 12345
FLAG = sim.TEP_STUDIO_MS_FLAG | sim.SCALED_IDV_FLAG


def reference(mode: str, idv: np.ndarray, samples: int, per_sample: int) -> np.ndarray:
    plant = sim.ControlledPlant(mode, SEED, sim.CONTROL_INTERVAL, FLAG)
    return sim.record_window(plant, idv, "the benchmark window", samples, per_sample)


def compiled(mode: str, idv: np.ndarray, samples: int, per_sample: int) -> np.ndarray:
    plant = CompiledPlant(mode, SEED, sim.CONTROL_INTERVAL, FLAG)
    meas = np.array(sim.WINDOW_MEASUREMENTS, dtype=np.int64)
    mvs = np.array(sim.WINDOW_MVS, dtype=np.int64)
    rows, shutdown = plant.run(idv, 0, samples, per_sample, meas, mvs)
    if shutdown:
        raise SystemExit(f"the plant shut down at t={plant.time:.2f} h: choose another --idv or fewer --hours")
    return rows.T


def best(function, *args, repeats: int) -> tuple[float, np.ndarray]:
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = function(*args)
        times.append(time.perf_counter() - start)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="mode1", choices=sim.MODES)
    parser.add_argument("--idv", type=int, default=1, help="the disturbance switched on (1-28; 0: none)")
    parser.add_argument("--hours", type=float, default=30.0, help="simulated hours (a window: 30)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    try:
        import threadpoolctl

        threadpoolctl.threadpool_limits(1)
    except ImportError:
        pass
    idv = np.zeros(28)
    if args.idv:
        idv[args.idv - 1] = 1.0
    per_sample = sim.steps(sim.SAMPLE_HOURS, sim.CONTROL_INTERVAL, "sample period")
    samples = int(round(args.hours / sim.SAMPLE_HOURS))
    compiled(args.mode, idv, 2, per_sample)  # load (or compile) the numba functions, untimed
    slow, expected = best(reference, args.mode, idv, samples, per_sample, repeats=args.repeats)
    fast, got = best(compiled, args.mode, idv, samples, per_sample, repeats=args.repeats)
    same = np.array_equal(expected, got)
    print(f"TEP {args.mode}, IDV {args.idv}, {args.hours:g} h ({samples} samples, {samples * per_sample} intervals)")
    print(f"tep-studio (Python loop): {slow:.3f} s")
    print(f"compiled (numba):         {fast:.3f} s")
    print(f"speed-up:                 {slow / fast:.1f}x")
    print(f"bit-identical windows:    {same}" + ("" if same else f" (max |diff| {np.abs(expected - got).max():.3g})"))


if __name__ == "__main__":
    main()
