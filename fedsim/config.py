"""Experiment configuration: frozen dataclasses, YAML in, dotted overrides.

    cfg = load_config("experiments/configs/digits-fedavg.yaml", ["method.lr=0.01", "run.rounds=5"])

Unknown keys are rejected with the closest valid name. Method-specific
parameters live in ``method.<name>`` and are checked against the method's own
``Params`` dataclass (for example ``method.mu`` for FedProx).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from fedsim.errors import UserError
from fedsim.validation import check_task_pair, coerce_value, validate


def default_cache_dir() -> str:
    return os.environ.get("FEDSIM_CACHE", str(Path.home() / ".cache" / "fedsim"))


@dataclass(frozen=True)
class DataConfig:
    benchmark: str = "digits"
    target: str = "auto"  # "auto": the benchmark's default target (digits: mnistm)
    clients_per_domain: int = 1
    partition: str = "iid"  # "iid" or "dirichlet" (label skew)
    dirichlet_alpha: float = 0.5
    seed: int = 0  # fixes domain construction and splits; independent of run.seed
    root: Optional[str] = None  # folder of user files (npz, real-file loaders)
    cache_dir: str = field(default_factory=default_cache_dir)
    max_train_per_domain: Optional[int] = None  # subsample for quick runs
    sources: tuple[str, ...] = ()  # source domains; empty = every domain but the target
    normalization: str = "auto"  # "auto" (the benchmark's default), "none", "federated", "per-domain"
    variant: str = "default"  # benchmark-specific variant (e.g. the TEP class list)
    samples_per_class: Optional[int] = None  # benchmark-specific size (TEP samples per class and mode, CWRU windows)


@dataclass(frozen=True)
class ModelConfig:
    name: str = "auto"  # "auto" chooses from the input shape (cnn for images, mlp for vectors)
    hidden: int = 128


@dataclass(frozen=True)
class NoParams:
    """A method without parameters of its own."""


@dataclass(frozen=True)
class MethodConfig:
    name: str = "fedavg"
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    params: Any = field(default_factory=NoParams)  # the method's own frozen dataclass


@dataclass(frozen=True)
class RunConfig:
    rounds: int = 20
    seed: int = 0
    backend: str = "ray"  # "ray" or "local"
    address: Optional[str] = None  # None: fresh local Ray cluster; "auto" or host:port joins one
    out: Optional[str] = None
    eval_every: int = 1
    clients_per_round: Optional[float] = None  # None: all; an integer >= 1: that many; a fraction in (0, 1): that share
    checkpoint_every: int = 5  # rounds between checkpoints (0: none); `fedsim run --resume DIR` continues
    early_stop_patience: Optional[int] = None  # rounds without source-accuracy gain; never uses target labels
    tensorboard: bool = True
    progress: bool = True


@dataclass(frozen=True)
class ResourcesConfig:
    cpus_per_client: float = 1.0
    gpus_per_client: float = 0.0


@dataclass(frozen=True)
class RayConfig:
    """Settings of the Ray backend only (read by ``actors/``; the local backend ignores them)."""

    max_restarts: int = 3  # attempts to recreate a dead client actor within one operation
    call_timeout_s: float = 0.0  # a client call silent this long counts as failed (0: wait forever)
    max_actors: Optional[int] = None  # None: as many as the cluster's CPUs allow, at most one per client
    inject_faults: int = 0  # kill this many client actors at seeded rounds (recovery demo and tests)


#: keys that moved to the ``ray`` section: an old config gets one line naming the new key
MOVED_KEYS = {
    "run.inject_faults": "ray.inject_faults",
    "resources.max_restarts": "ray.max_restarts",
    "resources.call_timeout_s": "ray.call_timeout_s",
    "resources.max_actors": "ray.max_actors",
}


@dataclass(frozen=True)
class ExperimentConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    run: RunConfig = field(default_factory=RunConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def to_dict(self) -> dict:
        return to_plain(self)


SECTIONS = {f.name: f.type for f in fields(ExperimentConfig)}


def to_plain(obj: Any) -> Any:
    """Dataclasses -> nested dicts (method params flattened into the method section)."""
    if is_dataclass(obj):
        out = {}
        for f in fields(obj):
            value = getattr(obj, f.name)
            if f.name == "params" and isinstance(obj, MethodConfig):
                out.update(to_plain(value))
            else:
                out[f.name] = to_plain(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def _closest(name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    return f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(sorted(valid))}"


def _build(cls: type, values: dict, where: str, extra_valid: tuple[str, ...] = ()) -> Any:
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in valid:
            moved = MOVED_KEYS.get(f"{where}.{key}")
            hint = (
                f"it moved to {moved!r} (Ray backend settings)" if moved else _closest(key, valid + list(extra_valid))
            )
            raise UserError(f"unknown config key '{where}.{key}': {hint}")
        kwargs[key] = coerce_value(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'method.lr=0.01' -> (['method', 'lr'], 0.01), values parsed as YAML scalars."""
    if "=" not in text:
        raise UserError(f"bad override {text!r}: write it as section.key=value, e.g. method.lr=0.01")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if len(path) != 2:
        raise UserError(f"bad override key {key!r}: write it as section.key=value, sections: {', '.join(SECTIONS)}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file {str(p)!r} does not exist: pass an existing YAML file with --config")
    try:
        data = yaml.safe_load(p.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"config file {str(p)!r} is not valid YAML ({first}): fix its syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {str(p)!r} must hold a mapping of sections ({', '.join(SECTIONS)})")
    return data


