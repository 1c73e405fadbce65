"""The grid of `fedsim sweep`: the flags and ``--set`` lists -> a :class:`SweepSpec` (base config +
axes), its grid points, and every point's checked config (:func:`prepare`)."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

from fedsim.errors import UserError
from fedsim.experiments.flags import parse_list
from fedsim.experiments.sweep_space import RANGE_CALL, Range, SearchSettings, check_sampled_key, parse_range

# Grid flags: flag -> (config key, column in results.csv, item type, example)
GRID_FLAGS = {
    "methods": ("method.name", "method", str, "fedavg,fedprox"),
    "local_epochs": ("method.local_epochs", "local_epochs", int, "1,5"),
    "seeds": ("run.seed", "seed", int, "0,1"),
    "cpus_per_client": ("resources.cpus_per_client", "cpus_per_client", float, "0.5"),
    "gpus_per_client": ("resources.gpus_per_client", "gpus_per_client", float, "0,0.25"),
}
#: the flags of a search (:mod:`fedsim.experiments.sweep_space`), kept in ``SweepSpec.search``
SEARCH_FLAGS = ("search", "num_samples", "scheduler", "grace_period", "select")
ALWAYS_AXES = ("method.name", "method.local_epochs", "run.seed")  # columns every results.csv has
#: axis whose values name one of ``SweepSpec.variants`` (a whole config of its own: `fedsim reproduce`'s runs)
VARIANT_KEY = "spec.variant"
COLUMNS = {**{key: column for key, column, _, _ in GRID_FLAGS.values()}, VARIANT_KEY: "variant"}
#: keys whose one value is itself a comma list: never a grid axis
LIST_VALUED = {"run.scores"}
FORBIDDEN_SET = {
    "run.address": "pass --address instead",
    "run.out": "pass --out instead",
    "run.backend": "every trial runs on the Ray backend",
}


@dataclass
class SweepSpec:
    """What a sweep runs: one base config (the YAML file's sections + constant overrides) and the grid axes.

    The YAML is read once, on the machine that starts the sweep, so trials on other nodes need no copy of it.
    """

    config_file: Optional[str]  # where ``base`` came from (for the record)
    base: dict  # the YAML file's sections
    overrides: list[str]
    axes: dict[str, list] = field(default_factory=dict)  # config key -> values, in flag order
    #: name -> {"config_file", "base", "overrides"}: a point's ``VARIANT_KEY`` value picks one (its base and
    #: overrides replace the spec's own base and come after the spec's overrides)
    variants: dict[str, dict] = field(default_factory=dict)
    #: backend of the simulation inside each trial: "ray" (client actors in the trial's placement group) or
    #: "local" (the clients one after the other in the trial's process: no actor start-up, same numbers)
    backend: str = "ray"
    #: config key -> a sampled range as ``[kind, *args]`` (:class:`fedsim.experiments.sweep_space.Range`)
    ranges: dict[str, list] = field(default_factory=dict)
    #: the search settings (:func:`fedsim.experiments.sweep_space.settings_from_args`); all unset for a plain grid
    search: SearchSettings = field(default_factory=SearchSettings)

    def points(self) -> list[dict[str, Any]]:
        keys = list(self.axes)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.axes[k] for k in keys))]

    def overrides_for(self, point: dict[str, Any]) -> list[str]:
        """Constant overrides + the point's values; ``<method>.<key>`` applies to that method's trials only."""
        from fedsim.config import SECTIONS

        method = point.get("method.name")
        variant = self.variants[point[VARIANT_KEY]] if VARIANT_KEY in point else {}
        out = []
        for text in self.overrides:
            key, value = text.split("=", 1)
            section, name = key.split(".", 1)
            if section in SECTIONS:
                out.append(text)
            elif section == method:
                out.append(f"method.{name}={value}")
        out += list(variant.get("overrides", []))  # a variant's own overrides: plain config keys, applied as they are
        for key, value in point.items():
            section, name = key.split(".", 1)
            if section in SECTIONS:
                out.append(f"{key}={render(value)}")
            elif section == method:  # a sampled <method>.<key>: that method's trials only
                out.append(f"method.{name}={render(value)}")
        return out

    def config_for(self, point: dict[str, Any], extra: tuple[str, ...] = ("run.progress=false",)):
        """The point's ExperimentConfig. Method parameters of the YAML file (``method.mu``) are kept
        for trials of the file's own method and left out for the other methods of the sweep."""
        from fedsim.config import MethodConfig, load_config
        from fedsim.registry import METHODS

        base = self.variants[point[VARIANT_KEY]]["base"] if VARIANT_KEY in point else self.base
        raw = {k: dict(v or {}) for k, v in base.items()}
        method = point.get("method.name")
        section = raw.get("method")
        if (
            isinstance(section, dict)
            and method
            and section.get("name", MethodConfig.name) != method
            and method in METHODS
        ):
            params = getattr(METHODS.get(method), "Params", None)
            valid = {f.name for f in dataclasses.fields(MethodConfig)} | (
                {f.name for f in dataclasses.fields(params)} if params else set()
            )
            raw["method"] = {k: v for k, v in section.items() if k in valid}
        try:
            config = load_config(None, self.overrides_for(point) + list(extra), base=raw)
        except UserError as exc:
            if "unknown config key 'method." not in str(exc):
                raise
            raise UserError(
                f"{exc} (in the trials of {method}): set a method's own parameter for its trials only "
                "with --set <method>.<key>=VALUE"
            ) from None
        if self.search.empty:
            return config
        from fedsim.experiments.sweep_space import with_scores

        return with_scores(config, self.search)

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "config_file": self.config_file,
                    "base": self.base,
                    "overrides": self.overrides,
                    "axes": self.axes,
                    "variants": self.variants,
                    "backend": self.backend,
                    "ranges": self.ranges,
                    "search": self.search.to_dict(),
                },
                indent=2,
                default=str,
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str) -> "SweepSpec":
        raw = json.loads(text)
        return cls(
            raw["config_file"],
            dict(raw["base"]),
            list(raw["overrides"]),
            dict(raw["axes"]),
            dict(raw.get("variants", {})),
            raw.get("backend", "ray"),
            dict(raw.get("ranges", {})),
            SearchSettings.from_dict(raw.get("search", {})),
        )


