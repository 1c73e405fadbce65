"""Dataset dictionary learning (DaDiL): the atoms, the loss, the drift, shared by ``feddadil`` and ``dadil``.

Montesuma, Mboula, Souloumiac, "Multi-Source Domain Adaptation through Dataset
Dictionary Learning in Wasserstein Space", ECAI 2023 (DaDiL); federated form:
Castellon, Montesuma et al., "Federated Dataset Dictionary Learning for
Multi-Source Domain Adaptation", ICASSP 2024 (FedDaDiL).

A dictionary is K atoms, each n labeled samples (features X_k, soft labels
softmax(L_k)). A domain l is modelled by the labeled barycenter B(alpha_l; P)
and the loss of one mini-batch is (DaDiL Eq. 9)

    W_c(Q_l, B(alpha_l; P)),  c((x, y), (x', y')) = ||x - x'||^2 + beta ||y - y'||^2

for a labeled domain, and the feature-only W_2 for the unlabeled target. Mini-batch sampling lives in
:mod:`~fedsim.methods.dictionary.sampling`, the DaDiL-R / DaDiL-E predictors in
:mod:`~fedsim.methods.dictionary.predictors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from fedsim.errors import NumericalError, UserError, first_values
from fedsim.ot.barycenter import labeled_barycenter
from fedsim.ot.simplex import project_simplex, renormalized
from fedsim.ot.wasserstein import SOLVERS, wasserstein_distance
from fedsim.seeding import derive_seed

EXCHANGES = ("minibatch", "full")
AGGREGATIONS = ("random", "avg", "wbary")
#: the values of ``method.feature_standardization``, the default first
FEATURE_STANDARDIZATIONS = ("sources", "none", "all")
#: label logit of an atom row's class at initialization (the rest 0): the authors' servers start the label logits
#: as one-hot rows (DaDiLServer.initialize_params)
INIT_LOGIT = 1.0


@dataclass(frozen=True)
class DictionaryParams:
    """FedDaDiL's parameters (DaDiL's in :class:`CentralizedDictionaryParams`). "The code" is the authors' federated
    PyDiL code: ``DaDiLServer``, ``DaDiLClient``, ``parse_args_fed_dadil``, the ICASSP Caltech-Office script.

    - ``exchange``: ``minibatch`` (each round one class-balanced batch of n_b rows per atom, drawn with replacement,
      travels; the aggregate is written back into those rows: ``DaDiLServer.federated_fit``, the paper's "it only
      communicates mini-batches") or ``full`` (the whole dictionary travels and each client sweeps it in n // n_b
      mini-batches per epoch: ``federated_full_fit``).
    - ``aggregation``: ``random`` (one client's version: the paper's rule and the code's default), ``avg`` (their
      mean), ``wbary`` (per atom, a Wasserstein barycenter of the versions); the three rules of ``DaDiLServer``.
    """

    num_atoms: int = 5  # K: parse_args_fed_dadil n_components; 0 = one atom per domain
    samples_per_atom: int = 500  # n: parse_args_fed_dadil n_samples
    exchange: str = "minibatch"  # "minibatch" | "full" (above)
    aggregation: str = "random"  # "random" | "avg" | "wbary" (above)
    optimizer: str = "sgd"  # parse_args_fed_dadil optimizer ("sgd" with method.momentum, or "adam")
    # on the atoms' features (and, through lr_labels 0, their label logits): a rule on the sources' DiL loss, last 3 of
    # 20 rounds, seed 0, of 1e-2 (parse_args_fed_dadil's lr), 1 and 10: 10 on CWRU and Office-Caltech10 SURF, where
    # 1e-2 leaves the atoms at their N(0, I) start and the sources at chance (docs/feddadil.md)
    lr_atoms: float = 10.0
    lr_labels: float = 0.0  # 0 = lr_atoms: DaDiLClient steps features and label logits at one lr
    lr_alpha: float = 1e-2  # DaDiLClient: lr_weights None = lr
    beta: float = 0.0  # label weight; 0 = the code's rules (JointWassersteinDistance, wasserstein_barycenter)
    solver: str = "emd"  # "emd" (exact, the code's), "sinkhorn", "sinkhorn_log"
    reg: float = 0.01  # entropic regularization (on a max-normalized cost) for the sinkhorn solvers only
    barycenter_iterations: int = 100  # at most, in training: DaDiLClient's n_iter_max for wasserstein_barycenter
    eval_barycenter_iterations: int = 10  # at most, for DaDiL-R: the Caltech-Office and CWRU scripts' n_iter_max
    barycenter_tol: float = 1e-9  # fixed point: squared move of the support below it (the code's tol, on its loss)
    encoder_rounds: int = -1  # FedAvg rounds of an encoder first (dictionary/base.py); -1: 0 vectors, 5 images
    encoder_epochs: int = 0  # local epochs of an encoder round; 0 = method.local_epochs (E: the dictionary's)
    # the encoded features' standardization (dictionary/base.py): "sources" (one mean and std per feature from the
    # source clients' sums, no target statistics), "none" (the authors' CWRU script: its line is commented out),
    # "all" (pooled over every client, the target's included: an adaptation of its own, never a default)
    feature_standardization: str = "sources"
    classifier_epochs: int = 100  # DaDiL-R / -E nets: the Caltech-Office script's epochs
    classifier_steps: int = 0  # > 0: that many mini-batch steps instead of classifier_epochs (short runs, tests)
    classifier_batch: int = 128  # the Caltech-Office script
    classifier_lr: float = 1e-3  # SGD, momentum 0.9: the Caltech-Office script
    classifier_l2: float = 1e-2  # weight decay: the Caltech-Office script (its CWRU script: 0)
    classifier_hidden: int = 0  # 0 = one linear layer, the code's ShallowNeuralNet

    def __post_init__(self):
        for name, allowed in (("exchange", EXCHANGES), ("aggregation", AGGREGATIONS), ("optimizer", ("sgd", "adam"))):
            if getattr(self, name) not in allowed:
                names = " | ".join(allowed)
                raise UserError(f"method.{name} must be one of {names}, got {getattr(self, name)!r}")
        if self.feature_standardization not in FEATURE_STANDARDIZATIONS:
            raise UserError(
                f"method.feature_standardization must be one of {' | '.join(FEATURE_STANDARDIZATIONS)}, "
                f"got {self.feature_standardization!r}"
            )
        if self.solver not in SOLVERS:
            raise UserError(f"method.solver must be 'emd', 'sinkhorn' or 'sinkhorn_log', got {self.solver!r}")
        positive = ("samples_per_atom", "barycenter_iterations", "eval_barycenter_iterations", "classifier_batch")
        for name in positive + ("classifier_epochs", "barycenter_tol", "classifier_lr"):
            if getattr(self, name) <= 0:
                raise UserError(f"method.{name} must be positive, got {getattr(self, name)}")
        if (
            self.lr_labels < 0
            or self.classifier_steps < 0
            or self.encoder_epochs < 0
            or self.classifier_l2 < 0
            or self.beta < 0
        ):
            raise UserError(
                "method.lr_labels, classifier_steps, classifier_l2, beta, encoder_epochs must be >= 0 (0: the default)"
            )
        if self.num_atoms < 0 or self.lr_atoms <= 0 or self.lr_alpha <= 0 or self.reg <= 0:
            raise UserError("method.num_atoms must be >= 0 and method.lr_atoms, lr_alpha, reg must be positive")


@dataclass(frozen=True)
class CentralizedDictionaryParams(DictionaryParams):
    """DaDiL's (centralized) defaults: the authors' ``parse_args_dadil`` (Adam, lr 1e-1) and their
    ``LabeledEmpiricalDictionary`` (one Adam over features, label logits and alpha, all at that lr)."""

    optimizer: str = "adam"
    lr_atoms: float = 0.1
    lr_alpha: float = 0.1


def check_batch_size(p: DictionaryParams, batch_size: int) -> None:
    """``batch_size`` is the common ``method.batch_size``: DaDiL's n_b (atoms and client data per step)."""
    if batch_size > p.samples_per_atom:
        raise UserError(
            f"method.batch_size ({batch_size}) cannot exceed method.samples_per_atom ({p.samples_per_atom})"
        )