def build_config(raw: dict) -> ExperimentConfig:
    """Nested dict (YAML) -> ExperimentConfig, with every key checked."""
    from fedsim.registry import METHODS

    sections: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise UserError(f"unknown config section {name!r}: {_closest(str(name), list(SECTIONS))}")
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise UserError(f"config section {name!r} must be a mapping of keys to values")
        sections[name] = value
    method_raw = dict(sections.get("method", {}))
    method_name = str(method_raw.get("name", MethodConfig.name))
    method_cls = METHODS.get(method_name)
    for section, defaults in getattr(method_cls, "config_defaults", {}).items():  # the method's own defaults
        merged = dict(defaults)
        merged.update(method_raw if section == "method" else sections.get(section, {}))
        if section == "method":
            method_raw = merged
        else:
            sections[section] = merged
    data_raw = dict(sections.get("data", {}))
    if str(data_raw.get("target", "auto")) == "auto":
        from fedsim.registry import BENCHMARKS

        benchmark_name = str(data_raw.get("benchmark", DataConfig.benchmark))
        default_target = getattr(BENCHMARKS.get(benchmark_name), "default_target", None)
        if default_target is None:
            raise UserError(
                f"benchmark {benchmark_name!r} has no default target domain: pass --target (see 'fedsim list')"
            )
        data_raw["target"] = default_target
        sections["data"] = data_raw
    params_cls = getattr(method_cls, "Params", NoParams)
    common = {f.name for f in fields(MethodConfig)} - {"params"}
    params_valid = [f.name for f in fields(params_cls)]
    clash = sorted(common & set(params_valid))
    if clash:
        raise TypeError(f"{method_cls.__name__}.Params redefines common method keys {clash}: use the common ones")
    params_raw = {k: method_raw.pop(k) for k in list(method_raw) if k not in common}
    for key in params_raw:
        if key not in params_valid:
            raise UserError(
                f"unknown config key 'method.{key}' for method {method_name!r}: "
                f"{_closest(key, sorted(common) + params_valid)}"
            )
    params = _build(params_cls, params_raw, "method")
    method_raw.pop("params", None)
    built = {
        "data": _build(DataConfig, sections.get("data", {}), "data"),
        "model": _build(ModelConfig, sections.get("model", {}), "model"),
        "method": dataclasses.replace(_build(MethodConfig, method_raw, "method", tuple(params_valid)), params=params),
        "run": _build(RunConfig, sections.get("run", {}), "run"),
        "resources": _build(ResourcesConfig, sections.get("resources", {}), "resources"),
        "ray": _build(RayConfig, sections.get("ray", {}), "ray"),
    }
    config = ExperimentConfig(**built)
    validate(config)
    check_task_pair(method_cls, config.data.benchmark)
    return config


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, base: dict | None = None
) -> ExperimentConfig:
    """YAML file (optional) + dotted overrides -> validated ExperimentConfig."""
    raw: dict = {k: dict(v) for k, v in (base or {}).items()}
    if path is not None:
        for section, values in read_yaml(path).items():
            if isinstance(values, dict):
                raw.setdefault(section, {}).update(values)
            else:
                raw[section] = values
    for text in overrides or []:
        (section, key), value = parse_override(text)
        if section not in SECTIONS:
            raise UserError(f"unknown config section {section!r} in --set {text}: {_closest(section, list(SECTIONS))}")
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raw[section] = {}
        raw[section][key] = value
    return build_config(raw)


def dump_yaml(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
