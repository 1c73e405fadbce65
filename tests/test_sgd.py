"""fedsim's SGD is torch.optim.SGD's update to the bit, and training with it imports no torch._dynamo."""

import subprocess
import sys

import pytest
import torch

from fedsim.optim import SGD


def model_and_batches(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(7, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    batches = [(torch.randn(9, 7), torch.randint(0, 3, (9,))) for _ in range(12)]
    return model, batches


def trained(optimizer_for, seed: int = 0) -> list[torch.Tensor]:
    model, batches = model_and_batches(seed)
    optimizer = optimizer_for(model)
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 5e-4), (0.0, 1e-3)])
def test_the_weights_are_torch_optim_sgd_bits(momentum, weight_decay):
    ours = trained(lambda m: SGD(m.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay))
    theirs = trained(lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert not torch.equal(ours[0], model_and_batches(0)[0][0].weight)  # it trained


def test_groups_keep_their_own_learning_rate_as_in_torch():
    def groups(m):
        return [{"params": m[0].parameters(), "lr": 0.2}, {"params": m[2].parameters()}]

    ours = trained(lambda m: SGD(groups(m), lr=0.01, momentum=0.5))
    theirs = trained(lambda m: torch.optim.SGD(groups(m), lr=0.01, momentum=0.5))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_momentum_buffers_live_in_state_and_a_parameter_without_gradient_is_left_alone():
    frozen = torch.nn.Parameter(torch.ones(2))
    model, batches = model_and_batches(1)
    optimizer = SGD(list(model.parameters()) + [frozen], lr=0.1, momentum=0.9)
    x, y = batches[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    assert set(optimizer.state) == set(model.parameters())
    assert torch.equal(frozen, torch.ones(2))
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_a_negative_learning_rate_is_refused():
    with pytest.raises(ValueError, match="lr"):
        SGD([torch.nn.Parameter(torch.zeros(1))], lr=-0.1)


def test_an_empty_parameter_list_is_refused_as_torch_refuses_it():
    with pytest.raises(ValueError, match="empty parameter list"):
        torch.optim.SGD([], lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD(iter([]), lr=0.1)


def test_a_client_trains_without_importing_torch_dynamo(toy_overrides):
    """torch.optim's optimizers import torch._dynamo (about 1 s per process); a FedAvg run needs none of it."""
    code = (
        "import sys; from fedsim.config import load_config; import fedsim.api; "
        f"fedsim.api.run_experiment(load_config(None, {toy_overrides!r} + ['run.rounds=1'])); "
        "print('dynamo' if 'torch._dynamo' in sys.modules else 'clean')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "clean"
