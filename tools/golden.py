"""Record or check the numbers of every registered method on tiny fixed-seed configs, on both backends.

    python -m tools.golden check tests/golden/summaries.json [--only fedavg,fada]
    python -m tools.golden record tests/golden/summaries.json [--only fada]  (--only: the other cases kept)

The golden summaries live in ``tests/golden/summaries.json``. ``check`` compares each run's summary (wall
time left out), every evaluated round's metrics (timings left out) and a fingerprint of the final global tensors
(:func:`tensor_fingerprint`) with the recorded ones and prints every difference; ``record`` writes them anew, for
a change that is meant to move the numbers. Integers, strings and flags must match exactly, floats within
``RTOL``/``ATOL``: the same code and seed on two CPUs of this workplace (one with AVX-512 and AMX) round apart, by
at most 2.4e-4 relative (1.5e-6 absolute, FADA's MINE estimate after two rounds) and 2e-6 relative for every
other metric, with the same accuracies; a changed computation moves the numbers by far more. On one machine the
two backends give the same bits (``digest``, the final tensors' SHA-256, compared exactly between them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

#: tolerance of a recorded float (the drift between CPUs, above, is at most 2.4e-4 relative or 1.5e-6 absolute)
RTOL, ATOL = 1e-4, 1e-5
#: values of the final tensors in their fingerprint (evenly spaced over all of them, flattened)
SAMPLED = 16
TOY_SHAPES = {"vectors": (3, 150, 8, 3), "images": (3, 120, 3)}
DETECTION_TINY = [
    "data.benchmark=scenes",
    "data.variant=tiny",
    "data.target=dusk",
    "data.sources=server,farm",
    "run.rounds=1",
    "method.batch_size=4",
    "method.lr=0.01",
    "method.width=4",
    "method.fpn_channels=8",
    "method.head_convs=1",
    "method.base_iters=2",
    "method.client_iters=1",
]
FADA_FAST = [
    "method.target_batch=48",
    "method.gap_samples=48",
    "method.gap_references=2",
    "method.adversarial_steps=3",
    "method.disentangle_steps=3",
]
#: case name -> (toy data kind, overrides)
CASES = {
    "fedavg": ("vectors", ["method.name=fedavg"]),
    "fedavg-federated-norm": ("vectors", ["method.name=fedavg", "data.normalization=federated"]),
    "fedavg-per-domain-norm": ("vectors", ["method.name=fedavg", "data.normalization=per-domain"]),
    "fedavg-sampled": ("vectors", ["method.name=fedavg", "data.clients_per_domain=2", "run.clients_per_round=2"]),
    "fedprox": ("vectors", ["method.name=fedprox", "method.mu=0.1"]),
    "fedbn": ("images", ["method.name=fedbn", "model.name=cnn", "model.hidden=16"]),
    "centralized": ("images", ["method.name=centralized", "model.name=cnn", "model.hidden=16"]),
    "feddann": ("vectors", ["method.name=feddann"]),
    "fedmmd": ("vectors", ["method.name=fedmmd"]),
    "fada": ("vectors", ["method.name=fada", *FADA_FAST]),
    "fada-I": ("vectors", ["method.name=fada", *FADA_FAST, "method.adversarial=false", "method.disentangle=false"]),
    "feddadil": (
        "vectors",
        [
            "method.name=feddadil",
            "method.samples_per_atom=40",
            "method.batch_size=20",
            "method.classifier_steps=50",
            "run.eval_every=1",
        ],
    ),
    "feddadil-images": (
        "images",
        [
            "method.name=feddadil",
            "model.name=cnn",
            "model.hidden=16",
            "method.encoder_rounds=1",
            "method.samples_per_atom=30",
            "method.batch_size=15",
            "method.classifier_steps=30",
            "run.rounds=3",
            "run.eval_every=1",
        ],
    ),
    "dadil": (
        "vectors",
        [
            "method.name=dadil",
            "method.samples_per_atom=40",
            "method.batch_size=20",
            "method.classifier_steps=50",
            "run.eval_every=1",
        ],
    ),
    "fedod": ("scenes", ["method.name=fedod", "method.distill_iters=1"]),
    "fedod-baseline1": ("scenes", ["method.name=fedod", "method.mode=baseline1"]),
    "fedod-baseline2": ("scenes", ["method.name=fedod", "method.mode=baseline2", "method.distill_iters=1"]),
    "fedavg_det": ("scenes", ["method.name=fedavg_det"]),
    "fedbn_det": ("scenes", ["method.name=fedbn_det"]),
    "fedrep_det": ("scenes", ["method.name=fedrep_det", "method.head_iters=1"]),
}
VOLATILE = {
    "wall_seconds",
    "round_seconds",
    "eval_seconds",
    "checkpoint_seconds",
    "client_nodes",
    "backend",
    "actor_restarts",
    "ot_seconds",
    "predictor_seconds",
}


def write_toy(root: Path, kind: str) -> str:
    """The test suite's toy federations (tests/conftest.py), rebuilt here so the script stands alone."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    if kind == "vectors":
        num, per, dim, classes = TOY_SHAPES["vectors"]
        centers = rng.normal(0, 2.0, size=(classes, dim))
        for d in range(num):
            rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)) * 0.3 * d + np.eye(dim))
            y = np.arange(per) % classes
            x = centers[y] @ rotation + rng.normal(0, 1.0, size=(per, dim)) + 0.5 * d
            np.savez(root / f"dom{d}.npz", x=x.astype(np.float32), y=y.astype(np.int64))
        return "dom1"
    num, per, classes = TOY_SHAPES["images"]
    y = np.arange(per) % classes
    for d in range(num):
        x = rng.normal(0, 0.3, size=(per, 1, 8, 8))
        for c in range(classes):
            x[y == c, 0, 2 * c : 2 * c + 2, :] += 1.0
        np.savez(root / f"dom{d}.npz", x=(x * (1.0 + d) + 0.7 * d).astype(np.float32), y=y.astype(np.int64))
    return "dom1"