def render(value: Any) -> str:
    """A grid value back to override text that YAML parses to the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def point_key(point: dict[str, Any]) -> str:
    return json.dumps({k: point[k] for k in sorted(point)}, sort_keys=True, default=str)


def parse_set(items: list[str]) -> tuple[list[str], dict[str, list], dict[str, list]]:
    """--set items -> (constant overrides, grid axes, sampled ranges). A comma list outside [..] / {..} is an axis
    (except for a key whose value is itself a comma list, :data:`LIST_VALUED`); ``kind(...)`` is a range
    (:func:`fedsim.experiments.sweep_space.parse_range`), kept as ``[kind, *args]``."""
    from fedsim.config import SECTIONS, parse_override
    from fedsim.registry import METHODS

    constants: list[str] = []
    axes: dict[str, list] = {}
    ranges: dict[str, list] = {}
    seen: set[str] = set()
    for text in items:
        (section, key), _ = parse_override(text)  # checks the section.key=value shape
        name = f"{section}.{key}"
        raw = text.split("=", 1)[1].strip()
        if section not in SECTIONS:
            if section not in METHODS:
                raise UserError(
                    f"unknown config section or method {section!r} in --set {text}: "
                    f"use one of {', '.join(SECTIONS)}, or a method name for that method's trials only"
                )
            if "," in raw and not raw.startswith(("[", "{")) and not _is_range(raw):
                raise UserError(
                    f"--set {name} takes one value: "
                    f"sweep a method's own parameter with --methods {section} --set method.{key}=..."
                )
        if name in FORBIDDEN_SET:
            raise UserError(f"--set {text} is not allowed in a sweep: {FORBIDDEN_SET[name]}")
        if name in seen:
            raise UserError(f"--set {name} given twice: give it once (a comma list makes it a grid axis)")
        seen.add(name)
        if _is_range(raw):
            check_sampled_key(name, text, METHODS)
            ranges[name] = parse_range(name, raw).to_list()
        elif "," in raw and not raw.startswith(("[", "{")) and name not in LIST_VALUED:
            values = parse_list(f"set {name}=", raw, str, "0.01,0.1")
            axes[name] = [_yaml_value(name, v) for v in values]
        else:
            constants.append(f"{name}={raw}")
    return constants, axes, ranges


def _is_range(raw: str) -> bool:
    """``kind(...)``: a sampled range, checked by :func:`fedsim.experiments.sweep_space.parse_range`."""
    return bool(RANGE_CALL.match(raw.strip()))


def _yaml_value(name: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise UserError(
            f"bad value {text!r} for --set {name}: give plain values such as 0.1, 5, true or a name"
        ) from None


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    """The flags -> a SweepSpec; the three main axes always exist (a single value when not given)."""
    from fedsim.config import load_config, read_yaml
    from fedsim.registry import METHODS, unknown_name_message

    constants, set_axes, ranges = parse_set(list(args.set or []))
    for flag, key in (("benchmark", "data.benchmark"), ("target", "data.target"), ("rounds", "run.rounds")):
        value = getattr(args, flag, None)
        if value is not None:
            if "," in str(value):
                raise UserError(f"--{flag} takes one value, got {value!r}: sweep it with --set {key}={value}")
            if any(c.startswith(f"{key}=") for c in constants) or key in set_axes:
                raise UserError(f"{key} given twice (--{flag} and --set): keep one")
            constants.append(f"{key}={value}")
    config_file = str(Path(args.config).resolve()) if args.config else None
    base = load_config(config_file)  # checks the file; the overrides are checked with every grid point
    raw = read_yaml(config_file) if config_file else {}
    axes: dict[str, list] = {}
    for flag, (key, _, kind, example) in GRID_FLAGS.items():
        text = getattr(args, flag, None)
        if text is None:
            continue
        if key in set_axes or key in ranges or any(c.startswith(f"{key}=") for c in constants):
            raise UserError(f"{key} given twice (--{flag.replace('_', '-')} and --set): keep one")
        values = parse_list(flag.replace("_", "-"), text, kind, example)
        if len(values) == 1 and key not in ALWAYS_AXES:
            constants.append(f"{key}={render(values[0])}")  # one value: a setting, not a column
        else:
            axes[key] = values
    for name in axes.get("method.name", []):
        if name not in METHODS:
            raise UserError(unknown_name_message("method", name, METHODS.names(), "--methods"))
    for key in ALWAYS_AXES:
        if key not in axes and key not in set_axes and key not in ranges:
            section, name = key.split(".")
            given = [c.split("=", 1)[1] for c in constants if c.split("=", 1)[0] == key]
            axes[key] = [_yaml_value(key, given[0])] if given else [getattr(getattr(base, section), name)]
    for key, values in set_axes.items():
        axes[key] = values
    constants = [c for c in constants if c.split("=", 1)[0] not in axes]
    ordered = {key: axes[key] for key in ALWAYS_AXES if key in axes}
    ordered.update({key: values for key, values in axes.items() if key not in ordered})
    search = SearchSettings()
    if ranges or any(getattr(args, f, None) is not None for f in SEARCH_FLAGS):
        from fedsim.experiments.sweep_space import settings_from_args

        search = settings_from_args(args, ranges)
        if search.ranked and not search.select:
            search = dataclasses.replace(search, metric=_default_metric(base, constants, ordered))
    return SweepSpec(config_file, raw, constants, ordered, ranges=ranges, search=search)


def _absolute_paths(spec: SweepSpec, config) -> None:
    """Trials run in Tune's trial directories: make relative (or ``~``) paths absolute up front: the data, the
    caches, the clients' trace files."""
    paths = (
        ("data.root", config.data.root),
        ("data.cache_dir", config.data.cache_dir),
        ("run.cache_dir", config.run.cache_dir),
        ("clients.availability_trace", config.clients.availability_trace),
        ("clients.speed_trace", config.clients.speed_trace),
    )
    for key, value in paths:
        if value and not Path(value).is_absolute() and key not in spec.axes:
            spec.overrides = [o for o in spec.overrides if not o.startswith(f"{key}=")] + [
                f"{key}={Path(value).expanduser().resolve()}"
            ]


