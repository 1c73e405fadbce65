"""Class-balanced mini-batches of a dataset dictionary's atoms and of a domain's samples (DaDiL, FedDaDiL).

The authors' code (PyDiL's ``DaDiLServer.sample_from_atoms``, ``DaDiLClient.sample``,
``LabeledEmpiricalDictionary.sample_from_atoms``) draws ``n_b // C`` rows of each class C: from the atoms by their
labels' argmax, from a labeled domain by its labels; the unlabeled target is drawn uniformly with replacement.
"""

from __future__ import annotations

from typing import Optional

import torch


def per_class(batch_size: int, classes: int) -> int:
    """Rows of each class in a class-balanced batch of about ``batch_size`` rows (n_b // C, at least 1)."""
    return max(batch_size // classes, 1)


def balanced_rows(labels: torch.Tensor, classes: int, count: int, generator: torch.Generator, replace: bool):
    """``count`` indices of each class c in 0..classes-1, concatenated class by class (shape (classes * count,)).

    ``replace=True`` draws with replacement (the server's atom batches); otherwise without, from a permutation of
    the class (a client's data), topping up with replacement when the class has fewer than ``count`` rows, so every
    batch keeps its shape. A class no row carries is drawn from all rows."""
    picks = []
    for c in range(classes):
        pool = torch.nonzero(labels == c).flatten()
        if len(pool) == 0:
            pool = torch.arange(len(labels))
        if replace or len(pool) < count:
            picks.append(pool[torch.randint(len(pool), (count,), generator=generator)])
        else:
            picks.append(pool[torch.randperm(len(pool), generator=generator)[:count]])
    return torch.cat(picks)


def balanced_atom_rows(atoms_logits, batch_size: int, generator: torch.Generator, replace: bool) -> torch.Tensor:
    """One class-balanced index set per atom, shape (K, C * (n_b // C)), by the atoms' current hard labels."""
    logits = torch.as_tensor(atoms_logits)
    classes, count = logits.shape[-1], per_class(batch_size, logits.shape[-1])
    hard = logits.argmax(-1)
    return torch.stack([balanced_rows(hard[k], classes, count, generator, replace) for k in range(len(hard))])


def domain_rows(
    labels: Optional[torch.Tensor], num_rows: int, classes: int, batch_size: int, generator: torch.Generator
) -> torch.Tensor:
    """A domain's mini-batch of C * (n_b // C) rows: class-balanced without replacement for a labeled domain,
    uniform with replacement for the unlabeled target (``labels`` None)."""
    count = per_class(batch_size, classes)
    if labels is None:
        return torch.randint(num_rows, (classes * count,), generator=generator)
    return balanced_rows(labels, classes, count, generator, replace=False)
