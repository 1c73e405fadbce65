"""A paper's full grid as ``fedsim reproduce`` runs it, grouped into kinds of trials that cost the same.

:func:`full_grid` reads the spec (a paper's, or a ``--spec`` file) as ``fedsim reproduce`` does
(``load_spec``, ``shrink``, ``resolve_data_roots``, ``to_sweep``, ``prepare``), so every trial and its config are the
command's own. :func:`group_kinds` groups the trials into kinds: the same run, the same benchmark entry and the same
settings but the target, the seed and the data's paths (a kind's trials are assumed to cost the same). Each kind gets
the :class:`Shape` of its runs (rounds per stage: FedDaDiL's and DaDiL's ``method.encoder_rounds`` encoder rounds
before the dictionary rounds; evaluated and checkpointed rounds), the shape of the cut that measures it
(:func:`cut_shape`: per stage its first round, ``steady`` more, and the run's last round) and the number of its
trials the grid runs at once (:func:`trials_at_once`: the trial's bundles from ``plan_trial`` against the cluster).
A grid's trials share FedDaDiL's and DaDiL's encoder stage (``run.cache_dir``: computed by the first trial of its
key, replayed by the others): :func:`shared_stage_key` is that key as the method computes it, and a kind counts the
trials that compute it (``Kind.computes``, in grid order). :func:`cut_sweep` is the sweep of one cut trial per kind:
the grid's own variant with the cut's settings appended (and a cache of its own, so that each computes its stage),
after warm-up trials that start the grid's trial processes (Tune reuses them: only a grid's first trials start cold).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

#: config keys a kind's trials may differ in (the grid's axes and the data's paths)
FREE_KEYS = ("data.target", "data.root", "data.cache_dir", "run.seed", "run.cache_dir", "run.out")
#: stage names, by the number of stages: the dictionary methods' encoder rounds come first
STAGE_NAMES = {1: ("rounds",), 2: ("encoder", "dictionary")}
WARM_UP = "~warm-up"  # a cut's warm-up trials: <kind>~warm-up<i>


@dataclass(frozen=True)
class Shape:
    """The rounds of one run: per stage (in order), with the evaluation and checkpoint periods of ``run``."""

    stages: tuple[int, ...]
    eval_every: int
    checkpoint_every: int = 0

    @property
    def rounds(self) -> int:
        return sum(self.stages)

    def stage_of(self, rnd: int) -> int:
        """The index of the stage round ``rnd`` (1-based) belongs to."""
        reach = 0
        for index, count in enumerate(self.stages):
            reach += count
            if rnd <= reach:
                return index
        raise ValueError(f"round {rnd} is past the run's {self.rounds} rounds")

    def evaluated(self) -> list[int]:
        """The evaluated rounds, as the Simulator picks them: every ``eval_every``-th and the last."""
        return [r for r in range(1, self.rounds + 1) if r % self.eval_every == 0 or r == self.rounds]

    def early_evaluations(self) -> list[int]:
        """Per stage, how many evaluations come before the last round."""
        counts = [0] * len(self.stages)
        for rnd in self.evaluated()[:-1]:
            counts[self.stage_of(rnd)] += 1
        return counts

    def checkpoints(self) -> int:
        every = self.checkpoint_every
        return len([r for r in range(1, self.rounds) if r % every == 0]) if every else 0

    def text(self) -> str:
        names = STAGE_NAMES.get(len(self.stages), tuple(f"stage {i + 1}" for i in range(len(self.stages))))
        stages = " + ".join(f"{n} {name}" for n, name in zip(self.stages, names)) if len(self.stages) > 1 else ""
        return f"{self.rounds}" + (f" ({stages})" if stages else "")


@dataclass(frozen=True)
class Kind:
    """Trials of the grid that differ in target and seed only; ``point`` and ``config``: the first of them."""

    name: str  # <run>@<benchmark entry>
    run: str
    benchmark: str
    points: tuple[str, ...]  # point_key of every trial of the kind, in grid order
    point: dict
    config: Any
    clients: int
    shape: Shape
    computes: int  # trials that compute the stage the grid's trials share (all of them when none is shared)


def flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"data": {"target": "usps"}} -> {"data.target": "usps"}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def settings_key(config) -> str:
    """A config's settings but the free keys (target, seed, paths), as text: equal for trials of one kind."""
    settings = {k: v for k, v in flat(dataclasses.asdict(config)).items() if k not in FREE_KEYS}
    return json.dumps(settings, sort_keys=True, default=str)