def prepare(spec: SweepSpec) -> tuple[dict[str, Any], dict[str, int]]:
    """Every grid point's config and client count: all bad input (the method's own scenario checks
    included) fails here, before Ray starts. A sweep with ranges has each grid point's config also checked at
    every range's edges (:func:`range_checks`)."""
    from fedsim.data.scenario import build_federation
    from fedsim.registry import METHODS
    from fedsim.runtime.unreliable import UnreliableClients

    points = spec.points()
    first = spec.config_for(points[0])
    _absolute_paths(spec, first)
    configs = {}
    for point in points:
        config = spec.config_for(point)
        if config.data.root and not Path(config.data.root).is_absolute():
            raise UserError(f"data.root {config.data.root!r} is relative: give an absolute path when sweeping it")
        configs[point_key(point)] = config
    clients: dict[str, int] = {}
    federations: dict[Any, Any] = {}
    points_by_key = {point_key(point): point for point in points}
    checks = range_checks(spec.ranges)
    for key, config in configs.items():
        if config.data not in federations:
            federations[config.data] = build_federation(config.data)
        METHODS.get(config.method.name).check_setting(config, federations[config.data])  # as `fedsim run` does
        for values in checks:
            sampled = spec.config_for({**points_by_key[key], **values})
            METHODS.get(sampled.method.name).check_setting(sampled, federations[config.data])
        if config.clients.active:  # its trace files read here, as a run's server reads them, before the grid starts
            UnreliableClients(config.clients, federations[config.data], config.run.seed)
        clients[key] = len(federations[config.data].clients)
    return configs, clients


def range_checks(ranges: dict[str, list]) -> list[dict[str, Any]]:
    """The sampled values a sweep checks before it starts: each range's edges (its bounds, every choice), the
    other ranges at their first edge."""
    if not ranges:
        return []
    edges = {key: Range.from_list(value).edges() for key, value in ranges.items()}
    first = {key: values[0] for key, values in edges.items()}
    checks = [dict(first)]
    for key, values in edges.items():
        checks += [{**first, key: value} for value in values[1:]]
    return checks


def _default_metric(base, constants: list[str], axes: dict) -> str:
    """The score a search or scheduler ranks trials by when ``--select`` names none: ``source_accuracy`` (DomainBed's
    training-domain validation) when every trial's sources hold a validation part, else ``entropy`` (the target's
    prediction entropy, which needs none). Fixed once and stored with the sweep, so ``--resume`` ranks alike."""
    key = "data.validation_fraction"
    given = [c.split("=", 1)[1] for c in constants if c.split("=", 1)[0] == key]
    fractions = axes.get(key) or ([_yaml_value(key, given[0])] if given else [base.data.validation_fraction])
    return "source_accuracy" if min(float(f) for f in fractions) > 0 else "entropy"
