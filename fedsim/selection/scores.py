"""The interface of a model-selection score, and the resolution of a user's request into score names.

A score is a :class:`Score` subclass found through :data:`fedsim.registry.SCORES` (the built-ins are in
:mod:`fedsim.selection.statistics`). Every score is oriented so that higher is better (as skada's scorers are).
:func:`resolve_scores` turns the ``run.scores`` request ("auto", "none", a comma list or a sequence of names) into
checked names; a bad name is a :class:`fedsim.errors.UserError` naming the fix.
"""

from __future__ import annotations

from typing import ClassVar, Sequence, Union

import numpy as np

from fedsim.errors import UserError

#: the setting that gives the sources a held-out validation part, named by the error of a score that needs it
VALIDATION_FIX = "--set data.validation_fraction=0.2"


class Score:
    """A model-selection score: what each client computes from its rows and how the server combines it.

    A score is a class (built-in or in the user's package, named in ``run.scores`` by its registered name, a dotted
    path ``mypkg.scores:MyScore`` or an entry point of group ``fedsim.scores``); fedsim makes one with no argument.
    Higher is better. A source client calls :meth:`source_statistics` on its held-out validation part when
    ``needs_validation``; a target client calls :meth:`target_statistics` on its unlabeled training inputs (no label
    reaches it); the server calls :meth:`combine` on the clients' statistics, pooled over sources and targets. The
    statistics are plain floats under keys of the score's own (keys two scores share must mean the same sum);
    every source's holds ``n_validation``, every target's ``n_target``.
    """

    paper: ClassVar[str] = ""
    """The citation of the score's definition."""
    description: ClassVar[str] = ""
    """One line: what the score measures."""
    needs_validation: ClassVar[bool] = False
    """It reads the sources' held-out validation part (labels included)."""
    needs_density: ClassVar[bool] = False
    """It weighs the validation rows by the density ratio w = p_target / p_source (one more exchange)."""
    cheap: ClassVar[bool] = False
    """A built-in that "auto" computes whenever its inputs exist."""
    name: ClassVar[str] = ""
    """Its metric's name, ``score_<name>``, the same whichever way the score is named in ``run.scores``: a plugin
    must declare it; a built-in's is the name it is registered under."""
    registry_name: ClassVar[str] = ""
    """The name it is registered under (set by the registry)."""

    @classmethod
    def column(cls) -> str:
        """Its metric, ``score_<name>``."""
        return "score_" + (cls.name or cls.registry_name)

    def source_statistics(self, logits: np.ndarray, labels: np.ndarray, losses: np.ndarray, log_weights) -> dict:
        """A source's sums, from its validation rows' logits [n, K] (float64), integer labels [n], cross-entropies
        [n] and, for a score that ``needs_density``, log w(x) per row (None otherwise)."""
        return {}

    def target_statistics(self, logits: np.ndarray, log_probabilities: np.ndarray) -> dict:
        """A target client's sums, from its unlabeled rows' logits [n, K] and their log softmax (float64)."""
        return {}

    def combine(self, sources: Sequence[dict], targets: Sequence[dict]) -> float:
        """The score from every source's and every target's statistics."""
        raise NotImplementedError(f"{type(self).__name__} must define combine(sources, targets)")


def score(name: str) -> Score:
    """The score registered as ``name`` (a built-in, a dotted path or an entry point), made."""
    from fedsim.registry import SCORES

    return SCORES.get(name)()


def _known() -> str:
    from fedsim.registry import SCORES

    return ", ".join(SCORES.names()) + " (or 'auto', or 'none', or a plugin as module.path:Class)"


def _names(requested: Union[str, Sequence[str]]) -> list[str]:
    if isinstance(requested, str):
        parts = requested.split(",")
    elif isinstance(requested, Sequence) and all(isinstance(item, str) for item in requested):
        parts = list(requested)
    else:
        raise UserError(f"selection scores must be a name, a comma list or a list of names, got {requested!r}")
    names = [part.strip() if ":" in part else part.strip().lower() for part in parts]
    if not names or any(not name for name in names):
        raise UserError(f"selection scores {requested!r} holds an empty name: name scores from {_known()}")
    return names


def resolve_scores(requested: Union[str, Sequence[str]], has_validation: bool) -> tuple[str, ...]:
    """The score names a request asks for, checked, in the order asked (each once).

    ``"auto"``: the cheap scores whose inputs exist (the ``source_*`` scores only when ``has_validation``);
    ``"none"``: no score; a comma string or a sequence of names: those names. An unknown name, or a name that needs
    the sources' validation part while ``has_validation`` is False, is a :class:`fedsim.errors.UserError`.
    """
    from fedsim.registry import SCORES

    names = _names(requested)
    if names == ["none"]:
        return ()
    if names == ["auto"]:
        builtins = [(name, SCORES.get(name)) for name in SCORES.builtin_names()]
        return tuple(n for n, s in builtins if s.cheap and (has_validation or not s.needs_validation))
    for name in names:
        if name in ("auto", "none"):
            raise UserError(f"selection scores {requested!r}: '{name}' stands alone, not in a list of names")
        if ":" not in name and name not in SCORES:
            raise UserError(f"unknown selection score {name!r}: the known scores are {_known()}")
        if SCORES.get(name).needs_validation and not has_validation:
            raise UserError(
                f"selection score {name!r} needs the sources' held-out validation part, which this run does not "
                f"hold: add {VALIDATION_FIX}"
            )
    names = list(dict.fromkeys(names))
    columns: dict[str, str] = {}
    for name in names:
        other = columns.setdefault(SCORES.get(name).column(), name)
        if other != name:
            raise UserError(
                f"selection scores {other!r} and {name!r} both report {SCORES.get(name).column()}: keep one of them"
            )
    return tuple(names)


def checked_scores(scores: Sequence[str]) -> list[Score]:
    """The scores named by ``scores``, made (a ValueError for an unknown name: names come from
    :func:`resolve_scores`, so an unknown one here is a programming error)."""
    from fedsim.registry import SCORES

    if isinstance(scores, str):
        raise ValueError(f"scores must be a sequence of names, got the string {scores!r}")
    unknown = [name for name in scores if ":" not in name and name not in SCORES]
    if unknown:
        raise ValueError(f"unknown score names {unknown}: the known ones are {SCORES.names()}")
    return [score(name) for name in scores]