def dictionary_method(config):
    """The server half of a FedDaDiL / DaDiL trial (built on its federation), None for the other methods."""
    if getattr(config.method.params, "encoder_rounds", None) is None:
        return None
    from fedsim.data.scenario import build_federation
    from fedsim.registry import METHODS

    return METHODS.get(config.method.name)(config, build_federation(config.data), device="cpu")


def stages_of(config) -> tuple[int, ...]:
    """Rounds per stage: a dictionary method's encoder rounds (as the method resolves them), then the others."""
    rounds = config.run.rounds
    method = dictionary_method(config)
    encoder = min(method.encoder.rounds, rounds) if method is not None else 0
    return (encoder, rounds - encoder) if 0 < encoder < rounds else (rounds,)


def shared_stage_key(config) -> Optional[str]:
    """The stage cache's key of the trial's encoder stage (what the trials of a grid share through
    ``run.cache_dir``), as the method computes it; None: the trial shares no stage."""
    from fedsim.methods.common.stage_cache import stage_key

    method = dictionary_method(config)
    if method is None or not method.encoder.uses_encoder:
        return None
    return stage_key(method.encoder.cache_parts())


def shape_of(config) -> Shape:
    return Shape(stages_of(config), config.run.eval_every, config.run.checkpoint_every)


def cut_shape(full: Shape, steady: int = 1) -> Shape:
    """The cut that measures ``full``: per stage its first round and ``steady`` more, the last stage one more
    (the run's last round); every cut round evaluated when the full run evaluates before its last round at a
    period over one, every cut round checkpointed when the full run checkpoints."""
    if steady < 1:
        raise ValueError(f"steady rounds must be 1 or more, got {steady}")
    last = len(full.stages) - 1
    stages = tuple(min(count, 1 + steady + (i == last)) for i, count in enumerate(full.stages))
    eval_every = 1 if any(full.early_evaluations()) else full.eval_every
    return Shape(stages, eval_every, 1 if full.checkpoint_every else 0)


def cut_settings(full: Shape, cut: Shape) -> list[str]:
    """The overrides that turn a run of shape ``full`` into one of shape ``cut``."""
    out = [f"run.rounds={cut.rounds}"] if cut.rounds != full.rounds else []
    if len(full.stages) == 2:
        out.append(f"method.encoder_rounds={cut.stages[0]}")
    if cut.eval_every != full.eval_every:
        out.append(f"run.eval_every={cut.eval_every}")
    if cut.checkpoint_every != full.checkpoint_every:
        out.append(f"run.checkpoint_every={cut.checkpoint_every}")
    return out


def full_grid(paper: Optional[str], spec_file: Optional[str], backend: Optional[str], data_dir=None, data_roots=None):
    """(PaperSpec, SweepSpec, configs, clients) of the full protocol, as ``fedsim reproduce`` builds them on this
    machine's own cluster (the backend: ``backend``, else reproduce's default)."""
    from fedsim.experiments.reproduce import default_backend
    from fedsim.experiments.reproduce_data import parse_data_roots, resolve_data_roots
    from fedsim.experiments.reproduce_spec import load_spec, shrink, to_sweep
    from fedsim.experiments.sweep_grid import prepare

    spec = resolve_data_roots(shrink(load_spec(paper, spec_file), False, None), data_dir, parse_data_roots(data_roots))
    sweep = to_sweep(spec)
    configs, clients = prepare(sweep)
    sweep.backend = backend or default_backend(None, configs.values())
    return spec, sweep, configs, clients


