"""Dataset dictionary learning (DaDiL): the atoms, the loss, the predictors, shared by ``feddadil`` and ``dadil``.

Montesuma, Mboula, Souloumiac, "Multi-Source Domain Adaptation through Dataset
Dictionary Learning in Wasserstein Space", ECAI 2023 (DaDiL); federated form:
Castellon, Montesuma et al., "Federated Dataset Dictionary Learning for
Multi-Source Domain Adaptation", ICASSP 2024 (FedDaDiL).

A dictionary is K atoms, each n labeled samples (features X_k, soft labels
softmax(L_k)). A domain l is modelled by the labeled barycenter B(alpha_l; P)
and the loss of one mini-batch is (DaDiL Eq. 9)

    W_c(Q_l, B(alpha_l; P)),  c((x, y), (x', y')) = ||x - x'||^2 + beta ||y - y'||^2

for a labeled domain, and the feature-only W_2 for the unlabeled target. Predictions on a
domain: DaDiL-R (a classifier trained on the reconstruction B(alpha_l; P)) and DaDiL-E
(per-atom classifiers weighted by alpha_l).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from fedsim.errors import UserError
from fedsim.ot.barycenter import labeled_barycenter
from fedsim.ot.simplex import project_simplex
from fedsim.ot.wasserstein import SOLVERS, wasserstein_distance
from fedsim.seeding import derive_seed


@dataclass(frozen=True)
class DictionaryParams:
    """Parameters shared by FedDaDiL and DaDiL (names follow the papers)."""

    num_atoms: int = 0  # K; 0 = one atom per domain (the papers' usual choice)
    samples_per_atom: int = 500  # n (the authors' PyDiL federated example)
    # optimizer and aggregation: PyDiL federated client (SGD with momentum); lr_atoms a rule on the sources
    optimizer: str = "sgd"  # "sgd" (with method.momentum) or "adam"
    lr_atoms: float = 10.0  # step on atom features (and label logits unless lr_labels is set)
    lr_labels: float = 1.4  # step on the atoms' label logits (0 = lr_atoms); a rule on the sources' gradients
    lr_alpha: float = 0.01  # step on barycentric coordinates, then projection on the simplex
    beta: float = 0.0  # label-cost weight; 0 = the largest feature cost of the batch (PyDiL's rule)
    aggregation: str = "avg"  # "avg" (mean of the versions) or "random" (one client's version); both PyDiL's
    solver: str = "emd"  # "emd" (exact), "sinkhorn", "sinkhorn_log"
    reg: float = 0.01  # entropic regularization (on a max-normalized cost) for sinkhorn solvers
    barycenter_iterations: int = 5
    encoder_rounds: int = -1  # FedAvg rounds that train an encoder first; -1 = 0 for vectors, 5 for images
    classifier_steps: int = 300  # full-batch Adam steps of the DaDiL-R / DaDiL-E classifiers
    classifier_hidden: int = 64  # 0 = linear classifier

    def __post_init__(self):
        if self.aggregation not in ("random", "avg"):
            raise UserError(f"method.aggregation must be 'random' or 'avg', got {self.aggregation!r}")
        if self.optimizer not in ("sgd", "adam"):
            raise UserError(f"method.optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")
        if self.solver not in SOLVERS:
            raise UserError(f"method.solver must be 'emd', 'sinkhorn' or 'sinkhorn_log', got {self.solver!r}")
        for name in ("samples_per_atom", "barycenter_iterations", "classifier_steps"):
            if getattr(self, name) <= 0:
                raise UserError(f"method.{name} must be positive, got {getattr(self, name)}")
        if self.lr_labels < 0:
            raise UserError(f"method.lr_labels must be 0 (= lr_atoms) or positive, got {self.lr_labels}")
        if self.num_atoms < 0 or self.lr_atoms <= 0 or self.lr_alpha <= 0 or self.reg <= 0:
            raise UserError("method.num_atoms must be >= 0 and method.lr_atoms, lr_alpha, reg must be positive")


@dataclass(frozen=True)
class CentralizedDictionaryParams(DictionaryParams):
    """DaDiL's (centralized) defaults: Adam, as PyDiL's centralized dictionary (one optimizer sees the sum of every
    domain's loss); lr_atoms from a rule on the sources' DiL loss."""

    optimizer: str = "adam"
    lr_atoms: float = 0.3
    lr_labels: float = 0.0  # = lr_atoms: Adam moves every entry by about its lr whatever the gradient's scale


def check_batch_size(p: DictionaryParams, batch_size: int) -> None:
    """``batch_size`` is the common ``method.batch_size``: DaDiL's n_b (atoms and client data per step)."""
    if batch_size > p.samples_per_atom:
        raise UserError(
            f"method.batch_size ({batch_size}) cannot exceed method.samples_per_atom ({p.samples_per_atom})"
        )


def num_atoms(p: DictionaryParams, num_domains: int) -> int:
    return p.num_atoms or num_domains


def init_atoms(k: int, n: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Atoms drawn from N(0, I) with balanced classes (label logits favour each sample's class).

    Data-independent on purpose: the server never sees client data.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(k, n, dim)).astype(np.float32)
    labels = np.stack([rng.permutation(np.arange(n) % classes) for _ in range(k)])
    logits = np.zeros((k, n, classes), np.float32)
    np.put_along_axis(logits, labels[..., None], 3.0, axis=2)
    return x, logits


def initial_dictionary(p: DictionaryParams, k: int, dim: int, classes: int, root_seed: int) -> dict[str, np.ndarray]:
    """The server's starting atoms (``atoms_x``, ``atoms_logits``), seeded by the run's seed alone."""
    atoms_x, atoms_logits = init_atoms(k, p.samples_per_atom, dim, classes, derive_seed(root_seed, "atoms"))
    return {"atoms_x": atoms_x, "atoms_logits": atoms_logits}


def atom_tensors(state: dict) -> dict[str, np.ndarray]:
    """The whole dictionary as named tensors (what the server sends)."""
    return {"atoms_x": state["atoms_x"], "atoms_logits": state["atoms_logits"]}


def atom_minibatches(k: int, n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One pass over the atoms: n // batch_size index sets of shape (k, batch_size), each atom's rows drawn
    without replacement from its own permutation (DaDiL Alg. 2 samples every atom independently)."""
    perms = torch.stack([torch.randperm(n, generator=generator) for _ in range(k)])
    return [perms[:, i * batch_size : (i + 1) * batch_size] for i in range(max(n // batch_size, 1))]


def data_minibatch(count: int, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """A random mini-batch of a domain's samples (all of them when it has fewer than batch_size)."""
    return torch.randperm(count, generator=generator)[:batch_size]


def gather_atoms(atoms_x: torch.Tensor, atoms_logits: torch.Tensor, idx: torch.Tensor):
    """Rows ``idx[k]`` of every atom k: the atom mini-batch one loss is computed on (differentiable)."""
    rows = torch.arange(atoms_x.shape[0])[:, None]
    return atoms_x[rows, idx], atoms_logits[rows, idx]


def make_optimizer(p: DictionaryParams, momentum: float, atoms: list, alphas: list) -> torch.optim.Optimizer:
    """SGD with the common ``method.momentum`` (default 0.9, PyDiL's example) or Adam, one lr per group."""
    atoms_x, atoms_logits = atoms
    groups = [
        {"params": [atoms_x], "lr": p.lr_atoms},
        {"params": [atoms_logits], "lr": p.lr_labels or p.lr_atoms},
        {"params": alphas, "lr": p.lr_alpha},
    ]
    if p.optimizer == "adam":
        return torch.optim.Adam(groups)
    return torch.optim.SGD(groups, momentum=momentum)


def step_touched(optimizer: torch.optim.Optimizer, atoms: list, touched: torch.Tensor) -> None:
    """An optimizer step that changes only the atom rows ``touched`` (mask of shape (K, n)): momentum or
    Adam state would otherwise move rows that no loss of this step sampled."""
    before = [a.detach().clone() for a in atoms]
    optimizer.step()
    with torch.no_grad():
        for atom, old in zip(atoms, before):
            atom[~touched] = old[~touched]


def label_weight(p: DictionaryParams, xa: torch.Tensor, xb: torch.Tensor) -> float:
    if p.beta > 0:
        return p.beta
    return float(torch.cdist(xa.detach(), xb.detach()).pow(2).max().clamp_min(1e-12))


def barycenter(atoms_x: torch.Tensor, atoms_logits: torch.Tensor, alpha: torch.Tensor, p: DictionaryParams):
    """B(alpha; P) with the atoms' soft labels carried along (support = atoms' size)."""
    soft = torch.softmax(atoms_logits, dim=-1)
    beta = label_weight(p, atoms_x[0], atoms_x[-1])
    return labeled_barycenter(
        list(atoms_x), list(soft), alpha, n_iter=p.barycenter_iterations, beta=beta, solver=p.solver, reg=p.reg
    )


def dil_loss(atoms_x, atoms_logits, alpha, x, y_onehot: Optional[torch.Tensor], p: DictionaryParams) -> torch.Tensor:
    """One domain's mini-batch loss: W_c to its barycenter (features only when y is None)."""
    xb, yb = barycenter(atoms_x, atoms_logits, alpha, p)
    if y_onehot is None:
        return wasserstein_distance(x, xb, solver=p.solver, reg=p.reg)
    return wasserstein_distance(x, xb, y_onehot, yb, beta=label_weight(p, x, xb), solver=p.solver, reg=p.reg)


def one_hot_labels(y: Optional[np.ndarray], classes: int) -> Optional[torch.Tensor]:
    """A labeled domain's labels as one-hot rows (None for the unlabeled target)."""
    return None if y is None else nn.functional.one_hot(torch.from_numpy(y), classes).float()


def trainable_atoms(atoms_x: np.ndarray, atoms_logits: np.ndarray):
    """Trainable copies of an atom batch (the client clones what the server sent)."""
    x = torch.tensor(np.asarray(atoms_x), requires_grad=True)
    logits = torch.tensor(np.asarray(atoms_logits), requires_grad=True)
    return x, logits


def project_alpha(alpha: torch.Tensor) -> None:
    """Project the barycentric coordinates back on the simplex after a gradient step (in place)."""
    with torch.no_grad():
        alpha.copy_(project_simplex(alpha))


def _atoms_distance(a, b, p: DictionaryParams) -> float:
    """Mean over atoms k of W_c(P_k^a, P_k^b) under the joint cost (features, softmax labels)."""
    xa, la = (torch.as_tensor(np.asarray(t)) for t in a)
    xb, lb = (torch.as_tensor(np.asarray(t)) for t in b)
    total = 0.0
    for k in range(xa.shape[0]):
        beta = label_weight(p, xa[k], xb[k])
        total += float(
            wasserstein_distance(xa[k], xb[k], torch.softmax(la[k], -1), torch.softmax(lb[k], -1), beta=beta)
        )
    return total / xa.shape[0]


def atom_drift(versions: list, start, p: DictionaryParams) -> float:
    """Drift from the round's start: mean over clients i and atoms k of W_c(P_k^(i), P_k^global), the
    global atoms the round began with. 0 when no client moved them."""
    return float(np.mean([_atoms_distance(v, start, p) for v in versions])) if versions else 0.0


def atom_dispersion(versions: list, p: DictionaryParams) -> float:
    """Pairwise dispersion of the client versions: mean over pairs (i, j) and atoms k of W_c(P_k^(i), P_k^(j))."""
    pairs = [(i, j) for i in range(len(versions)) for j in range(i + 1, len(versions))]
    return float(np.mean([_atoms_distance(versions[i], versions[j], p) for i, j in pairs])) if pairs else 0.0


def fit_classifier(x: torch.Tensor, y_soft: torch.Tensor, p: DictionaryParams, seed: int) -> nn.Module:
    """A small classifier trained full-batch on soft labels (cross-entropy to the label distribution)."""
    torch.manual_seed(seed)
    dim, classes = x.shape[1], y_soft.shape[1]
    if p.classifier_hidden > 0:
        model = nn.Sequential(nn.Linear(dim, p.classifier_hidden), nn.ReLU(), nn.Linear(p.classifier_hidden, classes))
    else:
        model = nn.Linear(dim, classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x, y_soft = x.detach(), y_soft.detach()
    for _ in range(p.classifier_steps):
        optimizer.zero_grad(set_to_none=True)
        loss = -(y_soft * torch.log_softmax(model(x), dim=1)).sum(1).mean()
        loss.backward()
        optimizer.step()
    return model.eval()


@torch.no_grad()
def predict_reconstruction(atoms_x, atoms_logits, alpha, x_test, p: DictionaryParams, seed: int) -> torch.Tensor:
    """DaDiL-R: a classifier trained on the labeled reconstruction B(alpha; P), applied to x_test."""
    with torch.enable_grad():
        xb, yb = barycenter(atoms_x, atoms_logits, alpha, p)
        model = fit_classifier(xb, yb, p, seed)
    return model(x_test).argmax(1)


@torch.no_grad()
def predict_ensemble(atoms_x, atoms_logits, alpha, x_test, p: DictionaryParams, seed: int) -> torch.Tensor:
    """DaDiL-E: per-atom classifiers, their class probabilities weighted by alpha.

    Each h_k is applied off its own atom's cloud: it needs atoms near the domain (docs/feddadil.md, "DaDiL-E")."""
    probabilities = 0.0
    for k in range(atoms_x.shape[0]):
        with torch.enable_grad():
            model = fit_classifier(atoms_x[k], torch.softmax(atoms_logits[k], -1), p, seed + k)
        probabilities = probabilities + alpha[k] * torch.softmax(model(x_test), 1)
    return probabilities.argmax(1)


def evaluate_predictors(
    tensors, alpha: torch.Tensor, test_x: torch.Tensor, test_y: np.ndarray, p: DictionaryParams, seed: int
) -> dict:
    """Correct counts of DaDiL-R (``correct``) and DaDiL-E (``correct_E``) on one domain's test features."""
    atoms_x = torch.tensor(np.asarray(tensors["atoms_x"]))
    atoms_logits = torch.tensor(np.asarray(tensors["atoms_logits"]))
    seed = seed % (1 << 31)
    y = torch.from_numpy(test_y)
    pred_r = predict_reconstruction(atoms_x, atoms_logits, alpha, test_x, p, seed)
    pred_e = predict_ensemble(atoms_x, atoms_logits, alpha, test_x, p, seed)
    return {"correct": float((pred_r == y).sum()), "total": float(len(y)), "correct_E": float((pred_e == y).sum())}
