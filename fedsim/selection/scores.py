"""The registry of the model-selection scores and the resolution of a user's request into score names.

Every score is oriented so that higher is better (as skada's scorers are). :func:`resolve_scores` turns the
``selection.scores`` request ("auto", "none", a comma list or a sequence of names) into checked names; a bad name is a
:class:`fedsim.errors.UserError` naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from fedsim.errors import UserError

#: the setting that gives the sources a held-out validation part, named by the error of a score that needs it
VALIDATION_FIX = "--set data.validation_fraction=0.2"


@dataclass(frozen=True)
class Score:
    """One model-selection score: its citation, which inputs it needs, and whether it is computed by default.

    ``needs_validation``: it reads the sources' held-out validation part (labels included);
    ``needs_density``: it weighs those rows by the density ratio w = p_target / p_source (one more exchange);
    ``cheap``: "auto" computes it whenever its inputs exist.
    """

    name: str
    paper: str
    needs_validation: bool
    needs_density: bool
    cheap: bool
    description: str


_DOMAINBED = "Gulrajani & Lopez-Paz, In Search of Lost Domain Generalization, ICLR 2021 (training-domain validation)"

#: the scores, in the order their columns appear
SCORES: dict[str, Score] = {
    score.name: score
    for score in (
        Score(
            "source_accuracy",
            _DOMAINBED,
            needs_validation=True,
            needs_density=False,
            cheap=True,
            description="accuracy on the sources' validation parts, pooled: sum correct / sum n",
        ),
        Score(
            "source_loss",
            _DOMAINBED,
            needs_validation=True,
            needs_density=False,
            cheap=True,
            description="minus the mean cross-entropy on the sources' validation parts",
        ),
        Score(
            "entropy",
            "Morerio, Cavazza & Murino, Minimal-Entropy Correlation Alignment for Unsupervised Deep Domain "
            "Adaptation, ICLR 2018",
            needs_validation=False,
            needs_density=False,
            cheap=True,
            description="minus the mean prediction entropy on the target's unlabeled inputs",
        ),
        Score(
            "snd",
            "Saito, Kim, Teterwak, Sclaroff, Darrell & Saenko, Tune it the Right Way: Unsupervised Validation of "
            "Domain Adaptation via Soft Neighborhood Density, ICCV 2021",
            needs_validation=False,
            needs_density=False,
            cheap=False,  # its similarity matrix grows with the square of the target's rows (digits: a minute)
            description="soft neighborhood density of the target's softmax outputs (temperature 0.05); on request: "
            "its cost grows with the square of the target client's rows",
        ),
        Score(
            "mano",
            "Xie, Odonnat, Feofanov, Deng, Zhang & An, MaNo: Exploiting Matrix Norm for Unsupervised Accuracy "
            "Estimation Under Distribution Shifts, NeurIPS 2024",
            needs_validation=False,
            needs_density=False,
            cheap=True,
            description="scaled L4 matrix norm of the target's normalized logits (softmax or Taylor, by a criterion)",
        ),
        Score(
            "iwv",
            "Sugiyama, Krauledat & Mueller, Covariate Shift Adaptation by Importance Weighted Cross Validation, "
            "JMLR 2007",
            needs_validation=True,
            needs_density=True,
            cheap=False,
            description="minus the self-normalized importance-weighted loss on the sources' validation parts, "
            "sum w l / sum w",
        ),
        Score(
            "dev",
            "You, Wang, Long & Wang, Towards Accurate Model Selection in Deep Unsupervised Domain Adaptation, "
            "ICML 2019",
            needs_validation=True,
            needs_density=True,
            cheap=False,
            description="minus the deep-embedded-validation risk (importance weights with a control variate)",
        ),
    )
}


def _known() -> str:
    return ", ".join(SCORES) + " (or 'auto', or 'none')"


def _names(requested: Union[str, Sequence[str]]) -> list[str]:
    if isinstance(requested, str):
        parts = requested.split(",")
    elif isinstance(requested, Sequence) and all(isinstance(item, str) for item in requested):
        parts = list(requested)
    else:
        raise UserError(f"selection scores must be a name, a comma list or a list of names, got {requested!r}")
    names = [part.strip().lower() for part in parts]
    if not names or any(not name for name in names):
        raise UserError(f"selection scores {requested!r} holds an empty name: name scores from {_known()}")
    return names


def resolve_scores(requested: Union[str, Sequence[str]], has_validation: bool) -> tuple[str, ...]:
    """The score names a request asks for, checked, in the order asked (each once).

    ``"auto"``: the cheap scores whose inputs exist (the ``source_*`` scores only when ``has_validation``);
    ``"none"``: no score; a comma string or a sequence of names: those names. An unknown name, or a name that needs
    the sources' validation part while ``has_validation`` is False, is a :class:`fedsim.errors.UserError`.
    """
    names = _names(requested)
    if names == ["none"]:
        return ()
    if names == ["auto"]:
        return tuple(n for n, s in SCORES.items() if s.cheap and (has_validation or not s.needs_validation))
    for name in names:
        if name in ("auto", "none"):
            raise UserError(f"selection scores {requested!r}: '{name}' stands alone, not in a list of names")
        if name not in SCORES:
            raise UserError(f"unknown selection score {name!r}: the known scores are {_known()}")
        if SCORES[name].needs_validation and not has_validation:
            raise UserError(
                f"selection score {name!r} needs the sources' held-out validation part, which this run does not "
                f"hold: add {VALIDATION_FIX}"
            )
    return tuple(dict.fromkeys(names))


def checked_names(scores: Sequence[str]) -> tuple[str, ...]:
    """``scores`` as a tuple, each a key of :data:`SCORES` (a ValueError otherwise: names come from
    :func:`resolve_scores`, so an unknown one here is a programming error)."""
    if isinstance(scores, str):
        raise ValueError(f"scores must be a sequence of names, got the string {scores!r}")
    unknown = [name for name in scores if name not in SCORES]
    if unknown:
        raise ValueError(f"unknown score names {unknown}: the known ones are {list(SCORES)}")
    return tuple(scores)