def group_kinds(spec, sweep, configs: dict, clients: dict) -> list[Kind]:
    """The grid's trials (``sweep.points()``, in order) grouped by run, benchmark entry and settings."""
    from fedsim.experiments.sweep_grid import VARIANT_KEY, point_key

    where = {name: (run, bench) for name, run, bench, _ in spec.variants()}
    groups: dict[tuple, list[dict]] = {}
    for point in sweep.points():
        run, bench = where[point[VARIANT_KEY].partition("#")[0]]
        groups.setdefault((run, bench, settings_key(configs[point_key(point)])), []).append(point)
    computing = computing_trials([point_key(p) for p in sweep.points()], configs)
    kinds, named = [], {}
    for (run, bench, _), points in groups.items():
        base = f"{run}@{bench}"
        named[base] = named.get(base, 0) + 1
        name = base if named[base] == 1 else f"{base}#{named[base]}"
        first = configs[point_key(points[0])]
        keys = tuple(point_key(p) for p in points)
        computes = sum(1 for key in keys if key in computing)
        kinds.append(Kind(name, run, bench, keys, points[0], first, clients[keys[0]], shape_of(first), computes))
    return kinds


def computing_trials(keys: list[str], configs: dict) -> set[str]:
    """The trials (point keys, in grid order) that compute their shared stage: the first of each stage key, and
    every trial that shares none."""
    seen: set[str] = set()
    computing = set()
    for key in keys:
        stage = shared_stage_key(configs[key])
        if stage is None or stage not in seen:
            computing.add(key)
        if stage is not None:
            seen.add(stage)
    return computing


def cut_sweep(sweep, kinds: list[Kind], steady: int = 1, cache: Optional[Path] = None, warmups: int = 0):
    """One trial per kind: its first trial's variant (seed included) with the cut's settings last, after
    ``warmups`` trials (the kinds' cuts again, in turn, named ``<kind>~warm-up<i>``) that start the grid's trial
    processes first, so that each kind's trial runs in a warm process, as nearly every trial of a grid does. With
    ``cache``, each trial's ``run.cache_dir`` is a folder of its own there, so that every cut trial computes its
    stages."""
    from fedsim.experiments.sweep_grid import VARIANT_KEY, SweepSpec

    order = [(f"{kinds[i % len(kinds)].name}{WARM_UP}{i + 1}", kinds[i % len(kinds)]) for i in range(warmups)]
    variants = {}
    for name, kind in order + [(kind.name, kind) for kind in kinds]:
        variant = sweep.variants[kind.point[VARIANT_KEY]]
        seed = [f"run.seed={kind.point['run.seed']}"] if "run.seed" in kind.point else []
        cut = cut_settings(kind.shape, cut_shape(kind.shape, steady))
        own = [f"run.cache_dir={cache / name}"] if cache is not None else []
        variants[name] = {**variant, "overrides": [*variant["overrides"], *seed, *cut, *own]}
    axes = {VARIANT_KEY: list(variants)}
    return SweepSpec(sweep.config_file, sweep.base, list(sweep.overrides), axes, variants, sweep.backend)


def local_cluster(cpus: Optional[float] = None, gpus: Optional[float] = None) -> dict[str, float]:
    """The resources of the fresh local Ray cluster ``fedsim reproduce`` starts: the machine's CPUs (as
    ``fedsim.actors.backend.connect`` asks for) and its CUDA devices; ``cpus`` / ``gpus`` replace them."""
    import os

    if gpus is None:
        try:
            import torch

            gpus = float(torch.cuda.device_count())
        except ImportError:
            gpus = 0.0
    return {"CPU": float(cpus if cpus is not None else os.cpu_count() or 1), "GPU": float(gpus)}


def trials_at_once(kind: Kind, cluster: dict[str, float], backend: str) -> int:
    """How many trials of ``kind`` fit in ``cluster`` at once: its bundles as ``plan_trial`` places them."""
    from fedsim.experiments.sweep_trial import plan_trial

    bundles = plan_trial(kind.config, kind.clients, cluster, backend).bundles()
    cpus, gpus = (sum(b.get(r, 0.0) for b in bundles) for r in ("CPU", "GPU"))
    fits = math.floor(cluster.get("CPU", 0.0) / cpus + 1e-9) if cpus > 0 else len(kind.points)
    if gpus > 0:
        fits = min(fits, math.floor(cluster.get("GPU", 0.0) / gpus + 1e-9))
    return max(1, fits)
