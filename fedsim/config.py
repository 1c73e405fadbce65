"""Experiment configuration: frozen dataclasses, YAML in, dotted overrides.

    cfg = load_config("experiments/configs/digits-fedavg.yaml", ["method.lr=0.01", "run.rounds=5"])

Unknown keys are rejected with the closest valid name. Method-specific
parameters live in ``method.<name>`` and are checked against the method's own
``Params`` dataclass (for example ``method.mu`` for FedProx); a benchmark's own
options live in ``data.<name>`` and are checked against its ``Options``
dataclass (for example ``data.variant`` for TEP).
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

import yaml

from fedsim.errors import UserError
from fedsim.validation import bare_off, build_checked, check_task_pair, closest, split_method_keys, validate


def default_cache_dir() -> str:
    return os.environ.get("FEDSIM_CACHE", str(Path.home() / ".cache" / "fedsim"))


@dataclass(frozen=True)
class NoOptions:
    """A benchmark without options of its own."""


@dataclass(frozen=True)
class DataConfig:
    """What every benchmark shares; ``options`` holds the benchmark's own frozen ``Options`` dataclass."""

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
    options: Any = field(default_factory=NoOptions)  # the benchmark's own frozen dataclass (``Benchmark.Options``)


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
    vectorize: str = "off"  # "off": each client alone (the committed results); "auto": batched (docs/performance.md)

    def __post_init__(self):  # YAML reads a bare `off` as false
        object.__setattr__(self, "vectorize", bare_off(self.vectorize))


@dataclass(frozen=True)
class RayConfig:
    """Settings of the Ray backend only (read by ``actors/``; the local backend ignores them)."""

    max_restarts: int = 3  # attempts to recreate a dead client actor within one operation
    call_timeout_s: float = 0.0  # a client call silent this long counts as failed (0: wait forever)
    max_actors: Optional[int] = None  # None: as many as the cluster's CPUs allow, at most one per client
    inject_faults: int = 0  # kill this many client actors at seeded rounds (recovery demo and tests)
    #: Ray runtime environment of the run's workers (``pip``, ``py_modules``, ``env_vars``, ...) when fedsim starts
    #: or joins the cluster; fedsim adds what the workers need to import the run's plugins
    runtime_env: Optional[dict] = field(default=None, hash=False)

    def __post_init__(self):
        env = self.runtime_env
        if env is not None and not (isinstance(env, dict) and all(isinstance(key, str) for key in env)):
            raise UserError(
                f"ray.runtime_env must be a mapping of Ray runtime-environment fields, got {env!r}: "
                "e.g. --set 'ray.runtime_env={pip: [mypkg]}'"
            )


#: keys that moved to the ``ray`` section: an old config gets one line naming the new key
MOVED_KEYS = {
    "run.inject_faults": "ray.inject_faults",
    "resources.max_restarts": "ray.max_restarts",
    "resources.call_timeout_s": "ray.call_timeout_s",
    "resources.max_actors": "ray.max_actors",
}

