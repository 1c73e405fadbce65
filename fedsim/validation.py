"""Checks across a config's sections: what one section allows depends on another, on the method or on the
benchmark (each section checks its own values when it is built: :mod:`fedsim.config`).

:func:`validate` runs them all once the sections are built (:func:`fedsim.config.load_config` calls it). Every check
ends in one :class:`fedsim.errors.UserError` line naming the key and the fix; the CLI turns it into exit code 2
before anything is written.
"""

from __future__ import annotations

import difflib
import importlib.util

from fedsim.errors import MissingDependency, UserError


def validate(config) -> None:
    """Every rule across sections, in order; the first failing one raises. (The data, the privacy accounting and
    the selection scores are imported by the checks that need them: loading a config stays light.)"""
    from fedsim.registry import METHODS, MODELS

    check_missing_replies(config)
    check_privacy(config)
    check_scores(config)
    check_precision(config)
    check_resource_groups(config)
    check_task_pair(METHODS.get(config.method.name), config.data.benchmark)
    if config.model.name != "auto":
        MODELS.check(config.model.name)


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
    if privacy.unit == "record":
        check_record_privacy(config, exchanges)
        return
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


def check_record_privacy(config, exchanges) -> None:
    """With ``privacy.unit=record``: the method's local update is DP-SGD's and no stage sends records' values
    (:meth:`fedsim.privacy.Exchanges.record_refusal`), and its clients train one by one (per-example gradients)."""
    name = config.method.name
    why = exchanges.record_refusal()
    if why:
        raise UserError(
            f"privacy.unit=record cannot apply to method {name!r}: {why}; use privacy.unit=client, or a method of "
            "the FedAvg family (fedavg, fedprox), fedrep or feddann"
        )
    rows = sorted(s.operation for s in exchanges.stages if s.records and s.record_mechanism)
    unknown = sorted(set(config.privacy.stage_clip or {}) - set(rows))
    if unknown:
        where = (
            f"sends them in {', '.join(rows)} only; leave the others out"
            if rows
            else "sends none; leave privacy.stage_clip out"
        )
        raise UserError(
            f"privacy.stage_clip names {', '.join(unknown)}: under privacy.unit=record it bounds the rows of a stage "
            f"that sends records' own values, and method {name!r} {where}"
        )
    if config.resources.vectorize != "off":
        raise UserError(
            "privacy.unit=record trains each client with DP-SGD's per-example gradients, not batched across "
            "clients: set resources.vectorize=off"
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


def check_resource_groups(config) -> None:
    """Each name of ``resources.groups`` (whose overrides the section checks itself) is a role (source, target) or a
    domain of the benchmark; the benchmark lists its domains only when a name is neither a role nor ``data.target``
    nor one of ``data.sources``."""
    from fedsim.data.scenario import get_benchmark

    roles = type(config.resources).GROUP_ROLES
    for name in config.resources.groups or {}:
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
