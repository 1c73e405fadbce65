"""Checks on a config: one scalar against its field type, ranges, and the (method, benchmark) pair.

Every check ends in one :class:`fedsim.errors.UserError` line naming the key and the fix; the CLI
turns it into exit code 2 before anything is written.
"""

from __future__ import annotations

import typing
from typing import Any

from fedsim.errors import UserError


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


def validate(config) -> None:
    """Range checks that do not need the data."""
    checks = [
        (
            config.run.rounds > 0,
            f"run.rounds must be a positive integer, got {config.run.rounds}: pass --rounds 1 or more",
        ),
        (
            config.method.local_epochs > 0,
            f"method.local_epochs must be positive, got {config.method.local_epochs}: pass --local-epochs 1 or more",
        ),
        (config.method.batch_size > 0, f"method.batch_size must be positive, got {config.method.batch_size}"),
        (config.method.lr > 0, f"method.lr must be positive, got {config.method.lr}"),
        (
            config.data.clients_per_domain > 0,
            f"data.clients_per_domain must be positive, got {config.data.clients_per_domain}: pass --clients-per-domain 1 or more",
        ),
        (
            config.data.partition in ("iid", "dirichlet"),
            f"data.partition must be 'iid' or 'dirichlet', got {config.data.partition!r}",
        ),
        (
            config.data.normalization in ("auto", "none", "federated", "per-domain"),
            f"data.normalization must be auto, none, federated or per-domain, got {config.data.normalization!r}",
        ),
        (
            config.data.target not in config.data.sources,
            f"data.sources must not contain the target {config.data.target!r}",
        ),
        (config.data.dirichlet_alpha > 0, f"data.dirichlet_alpha must be positive, got {config.data.dirichlet_alpha}"),
        (
            config.run.backend in ("ray", "local"),
            f"run.backend must be 'ray' or 'local', got {config.run.backend!r}: pass --backend ray or --backend local",
        ),
        (
            config.run.clients_per_round is None or config.run.clients_per_round > 0,
            f"run.clients_per_round must be positive, got {config.run.clients_per_round}: pass a count or a fraction",
        ),
        (
            config.run.checkpoint_every >= 0,
            f"run.checkpoint_every must be 0 (off) or positive, got {config.run.checkpoint_every}",
        ),
        (config.run.eval_every > 0, f"run.eval_every must be positive, got {config.run.eval_every}"),
        (
            config.resources.cpus_per_client > 0,
            f"resources.cpus_per_client must be positive, got {config.resources.cpus_per_client}: pass --cpus-per-client 0.5 or more",
        ),
        (config.ray.max_restarts >= 0, f"ray.max_restarts must be 0 or more, got {config.ray.max_restarts}"),
        (
            config.ray.call_timeout_s >= 0,
            f"ray.call_timeout_s must be 0 (wait forever) or more, got {config.ray.call_timeout_s}",
        ),
        (
            config.ray.max_actors is None or config.ray.max_actors > 0,
            f"ray.max_actors must be positive, got {config.ray.max_actors}",
        ),
        (
            config.ray.inject_faults >= 0,
            f"ray.inject_faults must be 0 or more, got {config.ray.inject_faults}: pass --inject-faults 0 or more",
        ),
        (
            config.resources.gpus_per_client >= 0,
            f"resources.gpus_per_client must be 0 or more, got {config.resources.gpus_per_client}",
        ),
        (
            config.data.max_train_per_domain is None or config.data.max_train_per_domain > 0,
            "data.max_train_per_domain must be positive",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise UserError(message)


def check_task_pair(method_cls, benchmark_name: str) -> None:
    """A classification method on a detection benchmark (or the reverse) cannot work: refuse it, naming benchmarks that fit."""
    from fedsim.registry import BENCHMARKS

    benchmark_cls = BENCHMARKS.get(benchmark_name)
    if benchmark_cls.task == method_cls.task:
        return
    fitting = [name for name in BENCHMARKS.names() if BENCHMARKS.get(name).task == method_cls.task]
    raise UserError(
        f"method {method_cls.registry_name!r} is for {method_cls.task} and benchmark {benchmark_name!r} is {benchmark_cls.task}: "
        f"pick a {method_cls.task} benchmark with --benchmark ({', '.join(fitting)})"
    )