def num_atoms(p: DictionaryParams, num_domains: int) -> int:
    return p.num_atoms or num_domains


def init_atoms(k: int, n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Atoms drawn from N(0, I) with balanced classes (label logits INIT_LOGIT on each row's class, as the code).

    Data-independent on purpose: the server never sees client data.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(k, n, dim)).astype(np.float32)
    labels = np.stack([rng.permutation(np.arange(n) % classes) for _ in range(k)])
    logits = np.zeros((k, n, classes), np.float32)
    np.put_along_axis(logits, labels[..., None], INIT_LOGIT, axis=2)
    return x, logits


def initial_dictionary(p: DictionaryParams, k: int, dim: int, classes: int, root_seed: int) -> dict[str, np.ndarray]:
    """The server's starting atoms (``atoms_x``, ``atoms_logits``), seeded by the run's seed alone."""
    atoms_x, atoms_logits = init_atoms(k, p.samples_per_atom, dim, classes, derive_seed(root_seed, "atoms"))
    return {"atoms_x": atoms_x, "atoms_logits": atoms_logits}


def atom_tensors(state: dict) -> dict[str, np.ndarray]:
    """The whole dictionary as named tensors."""
    return {"atoms_x": state["atoms_x"], "atoms_logits": state["atoms_logits"]}


def atom_minibatches(k: int, n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One pass over the atoms: n // batch_size index sets of shape (k, batch_size), each atom's rows drawn
    without replacement from its own permutation (the ``full`` exchange's sweep)."""
    perms = torch.stack([torch.randperm(n, generator=generator) for _ in range(k)])
    return [perms[:, i * batch_size : (i + 1) * batch_size] for i in range(max(n // batch_size, 1))]


def gather_atoms(atoms_x: torch.Tensor, atoms_logits: torch.Tensor, idx: torch.Tensor):
    """Rows ``idx[k]`` of every atom k: the atom mini-batch one loss is computed on (differentiable)."""
    rows = torch.arange(atoms_x.shape[0])[:, None]
    return atoms_x[rows, idx], atoms_logits[rows, idx]


def make_optimizer(p: DictionaryParams, momentum: float, atoms: list, alphas: list) -> torch.optim.Optimizer:
    """SGD with the common ``method.momentum`` (0.9, the code's) or Adam, one lr per group."""
    atoms_x, atoms_logits = atoms
    groups = [
        {"params": [atoms_x], "lr": p.lr_atoms},
        {"params": [atoms_logits], "lr": p.lr_labels or p.lr_atoms},
        {"params": alphas, "lr": p.lr_alpha},
    ]
    if p.optimizer == "adam":
        return torch.optim.Adam(groups)
    return torch.optim.SGD(groups, momentum=momentum)


def label_weight(p: DictionaryParams) -> Optional[float]:
    """``beta`` when set; None selects the code's rules in :mod:`fedsim.ot` (max C^X / max C^Y in the loss, the
    largest feature cost per atom in the barycenter)."""
    return p.beta if p.beta > 0 else None


def random_support(soft_labels: torch.Tensor, alpha: torch.Tensor, dim: int, generator: torch.Generator):
    """The barycenter's starting support, as the code's: N(0, I) features, one-hot labels drawn from the
    alpha-weighted class frequencies of the atoms' hard labels."""
    k, n, classes = soft_labels.shape
    hard = nn.functional.one_hot(soft_labels.detach().argmax(-1), classes).to(torch.float64).mean(1)
    frequencies = (alpha.detach().to(torch.float64) @ hard).clamp_min(0)
    drawn = torch.multinomial(frequencies / frequencies.sum(), n, replacement=True, generator=generator)
    features = torch.randn(n, dim, generator=generator, dtype=soft_labels.dtype)
    return features, nn.functional.one_hot(drawn, classes).to(soft_labels.dtype)


def barycenter(
    atoms_x, atoms_logits, alpha, p: DictionaryParams, generator: Optional[torch.Generator] = None, iterations=None
):
    """B(alpha; P) with the atoms' soft labels carried along (support: the atoms' size), by fixed-point iterations
    from a random support until the support moves less than ``barycenter_tol`` (at most ``iterations``, default
    ``barycenter_iterations``). ``alpha`` was computed (a projection on the simplex): renormalized in float64."""
    soft = torch.softmax(atoms_logits, dim=-1)
    weights = renormalized(alpha)
    generator = generator or torch.Generator().manual_seed(0)
    init = random_support(soft, weights, atoms_x.shape[-1], generator)
    return labeled_barycenter(
        list(atoms_x),
        list(soft),
        weights,
        n_iter=iterations or p.barycenter_iterations,
        tol=p.barycenter_tol,
        beta=label_weight(p),
        solver=p.solver,
        reg=p.reg,
        init=init,
    )


def dil_loss(
    atoms_x, atoms_logits, alpha, x, y_onehot: Optional[torch.Tensor], p: DictionaryParams, generator=None
) -> torch.Tensor:
    """One domain's mini-batch loss: W_c to its barycenter (features only when y is None)."""
    xb, yb = barycenter(atoms_x, atoms_logits, alpha, p, generator)
    if y_onehot is None:
        return wasserstein_distance(x, xb, solver=p.solver, reg=p.reg)
    return wasserstein_distance(x, xb, y_onehot, yb, beta=label_weight(p), solver=p.solver, reg=p.reg)


def dil_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, atoms: list, alphas: list) -> None:
    """One projected gradient step on ``loss``; a loss, atom or alpha that is no longer finite is a NumericalError
    naming it (the runtime adds the method, round and client), not an error deep inside OT or the projection."""
    if not bool(torch.isfinite(loss)):
        raise diverged("the DiL loss", loss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    for k, atom in enumerate(atoms):
        if not bool(torch.isfinite(atom).all()):
            raise diverged(("atom features", "atom label logits")[k] if len(atoms) == 2 else "an atom", atom)
    for alpha in alphas:
        project_alpha(alpha)


def diverged(what: str, value: torch.Tensor) -> NumericalError:
    """The error of a dictionary quantity that is no longer finite, with its first values and the rates to lower."""
    return NumericalError(
        what, first_values(value), "the dictionary's step diverged; lower method.lr_atoms, lr_labels or lr_alpha"
    )


def one_hot_labels(y: Optional[np.ndarray], classes: int) -> Optional[torch.Tensor]:
    """A labeled domain's labels as one-hot rows (None for the unlabeled target)."""
    return None if y is None else nn.functional.one_hot(torch.tensor(np.asarray(y)), classes).float()


def trainable_atoms(atoms_x: np.ndarray, atoms_logits: np.ndarray):
    """Trainable copies of an atom batch (the client clones what the server sent)."""
    x = torch.tensor(np.asarray(atoms_x), requires_grad=True)
    logits = torch.tensor(np.asarray(atoms_logits), requires_grad=True)
    return x, logits


def project_alpha(alpha: torch.Tensor) -> None:
    """Project the barycentric coordinates back on the simplex after a gradient step (in place)."""
    with torch.no_grad():
        if not bool(torch.isfinite(alpha).all()):
            raise diverged("alpha", alpha)
        alpha.copy_(project_simplex(alpha))


def atoms_distance(a, b, p: DictionaryParams) -> float:
    """Mean over atoms k of W_c(P_k^a, P_k^b) under the joint cost (features, softmax labels; the loss's beta)."""
    xa, la = (torch.tensor(np.asarray(t)) for t in a)
    xb, lb = (torch.tensor(np.asarray(t)) for t in b)
    total = 0.0
    for k in range(xa.shape[0]):
        soft_a, soft_b = torch.softmax(la[k], -1), torch.softmax(lb[k], -1)
        total += float(wasserstein_distance(xa[k], xb[k], soft_a, soft_b, beta=label_weight(p)))
    return total / xa.shape[0]


def client_drift(versions: dict, start, p: DictionaryParams) -> dict[str, float]:
    """Each client's drift: mean over atoms k of W_c(P_k^(i), P_k^start), its version against the rows the round
    started from (the batch rows sent, or the whole dictionary with the ``full`` exchange)."""
    return {str(cid): atoms_distance(v, start, p) for cid, v in versions.items()}


def atom_drift(versions: list, start, p: DictionaryParams) -> float:
    """Mean over the round's clients of :func:`client_drift`; 0 when no client moved the atoms."""
    return float(np.mean([atoms_distance(v, start, p) for v in versions])) if versions else 0.0


def atom_dispersion(versions: list, p: DictionaryParams) -> float:
    """Pairwise dispersion of the client versions: mean over pairs (i, j) and atoms k of W_c(P_k^(i), P_k^(j))."""
    pairs = [(i, j) for i in range(len(versions)) for j in range(i + 1, len(versions))]
    return float(np.mean([atoms_distance(versions[i], versions[j], p) for i, j in pairs])) if pairs else 0.0
