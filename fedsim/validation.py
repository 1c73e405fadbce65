"""Checks on a config: one scalar against its field type, ranges, and the (method, benchmark) pair.

Every check ends in one :class:`fedsim.errors.UserError` line naming the key and the fix; the CLI
turns it into exit code 2 before anything is written.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import typing
from dataclasses import fields
from typing import Any, Mapping

from fedsim.errors import MissingDependency, UserError


def bare_off(value):
    """``"off"`` for what YAML makes of a bare ``off`` (false, or its text "False"); any other value as it is."""
    return "off" if value in ("False", False) else value


def coerce_value(value: Any, annotation: Any, where: str) -> Any:
    """Check and convert one scalar to the field's type."""
    hint = annotation
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise UserError(f"{where} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, (int, str, float)):
            raise UserError(f"{where} must be an integer, got {value!r}")
        try:
            as_float = float(value)
            if as_float != int(as_float):
                raise ValueError
            return int(as_float)
        except (ValueError, OverflowError):
            raise UserError(f"{where} must be an integer, got {value!r}") from None
    if hint is float:
        if isinstance(value, bool):
            raise UserError(f"{where} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise UserError(f"{where} must be a number, got {value!r}") from None
    if hint is str:
        if isinstance(value, (dict, list)):
            raise UserError(f"{where} must be a string, got {value!r}")
        return str(value)
    if origin in (tuple, list) or hint in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where} must be a list, got {value!r}")
        inner = args[0] if args else Any
        return tuple(coerce_value(v, inner, where) for v in value)
    return value


def closest(name: str, valid: list[str]) -> str:
    """The valid name closest to ``name``, as a hint (or the list of valid names)."""
    match = difflib.get_close_matches(name, valid, n=1)
    return f"did you mean {match[0]!r}?" if match else f"valid keys: {', '.join(sorted(valid))}"


def build_checked(
    cls: type, values: dict, where: str, extra_valid: tuple[str, ...] = (), moved: Mapping[str, str] | None = None
) -> Any:
    """``cls(**values)`` with every key known (``moved``: old dotted key -> new) and every value of its field's type."""
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in valid:
            new = (moved or {}).get(f"{where}.{key}")
            hint = f"it moved to {new!r} (Ray backend settings)" if new else closest(key, valid + list(extra_valid))
            raise UserError(f"unknown config key '{where}.{key}': {hint}")
        kwargs[key] = coerce_value(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


def split_method_keys(
    method_cls: type, params_cls: type, method_raw: dict, common_keys: list[str]
) -> tuple[dict, dict]:
    """The method section -> (the keys every method has, the method's own ``Params`` keys), unknown keys refused."""
    common = set(common_keys) - {"params"}
    params_valid = [f.name for f in fields(params_cls)]
    clash = sorted(common & set(params_valid))
    if clash:
        raise TypeError(f"{method_cls.__name__}.Params redefines common method keys {clash}: use the common ones")
    for key in method_raw:
        if key not in common and key != "params" and key not in params_valid:
            raise UserError(
                f"unknown config key 'method.{key}' for method {method_cls.registry_name!r}: "
                f"{closest(key, sorted(common) + params_valid)}"
            )
    shared = {k: v for k, v in method_raw.items() if k in common}
    return shared, {k: v for k, v in method_raw.items() if k in params_valid}


def _method_and_run_checks(config) -> list[tuple[bool, str]]:
    method, run = config.method, config.run
    return [
        (run.rounds > 0, f"run.rounds must be a positive integer, got {run.rounds}: pass --rounds 1 or more"),
        (
            method.local_epochs > 0,
            f"method.local_epochs must be positive, got {method.local_epochs}: pass --local-epochs 1 or more",
        ),
        (method.batch_size > 0, f"method.batch_size must be positive, got {method.batch_size}"),
        (method.lr > 0, f"method.lr must be positive, got {method.lr}"),
        (
            run.backend in ("ray", "local"),
            f"run.backend must be 'ray' or 'local', got {run.backend!r}: pass --backend ray or --backend local",
        ),
        (
            run.clients_per_round is None or run.clients_per_round > 0,
            f"run.clients_per_round must be positive, got {run.clients_per_round}: pass a count or a fraction",
        ),
        (run.checkpoint_every >= 0, f"run.checkpoint_every must be 0 (off) or positive, got {run.checkpoint_every}"),
        (run.eval_every > 0, f"run.eval_every must be positive, got {run.eval_every}"),
        (
            run.precision in ("fp32", "bf16"),
            f"run.precision must be 'fp32' or 'bf16', got {run.precision!r}: e.g. --set run.precision=bf16",
        ),
    ]


def _data_checks(data) -> list[tuple[bool, str]]:
    return [
        (
            data.clients_per_domain > 0,
            f"data.clients_per_domain must be positive, got {data.clients_per_domain}: "
            "pass --clients-per-domain 1 or more",
        ),
        (
            data.partition in ("iid", "dirichlet"),
            f"data.partition must be 'iid' or 'dirichlet', got {data.partition!r}",
        ),
        (
            data.normalization in ("auto", "none", "federated", "per-domain"),
            f"data.normalization must be auto, none, federated or per-domain, got {data.normalization!r}",
        ),
        (data.target not in data.sources, f"data.sources must not contain the target {data.target!r}"),
        (data.dirichlet_alpha > 0, f"data.dirichlet_alpha must be positive, got {data.dirichlet_alpha}"),
        (
            data.max_train_per_domain is None or data.max_train_per_domain > 0,
            "data.max_train_per_domain must be positive",
        ),
        (
            0 <= data.validation_fraction < 1,
            f"data.validation_fraction must be in [0, 1), got {data.validation_fraction}: the share of each source "
            "client's training part held out for validation (0: none; DomainBed holds out 0.2)",
        ),
    ]


def _resource_checks(resources, ray) -> list[tuple[bool, str]]:
    return [
        (
            resources.cpus_per_client > 0,
            f"resources.cpus_per_client must be positive, got {resources.cpus_per_client}: "
            "pass --cpus-per-client 0.5 or more",
        ),
        (
            resources.gpus_per_client >= 0,
            f"resources.gpus_per_client must be 0 or more, got {resources.gpus_per_client}",
        ),
        (
            resources.vectorize in ("off", "auto"),
            f"resources.vectorize must be 'off' or 'auto', got {resources.vectorize!r}: "
            "e.g. --set resources.vectorize=auto",
        ),
        (ray.max_restarts >= 0, f"ray.max_restarts must be 0 or more, got {ray.max_restarts}"),
        (ray.call_timeout_s >= 0, f"ray.call_timeout_s must be 0 (wait forever) or more, got {ray.call_timeout_s}"),
        (ray.max_actors is None or ray.max_actors > 0, f"ray.max_actors must be positive, got {ray.max_actors}"),
        (
            ray.inject_faults >= 0,
            f"ray.inject_faults must be 0 or more, got {ray.inject_faults}: pass --inject-faults 0 or more",
        ),
    ]


def _trace_check(key: str, path) -> tuple[bool, str]:
    ok = path is None or str(path).lower().endswith((".csv", ".json"))
    return ok, f"clients.{key} must name a .csv or .json file, got {path!r}: see docs/unreliable.md for the format"


def _clients_checks(clients) -> list[tuple[bool, str]]:
    return [
        (
            0 < clients.availability <= 1,
            f"clients.availability must be in (0, 1], got {clients.availability}: the probability that a source "
            "client is available in a round (1: always)",
        ),
        (
            0 <= clients.failure_rate < 1,
            f"clients.failure_rate must be in [0, 1), got {clients.failure_rate}: the probability that a call's "
            "reply is lost (0: never)",
        ),
        (
            clients.on_failure in ("drop", "wait"),
            f"clients.on_failure must be 'drop' or 'wait', got {clients.on_failure!r}",
        ),
        (
            clients.speed_spread >= 0,
            f"clients.speed_spread must be 0 (equal clients) or more, got {clients.speed_spread}",
        ),
        (
            clients.seconds_per_sample > 0,
            f"clients.seconds_per_sample must be positive, got {clients.seconds_per_sample}",
        ),
        (clients.link_mbps > 0, f"clients.link_mbps must be positive, got {clients.link_mbps}"),
        (
            clients.deadline_seconds is None or clients.deadline_seconds > 0,
            f"clients.deadline_seconds must be positive, got {clients.deadline_seconds}: or leave it out (no deadline)",
        ),
        _trace_check("availability_trace", clients.availability_trace),
        _trace_check("speed_trace", clients.speed_trace),
    ]


def _positive_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _privacy_checks(privacy) -> list[tuple[bool, str]]:
    from fedsim.config import PRIVACY_ACCOUNTANTS, PRIVACY_MODES, PrivacyConfig

    z, epsilon, delta, clip = privacy.noise_multiplier, privacy.epsilon, privacy.delta, privacy.clip
    stage_clip = privacy.stage_clip
    given = sorted(f"privacy.{f.name}" for f in fields(privacy) if getattr(privacy, f.name) != f.default)
    return [
        (
            privacy.active or privacy == PrivacyConfig(),
            f"{', '.join(given)} set but privacy is off: give privacy.noise_multiplier or privacy.epsilon (or leave "
            "the section out)",
        ),
        (
            z is None or epsilon is None,
            "privacy.noise_multiplier and privacy.epsilon are two ways to set the noise: give one, not both",
        ),
        (z is None or _positive_number(z), f"privacy.noise_multiplier must be a positive number, got {z}"),
        (epsilon is None or _positive_number(epsilon), f"privacy.epsilon must be a positive number, got {epsilon}"),
        (
            epsilon is None or delta is not None,
            "privacy.epsilon needs privacy.delta, the delta of the (epsilon, delta) budget: e.g. privacy.delta=1e-5",
        ),
        (delta is None or 0 < delta < 1, f"privacy.delta must be in (0, 1), got {delta}"),
        (
            not privacy.active or clip is not None,
            "privacy.clip is required with privacy on: the L2 bound of one client's contribution to an exchange, "
            "e.g. privacy.clip=1.0",
        ),
        (clip is None or _positive_number(clip), f"privacy.clip must be a positive number, got {clip}"),
        (
            stage_clip is None
            or (isinstance(stage_clip, dict) and all(_positive_number(v) for v in stage_clip.values())),
            f"privacy.stage_clip must map stages to positive bounds, got {stage_clip!r}: e.g. "
            "--set 'privacy.stage_clip={features: 50}'",
        ),
        (
            privacy.mode in PRIVACY_MODES,
            f"privacy.mode must be one of {', '.join(PRIVACY_MODES)}, got {privacy.mode!r}",
        ),
        (
            privacy.accountant in PRIVACY_ACCOUNTANTS,
            f"privacy.accountant must be one of {', '.join(PRIVACY_ACCOUNTANTS)}, got {privacy.accountant!r}",
        ),
    ]


def check_privacy(config) -> None:
    """With privacy on: the method's exchanges can take the noise (:func:`fedsim.privacy.method_exchanges`), and
    every stage ``privacy.stages`` and ``privacy.stage_clip`` name is one of its training stages that sends no
    integer tensor."""
    from fedsim.privacy import method_exchanges
    from fedsim.privacy.exchanges import EVALUATION_STAGES, SETUP_STAGES

    privacy, name = config.privacy, config.method.name
    if not privacy.active:
        return
    if importlib.util.find_spec("dp_accounting") is None:
        raise MissingDependency(
            "the privacy section counts the budget with Google's dp-accounting, which is not installed: "
            "pip install -c constraints.txt dp-accounting"
        )
    exchanges = method_exchanges(config)
    training = ", ".join(exchanges.default_stages)
    for stage in privacy.stages:
        where = f"privacy.stages names {stage!r}"
        if stage in EVALUATION_STAGES or stage in SETUP_STAGES:
            kind = "an evaluation" if stage in EVALUATION_STAGES else "a data standardization"
            raise UserError(
                f"{where}, {kind} stage: evaluation and setup stages are never noised, they are the simulator's "
                f"instruments; method {name!r} trains with {training}"
            )
        if stage not in exchanges.operations:
            raise UserError(f"{where}, which is not a training stage of method {name!r}: use {training}")
        found = exchanges.stage(stage)
        if found.integers:
            raise UserError(
                f"{where}: method {name!r} sends {found.integers} there, an integer tensor, which noise cannot "
                "protect: leave it out of privacy.stages"
            )
    noised = privacy.stages or exchanges.default_stages
    unknown = sorted(set(privacy.stage_clip or {}) - set(noised))
    if unknown:
        raise UserError(
            f"privacy.stage_clip names {', '.join(unknown)}, not a noised stage of method {name!r}: use "
            f"{', '.join(noised)}"
        )


def check_missing_replies(config) -> None:
    """Refuse settings that lose sources' replies for a method that needs every reply it asks for (its
    ``copes_with_missing_replies`` is False)."""
    from fedsim.registry import METHODS

    if not config.clients.drops_replies:
        return
    if not getattr(METHODS.get(config.method.name), "copes_with_missing_replies", False):
        coping = sorted(
            name for name in METHODS.names() if getattr(METHODS.get(name), "copes_with_missing_replies", False)
        )
        raise UserError(
            f"method {config.method.name!r} needs every reply it asks for, so clients.availability, "
            "clients.availability_trace, clients.failure_rate with on_failure=drop and clients.deadline_seconds "
            f"cannot apply to it: leave them at their defaults or use one of {', '.join(coping)}"
        )


def validate(config) -> None:
    """Range checks that do not need the data; the first failing one raises."""
    checks = _method_and_run_checks(config) + _data_checks(config.data)
    checks += _resource_checks(config.resources, config.ray)
    checks += _clients_checks(config.clients) + _privacy_checks(config.privacy)
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    check_missing_replies(config)
    check_privacy(config)
    check_scores(config)
    check_precision(config)
    check_resource_groups(config)


def check_resource_groups(config) -> None:
    """``resources.groups``: a mapping from a role (source, target) or a domain of the benchmark to overrides of
    ``cpus_per_client`` (positive) and ``gpus_per_client`` (0 or more), and of nothing else. The benchmark lists its
    domains only when a name is neither a role nor ``data.target`` nor one of ``data.sources``."""
    from fedsim.config import ResourcesConfig
    from fedsim.data.scenario import get_benchmark

    groups, keys, roles = config.resources.groups, list(ResourcesConfig.GROUP_KEYS), ResourcesConfig.GROUP_ROLES
    example = "e.g. --set 'resources.groups={target: {gpus_per_client: 0.5}}'"
    if groups is None:
        return
    if not isinstance(groups, dict):
        raise UserError(f"resources.groups must map client groups to resources, got {groups!r}: {example}")
    for name, overrides in groups.items():
        where = f"resources.groups.{name}"
        if not isinstance(overrides, dict):
            raise UserError(f"{where} must map {' and '.join(keys)} to numbers, got {overrides!r}: {example}")
        for key, value in overrides.items():
            if key not in keys:
                match = difflib.get_close_matches(str(key), keys, n=1)
                hint = f": did you mean {match[0]!r}?" if match else ""
                raise UserError(f"unknown config key '{where}.{key}': a group sets {' and '.join(keys)} only{hint}")
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if key == "cpus_per_client" and not (number and value > 0):
                raise UserError(f"{where}.{key} must be a positive number, got {value!r}")
            if key == "gpus_per_client" and not (number and value >= 0):
                raise UserError(f"{where}.{key} must be 0 or a positive number, got {value!r}")
        if name in (*roles, config.data.target, *config.data.sources):
            continue
        domains = list(get_benchmark(config.data).domains())
        if name not in domains:
            match = difflib.get_close_matches(str(name), [*roles, *domains], n=1)
            hint = f"did you mean {match[0]!r}?" if match else f"use {', '.join([*roles, *domains])}"
            raise UserError(
                f"resources.groups names {name!r}, neither a role ({', '.join(roles)}) nor a domain of benchmark "
                f"{config.data.benchmark!r}: {hint}"
            )


def check_precision(config) -> None:
    """``run.precision=bf16`` applies to the classification methods' loops; the detection methods train and detect
    in float32, so asking them for bf16 is refused rather than ignored."""
    from fedsim.registry import METHODS

    if config.run.precision != "fp32" and METHODS.get(config.method.name).task != "classification":
        raise UserError(
            f"run.precision={config.run.precision} applies to the classification methods; {config.method.name!r} "
            "trains a detector in float32: leave run.precision at fp32"
        )


def check_scores(config) -> None:
    """``run.scores`` resolved against the data (:func:`fedsim.selection.resolve_scores`: an unknown name, or a
    source-validation score without ``data.validation_fraction``, is one line); a detection method reports no
    score, so naming one there is refused."""
    from fedsim.registry import METHODS
    from fedsim.selection import resolve_scores

    scores = str(config.run.scores).strip()
    if METHODS.get(config.method.name).task != "classification":
        if scores not in ("auto", "none"):
            raise UserError(
                f"run.scores={scores} names model-selection scores, which are computed from a classifier's logits "
                f"and method {config.method.name!r} is a detection method: leave run.scores at auto (or none)"
            )
        return
    try:
        resolve_scores(scores, has_validation=config.data.validation_fraction > 0)
    except UserError as exc:
        raise UserError(f"run.scores={scores}: {exc}") from None


def check_task_pair(method_cls, benchmark_name: str) -> None:
    """A classification method on a detection benchmark (or the reverse) cannot work: refuse it, naming the
    benchmarks that fit."""
    from fedsim.registry import BENCHMARKS

    benchmark_cls = BENCHMARKS.get(benchmark_name)
    if benchmark_cls.task == method_cls.task:
        return
    fitting = [name for name in BENCHMARKS.names() if BENCHMARKS.get(name).task == method_cls.task]
    raise UserError(
        f"method {method_cls.registry_name!r} is for {method_cls.task} and benchmark {benchmark_name!r} is "
        f"{benchmark_cls.task}: pick a {method_cls.task} benchmark with --benchmark ({', '.join(fitting)})"
    )