#: ``fedsim run`` flags (argparse names) and ``fedsim.run`` keywords -> config keys
KEYWORDS = {
    "method": "method.name",
    "benchmark": "data.benchmark",
    "target": "data.target",
    "sources": "data.sources",
    "rounds": "run.rounds",
    "local_epochs": "method.local_epochs",
    "clients_per_domain": "data.clients_per_domain",
    "clients_per_round": "run.clients_per_round",
    "seed": "run.seed",
    "backend": "run.backend",
    "address": "run.address",
    "cpus_per_client": "resources.cpus_per_client",
    "gpus_per_client": "resources.gpus_per_client",
    "inject_faults": "ray.inject_faults",
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
            if (f.name == "params" and isinstance(obj, MethodConfig)) or (
                f.name == "options" and isinstance(obj, DataConfig)
            ):
                out.update(to_plain(value))
            else:
                out[f.name] = to_plain(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def _split_key(key: str) -> list[str]:
    path = [p for p in key.strip().split(".") if p]
    if len(path) != 2:
        raise UserError(f"bad override key {key!r}: write it as section.key=value, sections: {', '.join(SECTIONS)}")
    return path


def parse_override(text: str) -> tuple[list[str], Any]:
    """'method.lr=0.01' -> (['method', 'lr'], 0.01), values parsed as YAML scalars."""
    if "=" not in text:
        raise UserError(f"bad override {text!r}: write it as section.key=value, e.g. method.lr=0.01")
    key, raw = text.split("=", 1)
    path = _split_key(key)
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
    if not isinstance(data, (dict, type(None))):
        raise UserError(f"config file {str(p)!r} must hold a mapping of sections ({', '.join(SECTIONS)})")
    return data or {}


def _check_sections(raw: dict) -> dict[str, dict]:
    sections: dict[str, dict] = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            raise UserError(f"unknown config section {name!r}: {closest(str(name), list(SECTIONS))}")
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise UserError(f"config section {name!r} must be a mapping of keys to values")
        sections[name] = dict(value)
    return sections


def _apply_method_defaults(method_cls: type, sections: dict[str, dict]) -> None:
    """The method's own defaults (``config_defaults``) under what the config gives."""
    for section, defaults in getattr(method_cls, "config_defaults", {}).items():
        sections[section] = {**defaults, **sections.get(section, {})}


def _benchmark_name(data_raw: dict) -> str:
    return str(data_raw.get("benchmark", DataConfig.benchmark))


def _resolve_target(data_raw: dict) -> None:
    """``data.target: auto`` -> the benchmark's default target domain."""
    from fedsim.registry import BENCHMARKS

    if str(data_raw.get("target", "auto")) != "auto":
        return
    default_target = getattr(BENCHMARKS.get(_benchmark_name(data_raw)), "default_target", None)
    if default_target is None:
        raise UserError(
            f"benchmark {_benchmark_name(data_raw)!r} has no default target domain: pass --target (see 'fedsim list')"
        )
    data_raw["target"] = default_target


def _build_data(data_raw: dict) -> DataConfig:
    """The shared data keys into DataConfig, the rest into the benchmark's own ``Options``."""
    from fedsim.registry import BENCHMARKS

    benchmark_cls = BENCHMARKS.get(_benchmark_name(data_raw))
    options_cls = getattr(benchmark_cls, "Options", NoOptions)
    shared = [f.name for f in fields(DataConfig) if f.name != "options"]
    own = [f.name for f in fields(options_cls)]
    clash = sorted(set(shared) & set(own))
    if clash:
        raise TypeError(f"{benchmark_cls.__name__}.Options redefines shared data keys {clash}: use the shared ones")
    for key in data_raw:
        if key not in shared and key not in own:
            keys = f"its own keys: {', '.join(own)}" if own else "it has no keys of its own"
            raise UserError(
                f"unknown config key 'data.{key}' for benchmark {_benchmark_name(data_raw)!r} ({keys}): "
                f"{closest(str(key), shared + own)}"
            )
    options = build_checked(options_cls, {k: v for k, v in data_raw.items() if k in own}, "data")
    try:
        hash(options)
    except TypeError as exc:
        raise UserError(
            f"the options of benchmark {_benchmark_name(data_raw)!r} hold an unhashable value ({exc}): declare a list "
            "option as a tuple[...] field"
        ) from None
    return dataclasses.replace(
        build_checked(DataConfig, {k: v for k, v in data_raw.items() if k in shared}, "data", moved=MOVED_KEYS),
        options=options,
    )


def data_config(**values) -> DataConfig:
    """A DataConfig from ``data`` keys, shared ones and the benchmark's own options, checked as a config file's
    (``data_config(benchmark="tep", variant="hard")``); ``target`` stays "auto" unless given."""
    return _build_data(values)


def _build_method(method_cls: type, method_raw: dict) -> MethodConfig:
    """The common method keys into MethodConfig, the rest into the method's own ``Params``."""
    params_cls = getattr(method_cls, "Params", NoParams)
    common, params = split_method_keys(method_cls, params_cls, method_raw, [f.name for f in fields(MethodConfig)])
    extra = tuple(f.name for f in fields(params_cls))
    return dataclasses.replace(
        build_checked(MethodConfig, common, "method", extra, moved=MOVED_KEYS),
        params=build_checked(params_cls, params, "method", moved=MOVED_KEYS),
    )


def build_config(raw: dict) -> ExperimentConfig:
    """Nested dict (YAML, or typed values) -> ExperimentConfig, with every key checked."""
    from fedsim.registry import METHODS, MODELS

    sections = _check_sections(raw)
    method_cls = METHODS.get(str(sections.get("method", {}).get("name", MethodConfig.name)))
    _apply_method_defaults(method_cls, sections)
    data_raw = sections.setdefault("data", {})
    _resolve_target(data_raw)
    built = {
        name: build_checked(cls, sections.get(name, {}), name, moved=MOVED_KEYS)
        for name, cls in typing.get_type_hints(ExperimentConfig).items()
        if name not in ("method", "data")
    }
    config = ExperimentConfig(
        method=_build_method(method_cls, sections.get("method", {})), data=_build_data(data_raw), **built
    )
    validate(config)
    check_task_pair(method_cls, config.data.benchmark)
    if config.model.name != "auto":
        MODELS.check(config.model.name)
    return config


def keyword_values(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Flag or keyword names (``KEYWORDS``) -> ``{dotted config key: value}``; ``None`` values are left out."""
    unknown = sorted(name for name in settings if name not in KEYWORDS)
    if unknown:
        raise UserError(
            f"fedsim.run got unknown argument(s) {unknown}: use {', '.join(KEYWORDS)}, or set={{'section.key': value}}"
        )
    return {KEYWORDS[name]: value for name, value in settings.items() if value is not None}


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[str] | None = None,
    base: dict | None = None,
    values: Mapping[str, Any] | None = None,
) -> ExperimentConfig:
    """``base`` dict, then the YAML file, then dotted ``overrides`` (``"section.key=value"`` texts, values parsed as
    YAML scalars), then ``values`` (``{"section.key": value}``, typed values taken as they are) -> a validated
    ExperimentConfig. Every value is checked against its field's type."""
    raw: dict = {k: dict(v) for k, v in (base or {}).items()}
    if path is not None:
        for section, section_values in read_yaml(path).items():
            if isinstance(section_values, dict):
                raw.setdefault(section, {}).update(section_values)
            else:
                raw[section] = section_values
    pairs = [parse_override(text) for text in overrides or []]
    pairs += [(_split_key(key), value) for key, value in (values or {}).items()]
    for (section, key), value in pairs:
        if section not in SECTIONS:
            raise UserError(
                f"unknown config section {section!r} in {section}.{key}: {closest(section, list(SECTIONS))}"
            )
        if not isinstance(raw.get(section), dict):
            raw[section] = {}
        raw[section][key] = value
    return build_config(raw)


def dump_yaml(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
