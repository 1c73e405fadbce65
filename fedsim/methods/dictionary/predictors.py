"""The DaDiL-R and DaDiL-E predictors of a dataset dictionary, trained as the authors train them.

DaDiL-R: one net trained on the domain's labeled reconstruction B(alpha; P) (n rows); DaDiL-E: one net per atom,
their outputs weighted by alpha. The net, its optimizer and its schedule are those of the authors' ICASSP
Caltech-Office script: their ``ShallowNeuralNet`` (one linear layer, cross-entropy to the soft labels' argmax),
SGD lr 1e-3, momentum 0.9, L2 penalty 1e-2, 100 epochs of shuffled mini-batches of 128 (``DictionaryParams``).
"""

from __future__ import annotations

import time
from typing import Optional

import numpy as np
import torch
from torch import nn

from fedsim.methods.dictionary.learning import DictionaryParams, barycenter

#: momentum of the predictors' SGD (the authors' scripts)
CLASSIFIER_MOMENTUM = 0.9
#: default evaluation cadence of FedDaDiL and DaDiL (``run.eval_every``; the last round is always evaluated): an
#: evaluation trains K + 1 predictors from scratch, which costs one to four dictionary rounds (Office-Caltech10
#: SURF: 3-10 s against rounds of 2-4 s), so evaluating every round would more than double a run; every 10th
#: round keeps the learning curve at about a sixth of the run's time. fedsim's rule, not the papers' (the authors'
#: scripts evaluate once, after the last round).
EVAL_EVERY = 10


def _network(dim: int, classes: int, hidden: int) -> nn.Module:
    if hidden > 0:
        return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    return nn.Linear(dim, classes)


def fit_classifier(x: torch.Tensor, y_soft: torch.Tensor, p: DictionaryParams, seed: int) -> nn.Module:
    """A net trained on (x, argmax y_soft) by SGD on shuffled mini-batches: ``classifier_epochs`` epochs, or
    ``classifier_steps`` steps when that is set."""
    torch.manual_seed(seed)
    model = _network(x.shape[1], y_soft.shape[1], p.classifier_hidden)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=p.classifier_lr, momentum=CLASSIFIER_MOMENTUM, weight_decay=p.classifier_l2
    )
    x, targets = x.detach(), y_soft.detach().argmax(1)
    generator = torch.Generator().manual_seed(seed)
    steps, epoch = 0, 0
    while p.classifier_steps or epoch < p.classifier_epochs:
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), p.classifier_batch):
            rows = order[start : start + p.classifier_batch]
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x[rows]), targets[rows]).backward()
            optimizer.step()
            steps += 1
            if p.classifier_steps and steps >= p.classifier_steps:
                return model.eval()
        epoch += 1
    return model.eval()


def reconstruction_net(atoms_x, atoms_logits, alpha, p: DictionaryParams, seed: int) -> nn.Module:
    """DaDiL-R's net, trained on the labeled reconstruction B(alpha; P) (at most ``eval_barycenter_iterations``
    fixed-point iterations)."""
    with torch.enable_grad():
        generator = torch.Generator().manual_seed(seed)
        xb, yb = barycenter(atoms_x, atoms_logits, alpha, p, generator, iterations=p.eval_barycenter_iterations)
        return fit_classifier(xb, yb, p, seed)


@torch.no_grad()
def predict_reconstruction(atoms_x, atoms_logits, alpha, x_test, p: DictionaryParams, seed: int) -> torch.Tensor:
    """DaDiL-R: :func:`reconstruction_net` applied to x_test."""
    return reconstruction_net(atoms_x, atoms_logits, alpha, p, seed)(x_test).argmax(1)


def atom_nets(atoms_x, atoms_logits, p: DictionaryParams, seed: int) -> list[nn.Module]:
    """DaDiL-E's nets: one per atom, atom k's trained on its rows from seed + k."""
    with torch.enable_grad():
        return [
            fit_classifier(atoms_x[k], torch.softmax(atoms_logits[k], -1), p, seed + k) for k in range(atoms_x.shape[0])
        ]


@torch.no_grad()
def weighted_outputs(nets: list[nn.Module], alpha, x: torch.Tensor) -> torch.Tensor:
    """The sum over the K atoms of alpha_k times net k's outputs (logits, as the authors' scripts weigh them)."""
    scores = 0.0
    for k, model in enumerate(nets):
        scores = scores + alpha[k] * model(x)
    return scores


@torch.no_grad()
def ensemble_scores(atoms_x, atoms_logits, alpha, x_test, p: DictionaryParams, seed: int) -> torch.Tensor:
    """DaDiL-E's scores: :func:`weighted_outputs` of :func:`atom_nets` on x_test."""
    return weighted_outputs(atom_nets(atoms_x, atoms_logits, p, seed), alpha, x_test)


def predict_ensemble(atoms_x, atoms_logits, alpha, x_test, p: DictionaryParams, seed: int) -> torch.Tensor:
    """DaDiL-E: the class of the highest :func:`ensemble_scores`."""
    return ensemble_scores(atoms_x, atoms_logits, alpha, x_test, p, seed).argmax(1)


def evaluate_predictors(
    tensors, alpha: torch.Tensor, test_x: torch.Tensor, test_y: np.ndarray, p: DictionaryParams, seed: int
) -> dict:
    """Correct counts of DaDiL-R (``correct``) and DaDiL-E (``correct_E``) on one domain's test features, and the
    seconds their K + 1 predictors took (``predictor_seconds``)."""
    return evaluate_and_apply(tensors, alpha, test_x, test_y, p, seed)[0]


@torch.no_grad()
def evaluate_and_apply(
    tensors,
    alpha: torch.Tensor,
    test_x: torch.Tensor,
    test_y: np.ndarray,
    p: DictionaryParams,
    seed: int,
    x: Optional[torch.Tensor] = None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """:func:`evaluate_predictors`'s metrics, and the same K + 1 predictors' outputs on ``x`` (none when None):
    DaDiL-R's logits under "" and DaDiL-E's alpha-weighted logits under "E" (the names of ``correct`` and
    ``correct_E``)."""
    started = time.perf_counter()
    atoms_x = torch.tensor(np.asarray(tensors["atoms_x"]))
    atoms_logits = torch.tensor(np.asarray(tensors["atoms_logits"]))
    seed = seed % (1 << 31)
    y = torch.from_numpy(test_y)
    reconstruction = reconstruction_net(atoms_x, atoms_logits, alpha, p, seed)
    nets = atom_nets(atoms_x, atoms_logits, p, seed)
    pred_r = reconstruction(test_x).argmax(1)
    pred_e = weighted_outputs(nets, alpha, test_x).argmax(1)
    outputs = {} if x is None else {"": reconstruction(x).numpy(), "E": weighted_outputs(nets, alpha, x).numpy()}
    metrics = {
        "correct": float((pred_r == y).sum()),
        "total": float(len(y)),
        "correct_E": float((pred_e == y).sum()),
        "predictor_seconds": time.perf_counter() - started,
    }
    return metrics, outputs


def with_client_seconds(metrics: dict, replies, name: str) -> dict:
    """``metrics`` with the clients' ``name`` timings beside them, per client id (``{"0": 1.2, ...}``)."""
    return {**metrics, name: {str(cid): r.metrics[name] for cid, r in replies.items() if name in r.metrics}}
