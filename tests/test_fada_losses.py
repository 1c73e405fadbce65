"""FADA's disentanglement (Peng et al., ICLR 2020, Sec. 3.3) moves the networks the authors' DAL code moves."""

from __future__ import annotations

import torch
from torch import nn

from fedsim.methods.fada.losses import Disentanglement, MINELoss
from fedsim.methods.fada.networks import FADANet, SourceParts, branch

WIDTH, CLASSES = 8, 3


def source_model(seed: int = 0) -> tuple[FADANet, SourceParts]:
    torch.manual_seed(seed)
    encoder = nn.Sequential(nn.Linear(5, WIDTH), nn.ReLU())
    return FADANet(encoder, branch(WIDTH, WIDTH), nn.Linear(WIDTH, CLASSES)), SourceParts(WIDTH, CLASSES, 16, 16)


def one_batch(net, parts, lambdas, train_generator=True) -> Disentanglement:
    objective = Disentanglement(
        net,
        parts,
        MINELoss(0.01),
        torch.optim.Adam(parts.statistics.parameters(), lr=1e-3),
        lambda params: torch.optim.SGD(params, lr=0.1),
        *lambdas,
        train_generator,
    )
    draw = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(16, 5, generator=draw), torch.randint(0, CLASSES, (16,), generator=draw)
    objective.step(inputs, labels, draw)
    return objective


def test_mutual_information_and_reconstruction_leave_the_generator_alone():
    """DAL steps G with the classification loss only: after the batch, the last update (lambda_mi * MI +
    lambda_recon * reconstruction) has sent no gradient into G_i, while D_inv, D_spec and R got one."""
    net, parts = source_model()
    one_batch(net, parts, (1.0, 1.0, 1.0))
    assert all(p.grad is None for p in net.encoder.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in parts.reconstructor.parameters())
    assert net.invariant[0].weight.grad is not None and net.invariant[0].weight.grad.abs().sum() > 0


def test_the_generator_moves_by_the_classification_step_only():
    """With the entropy, MI and reconstruction weights at 0 or at 100, G_i ends the batch at the same weights:
    only Eq. 4's cross-entropy moves it."""
    ends = []
    for lambdas in ((0.0, 0.0, 0.0), (100.0, 100.0, 100.0)):
        net, parts = source_model()
        one_batch(net, parts, lambdas)
        ends.append([p.detach().clone() for p in net.encoder.parameters()])
    start = [p.detach() for p in source_model()[0].encoder.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(*ends))
    assert not all(torch.equal(a, s) for a, s in zip(ends[0], start))


def test_the_disentanglement_stage_takes_dals_adam_unless_told_the_local_sgd():
    """Eq. 4-7's updates use DAL's Adam (lr 2e-4, weight decay 5e-4) by default; ``disentangle_optimizer: local``
    gives the local training's SGD (lr, momentum and weight decay of the method section)."""
    from types import SimpleNamespace

    from fedsim.methods.fada.params import FADAParams
    from fedsim.optim import SGD

    params = [nn.Parameter(torch.zeros(2))]
    adam = FADAParams().disentangle_optimizers(None)(params)
    assert isinstance(adam, torch.optim.Adam)
    assert adam.defaults["lr"] == 2e-4 and adam.defaults["weight_decay"] == 5e-4
    local = SimpleNamespace(lr=0.05, momentum=0.9, weight_decay=0.0)
    sgd = FADAParams(disentangle_optimizer="local").disentangle_optimizers(local)(params)
    assert isinstance(sgd, SGD) and (sgd.defaults["lr"], sgd.defaults["momentum"]) == (0.05, 0.9)
