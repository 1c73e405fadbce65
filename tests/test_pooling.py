"""fedsim's 2x2 max pooling gives torch's bits, forward and backward, and is swapped in only where it is exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedsim.models import build_model
from fedsim.models.pooling import PairMaxPool2d, use_pair_pooling


def _pooled_and_grad(pool, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = pool(x)
    out.backward(grad)
    return out.detach(), x.grad


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int64)


@pytest.mark.parametrize(
    "shape,dtype", [((8, 6, 28, 28), torch.float32), ((3, 5, 11, 9), torch.float32), ((4, 7, 6), torch.float64)]
)
def test_same_bits_as_max_pool2d_with_ties(shape, dtype):
    generator = torch.Generator().manual_seed(0)
    # few distinct values, so most windows hold ties (zeros after a ReLU, equal positives, -inf)
    x = torch.randint(-2, 3, shape, generator=generator).to(dtype).clamp_min(0)
    x[..., 0, :] = float("-inf")
    grad_shape = (*shape[:-2], shape[-2] // 2, shape[-1] // 2)
    grad = torch.randn(grad_shape, generator=generator, dtype=dtype)
    want_out, want_grad = _pooled_and_grad(lambda v: F.max_pool2d(v, 2), x, grad)
    got_out, got_grad = _pooled_and_grad(PairMaxPool2d(), x, grad)
    assert torch.equal(_bits(got_out), _bits(want_out))
    assert torch.equal(_bits(got_grad), _bits(want_grad))
    assert int((want_grad != 0).sum()) == grad.numel()  # one element per window takes its gradient


def test_nan_and_uncovered_inputs_take_torch_kernel():
    x = torch.randn(2, 3, 4, 4)
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 0, 0] = float("nan")
    grad = torch.ones(2, 3, 2, 2)
    want = _pooled_and_grad(lambda v: F.max_pool2d(v, 2), x, grad)
    got = _pooled_and_grad(PairMaxPool2d(), x, grad)
    assert torch.equal(got[0].isnan(), want[0].isnan())
    assert torch.equal(got[1], want[1])
    channels_last = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    assert torch.equal(PairMaxPool2d()(channels_last), F.max_pool2d(channels_last, 2))
    as_int = torch.arange(32).view(1, 2, 4, 4)
    assert torch.equal(PairMaxPool2d()(as_int), F.max_pool2d(as_int, 2))


def test_swap_takes_only_plain_2x2_pools():
    model = nn.Sequential(
        nn.MaxPool2d(2),
        nn.MaxPool2d((2, 2), stride=2),
        nn.MaxPool2d(3, stride=2, padding=1),
        nn.MaxPool2d(2, ceil_mode=True),
        nn.MaxPool2d(2, stride=1),
        nn.Sequential(nn.MaxPool2d(2)),
    )
    use_pair_pooling(model)
    kinds = [type(m).__name__ for m in (model[0], model[1], model[2], model[3], model[4], model[5][0])]
    assert kinds == ["PairMaxPool2d", "PairMaxPool2d", "MaxPool2d", "MaxPool2d", "MaxPool2d", "PairMaxPool2d"]


def test_lenet_training_keeps_torch_bits():
    class Named:
        name, hidden = "lenet5", 84

    torch.manual_seed(3)
    fast = build_model(Named, (1, 28, 28), 10)
    plain = build_model(Named, (1, 28, 28), 10)
    plain.load_state_dict(fast.state_dict())
    for name, module in plain.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, PairMaxPool2d):
                setattr(module, child_name, nn.MaxPool2d(2))
    assert sum(isinstance(m, PairMaxPool2d) for m in fast.modules()) == 2
    assert not any(isinstance(m, PairMaxPool2d) for m in plain.modules())
    start = fast.state_dict()["encoder.0.weight"].clone()
    generator = torch.Generator().manual_seed(4)
    x, y = torch.rand(6, 16, 1, 28, 28, generator=generator), torch.randint(0, 10, (6, 16), generator=generator)
    for model in (fast, plain):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for step in range(6):
            optimizer.zero_grad()
            F.cross_entropy(model(x[step]), y[step]).backward()
            optimizer.step()
    for (name, a), b in zip(fast.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name
    assert not torch.equal(fast.state_dict()["encoder.0.weight"], start)  # the steps did train
