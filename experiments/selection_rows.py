"""What a selection report holds (:mod:`fedsim.experiments.selection`): per group its candidates, the default,
each score's pick and the oracle, as plain dataclasses that the report's table, file and plot read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

DEFAULT, ORACLE = "default", "oracle"


@dataclass
class Candidate:
    """One setting of a group: its means over the seeds of its finished trials."""

    params: tuple[tuple[str, Any], ...]  # candidate key -> value, in candidate_keys order
    seeds: tuple  # the seeds of its finished trials, sorted
    missing_seeds: tuple  # seeds at which another candidate of the group finished and this one did not
    accuracy: Optional[float]  # mean target accuracy over its seeds (None: missing at one of them)
    accuracy_std: Optional[float]  # sample std over its seeds (None below two)
    source_accuracy: Optional[float]  # mean over its seeds of the sources' mean accuracy
    scores: dict[str, Optional[float]]  # score -> mean over its seeds (None: missing at one of them)

    @property
    def label(self) -> str:
        return setting_label(self.params)

    @property
    def complete(self) -> bool:
        """Finished at every seed of its group: only such candidates are compared."""
        return bool(self.seeds) and not self.missing_seeds


@dataclass
class Choice:
    """What one rule (the default, a score, the oracle) chose in a group, and how it did on the target."""

    rule: str  # "default", a score's name, or "oracle"
    label: str  # the chosen setting; for a mean over targets, the settings chosen and on how many targets
    params: Optional[dict]  # the chosen setting's values (None for a mean over targets)
    accuracy: Optional[float]  # target accuracy: the mean over seeds (over targets for a mean row)
    accuracy_std: Optional[float]  # sample std over seeds (None below two seeds and for a mean row)
    source_accuracy: Optional[float]
    score: Optional[float] = None  # the mean score that picked it (score rules only)
    gap: Optional[float] = None  # oracle's target accuracy minus this choice's
    seeds: int = 0
    note: str = ""


@dataclass
class SelectionRow:
    """One group: its candidates in grid order, the default, each score's pick and the oracle."""

    group: tuple[tuple[str, Any], ...]  # group key -> value
    scores: list[str]
    default: Optional[Choice]  # None: the grid has no default candidate
    picks: dict[str, Optional[Choice]]  # score -> its pick (None: no comparable candidate reports the score)
    oracle: Optional[Choice]  # None: no comparable candidate has a target accuracy
    candidates: list[Candidate] = field(default_factory=list)
    seeds: tuple = ()  # the seeds at which some candidate of the group finished
    notes: list[str] = field(default_factory=list)

    @property
    def gaps(self) -> dict[str, Optional[float]]:
        """Score -> the oracle's target accuracy minus its pick's."""
        return {score: pick.gap if pick else None for score, pick in self.picks.items()}

    def choices(self) -> list[tuple[str, Optional[Choice]]]:
        """(rule, choice) in report order: the default, each score, the oracle."""
        return [(DEFAULT, self.default), *self.picks.items(), (ORACLE, self.oracle)]


def setting_label(params: Sequence[tuple[str, Any]]) -> str:
    """(('method.lr', 0.1), ('local_epochs', 5)) -> 'method.lr=0.1, local_epochs=5'; a run of a reproduce spec
    by its name alone: (('run', 'fedavg'),) -> 'fedavg'."""
    return ", ".join(str(v) if k == "run" else f"{k}={v}" for k, v in params)