def overrides_for(case: str, work: Path, backend: str) -> list[str]:
    kind, extra = CASES[case]
    common = [
        f"data.cache_dir={work / 'cache'}",
        "run.progress=false",
        "run.tensorboard=false",
        f"run.backend={backend}",
        "run.seed=3",
    ]
    if kind == "scenes":
        return DETECTION_TINY + common + extra
    target = write_toy(work / kind, kind)
    toy = [
        "data.benchmark=npz",
        f"data.root={work / kind}",
        f"data.target={target}",
        "run.rounds=2",
        "method.batch_size=16",
        "method.lr=0.05",
    ]
    if kind == "images":
        toy += ["data.normalization=none"]
    return toy + common + extra


def tensor_digest(tensors: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = np.ascontiguousarray(np.asarray(tensors[name]))
        digest.update(name.encode() + str(array.dtype).encode() + str(array.shape).encode() + array.tobytes())
    return digest.hexdigest()


def tensor_fingerprint(tensors: dict) -> dict:
    """Each tensor's root mean square, and ``SAMPLED`` values of all of them (flattened in name order) divided by
    their joint root mean square: numbers that rounding moves as little as it moves each value (no sum with
    cancellation)."""
    arrays = {name: np.asarray(tensors[name], dtype=np.float64).ravel() for name in sorted(tensors)}
    rms = {name: float(np.sqrt(np.mean(a**2))) if a.size else 0.0 for name, a in arrays.items()}
    joint = np.concatenate(list(arrays.values())) if arrays else np.zeros(0)
    scale = float(np.sqrt(np.mean(joint**2))) if joint.size else 0.0
    picked = joint[np.linspace(0, joint.size - 1, min(SAMPLED, joint.size)).astype(int)] if joint.size else joint
    return {"rms": rms, "scaled": [float(v) / scale if scale else float(v) for v in picked]}


def clean(value):
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def record_case(case: str, backend: str, work: Path) -> dict:
    from fedsim.api import run_experiment
    from fedsim.config import load_config

    config = load_config(None, overrides_for(case, work, backend))
    result = run_experiment(config, work / f"{case}-{backend}", num_cpus=2)
    return {
        "summary": clean(result.summary),
        "history": clean(result.history),
        "tensors": tensor_fingerprint(result.global_tensors),
        "digest": tensor_digest(result.global_tensors),
    }


def record_all(cases: list[str]) -> dict:
    import ray

    from fedsim.actors.backend import RAY_AUTH_LOGGER, quiet_logger

    with quiet_logger(RAY_AUTH_LOGGER):
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    out = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for case in cases:
                for backend in ("local", "ray"):
                    print(f"{case} / {backend}", flush=True)
                    out[f"{case}/{backend}"] = record_case(case, backend, Path(tmp))
    finally:
        ray.shutdown()
    return out


def _same(expected, actual, exact: bool) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):  # a flag is neither 1 nor 1.0
        return type(expected) is type(actual) and expected == actual
    floats = any(isinstance(v, float) for v in (expected, actual))
    numbers = all(isinstance(v, (int, float)) for v in (expected, actual))
    if exact or not (floats and numbers):
        return expected == actual
    return math.isclose(expected, actual, rel_tol=RTOL, abs_tol=ATOL)


def differences(expected, actual, where="", exact: bool = False) -> list[str]:
    """Every place where ``actual`` differs from ``expected``: floats beyond RTOL/ATOL and the ``digest`` left
    out unless ``exact`` (two runs on one machine, e.g. the local and Ray halves of a record)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        found = []
        for key in sorted(set(expected) | set(actual)):
            if key == "digest" and not exact:
                continue
            if key not in actual or key not in expected:
                found.append(f"{where}.{key}: {'missing' if key not in actual else 'new'}")
            else:
                found += differences(expected[key], actual[key], f"{where}.{key}", exact)
        return found
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        pairs = enumerate(zip(expected, actual))
        return [d for i, (e, a) in pairs for d in differences(e, a, f"{where}[{i}]", exact)]
    return [] if _same(expected, actual, exact) else [f"{where}: {expected!r} -> {actual!r}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["record", "check"])
    parser.add_argument("file")
    parser.add_argument("--only", default="", help="comma-separated case names (default: every case)")
    args = parser.parse_args(argv)
    cases = [c for c in args.only.split(",") if c] or list(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.exit(2, f"unknown case(s) {unknown}: choose from {', '.join(CASES)}\n")
    results = json.loads(json.dumps(record_all(cases)))  # as the record holds them: lists, Python floats
    path = Path(args.file)
    if args.mode == "record":  # with --only, the other cases' records are kept
        kept = json.loads(path.read_text()) if args.only and path.exists() else {}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**kept, **results}, indent=1, sort_keys=True) + "\n")
        return 0
    expected = json.loads(path.read_text())
    failed = 0
    for key, actual in results.items():
        found = differences(expected.get(key, {}), actual, key)
        local_key = key.replace("/ray", "/local")
        print(f"{key}: {'identical' if not found else f'{len(found)} differences'}")
        for line in found[:10]:
            print("   ", line)
        failed += bool(found)
        if key.endswith("/ray") and results[local_key]["digest"] != actual["digest"]:
            print(f"    local and ray tensors differ for {key}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
