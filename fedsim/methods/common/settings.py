"""The settings of a local update that travel in each instruction's config, so a method may vary them by round."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class LocalSettings:
    """What a client's local update reads each round (Flower's fit config): epochs, batch size and SGD's settings.

    It has the attributes :func:`fedsim.methods.common.training.make_optimizer` reads, so it stands in for the
    ``method`` section wherever a client builds its optimizer.
    """

    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float

    @classmethod
    def from_method(cls, method_config) -> LocalSettings:
        """The values of the experiment's ``method`` section."""
        return cls(**{f.name: getattr(method_config, f.name) for f in fields(cls)})

    @classmethod
    def from_config(cls, config: Mapping[str, Any], fallback=None) -> LocalSettings:
        """The values an instruction's ``config`` carries; a value it lacks comes from ``fallback`` (a ``method``
        section), or raises KeyError when there is none."""
        if fallback is None:
            return cls(**{f.name: config[f.name] for f in fields(cls)})
        return cls(**{f.name: config.get(f.name, getattr(fallback, f.name)) for f in fields(cls)})

    def to_config(self) -> dict[str, Any]:
        return asdict(self)
