"""The hand-written batched step of Linear/ReLU chains: which models it takes, and SGD's update for each client."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedsim.methods.common.linear_chain import ChainLayer, chain_of, chain_sgd_step
from fedsim.models.mlp import mlp
from fedsim.optim import SGD


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.out = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(x + torch.relu(self.inner(x)))


class Reused(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 4)

    def forward(self, x):
        return self.layer(torch.relu(self.layer(x)))


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.spare = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


def test_only_a_chain_of_linear_and_relu_layers_is_taken():
    chain = chain_of(mlp((6,), 3, hidden=5))
    assert chain == [
        ChainLayer("encoder.0.weight", "encoder.0.bias"),
        ChainLayer(),
        ChainLayer("encoder.2.weight", "encoder.2.bias"),
        ChainLayer(),
        ChainLayer("head.weight", "head.bias"),
    ]
    assert chain_of(nn.Sequential(nn.Linear(4, 3, bias=False))) == [ChainLayer("0.weight", None)]
    others = (Residual(), Reused(), Unused(), nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)))
    others += (nn.Sequential(nn.Flatten(), nn.Linear(4, 3)), nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.0)))
    for other in others:  # a leaf that is neither a Linear nor a ReLU is refused even where it changes nothing
        assert chain_of(other) is None, type(other).__name__


def _loop(model, weights, x, y, settings, anchor, mu):
    """One client's steps as the loop takes them: autograd of cross-entropy (+ proximal term), fedsim's SGD."""
    model.load_state_dict({n: torch.tensor(w) for n, w in weights.items()})
    optimizer = SGD(model.parameters(), settings.lr, settings.momentum, settings.weight_decay)
    for xb, yb in zip(x, y):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss = loss + 0.5 * mu * sum(((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters())
        loss.backward()
        optimizer.step()
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize(("momentum", "bias", "mu"), [(0.0, False, 0.1), (0.9, True, 0.0)])
def test_each_clients_steps_are_sgds(momentum, bias, mu):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7, bias=bias), nn.ReLU(), nn.Linear(7, 3, bias=bias))
    settings = SimpleNamespace(lr=0.1, momentum=momentum, weight_decay=0.01)
    clients, steps, rows = 4, 3, 6
    starts = [{n: torch.randn_like(p).numpy() for n, p in model.named_parameters()} for _ in range(clients)]
    x, y = torch.randn(steps, clients, rows, 5), torch.randint(0, 3, (steps, clients, rows))
    params = {n: torch.tensor(np.stack([s[n] for s in starts])) for n in starts[0]}
    anchors = {n: p.clone() for n, p in params.items()}
    buffers = {n: torch.zeros_like(p) for n, p in params.items()}
    chain = chain_of(model)
    for t in range(steps):
        losses = chain_sgd_step(chain, params, buffers, x[t], y[t], settings, t == 0, anchors, mu)
        assert losses.shape == (clients,) and bool((losses > 0).all())
    for k in range(clients):
        anchor = {n: torch.tensor(w) for n, w in starts[k].items()}
        expected = _loop(model, starts[k], x[:, k], y[:, k], settings, anchor, mu)
        for name, value in expected.items():
            np.testing.assert_allclose(params[name][k].numpy(), value, rtol=0, atol=1e-6, err_msg=f"{k} {name}")
