"""The CUDA code paths, as far as a CPU checks them, and on a GPU where there is one.

``torch.device("meta")`` stands in for an accelerator: a meta tensor holds no data, so an operation that mixes it
with a CPU tensor raises, as it would with a CUDA one, and so does any read back to the host (``float``, ``.item()``,
``.numpy()``). A loop that runs on meta therefore keeps its tensors on the device and reads nothing back per batch.
The tests marked ``cuda`` run only where ``torch.cuda.is_available()``.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import write_image_domains

from fedsim.config import load_config
from fedsim.data.base import ArraySplit
from fedsim.data.scenario import build_federation
from fedsim.methods.common.training import (
    classification_loss,
    epochs_loss,
    evaluate_model,
    evaluation_sums,
    minibatches,
    train_epochs,
)
from fedsim.methods.fada.batches import labeled_batch, labeled_batches
from fedsim.methods.fada.losses import AdversarialAlignment, Disentanglement, MINELoss
from fedsim.methods.fada.networks import SourceParts, build_fada_net, feature_width
from fedsim.models import build_model
from fedsim.optim import SGD
from fedsim.runtime.client_host import ClientHost

META = torch.device("meta")
SHAPE = (3, 8, 8)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CLASSIFICATION = ["fedavg", "fedprox", "fedbn", "fedrep", "feddann", "fedmmd", "dann", "mmd", "centralized"]
CLASSIFICATION += ["fada", "feddadil", "dadil"]
DETECTION = ["fedod", "fedavg_det", "fedbn_det", "fedrep_det"]
CPU_STATE = {"feddadil": {"alpha"}}
"""Client-state keys a method keeps on the CPU on purpose: FedDaDiL's dictionary stage runs there (docs/gpu.md)."""


def image_split(rows: int = 40, classes: int = 3, seed: int = 0) -> ArraySplit:
    rng = np.random.default_rng(seed)
    return ArraySplit(rng.standard_normal((rows, *SHAPE), dtype=np.float32), rng.integers(0, classes, rows))


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(SimpleNamespace(name="cnn", hidden=16), SHAPE, 3)


def off_device(value, device: torch.device, where: str = "state") -> list[str]:
    """Where the tensors of ``value`` (a module, a tensor, or dicts and sequences of them) are not on ``device``."""
    if isinstance(value, torch.nn.Module):
        named = [*value.named_parameters(), *value.named_buffers()]
        return [f"{where}.{name} on {t.device}" for name, t in named if t.device != device]
    if isinstance(value, torch.Tensor):
        return [] if value.device == device else [f"{where} on {value.device}"]
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in off_device(item, device, f"{where}[{key!r}]")]
    if isinstance(value, (list, tuple)):
        return [bad for i, item in enumerate(value) for bad in off_device(item, device, f"{where}[{i}]")]
    return []


def test_the_training_loop_runs_on_a_device_without_reading_back_per_batch():
    model, split = small_cnn().to(META), image_split()
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = epochs_loss(model, split, 2, 8, optimizer, seed=0, device=META)  # any float(loss) per batch raises
    assert loss.device == META and loss.dtype == torch.float64
    assert off_device(model, META) == [] and off_device(optimizer.state, META) == []
    correct, loss_sum = evaluation_sums(model, split, META)
    assert (correct.device, loss_sum.device) == (META, META)
    assert [len(idx) for idx in minibatches(10, 4, torch.Generator().manual_seed(0), META)] == [4, 4, 2]


def test_the_loop_reports_the_sums_of_python_floats_bit_for_bit():
    """Summing on the device in float64 gives the numbers the per-batch ``float(loss)`` sums gave."""
    split, model = image_split(45), small_cnn()
    reference = copy.deepcopy(model)
    loss = train_epochs(model, split, 2, 8, SGD(model.parameters(), lr=0.1), seed=3, device=torch.device("cpu"))
    optimizer, generator = SGD(reference.parameters(), lr=0.1), torch.Generator().manual_seed(3)
    x, y = torch.from_numpy(split.x), torch.from_numpy(split.y)
    reference.train()
    for _ in range(2):
        total, count = 0.0, 0
        for idx in minibatches(len(x), 8, generator):
            optimizer.zero_grad(set_to_none=True)
            step = classification_loss(reference, x[idx], y[idx])
            step.backward()
            optimizer.step()
            total, count = total + float(step.detach()) * len(idx), count + len(idx)
    assert loss == total / count
    reference.eval()
    with torch.no_grad():
        logits = reference(x)
        expected = sum(
            float(torch.nn.functional.cross_entropy(logits[i : i + 16], y[i : i + 16], reduction="sum"))
            for i in range(0, len(x), 16)
        )
    scores = evaluate_model(model, split, torch.device("cpu"), batch_size=16)
    assert scores == {"correct": float((logits.argmax(1) == y).sum()), "total": 45.0, "loss_sum": expected}


def test_fada_source_stages_run_on_a_device_without_reading_back_per_batch():
    net = build_fada_net(small_cnn(), SHAPE).to(META)
    width = feature_width(net.encoder, SHAPE)  # a forward pass of zeros made on the encoder's device
    parts, mine = SourceParts(width, 3, 8, 8).to(META), MINELoss(0.01).to(META)
    generator, split = torch.Generator().manual_seed(0), image_split()
    make = lambda params: SGD(params, lr=0.01)  # noqa: E731
    objective = Disentanglement(net, parts, mine, SGD(parts.statistics.parameters(), lr=0.01), make, 1.0, 1e-4, 0.01)
    for xb, yb in labeled_batches(split, 8, 3, generator, META):
        objective.step(xb, yb, generator)
    assert objective.batches == 3 and off_device(objective.sums, META) == []
    assert mine.log_average.device == META
    alignment = AdversarialAlignment(net, parts.domain_identifier, make(parts.parameters()), make(net.parameters()))
    batch = labeled_batch(split, 8, 3, 1, generator, META)
    alignment.step(*batch, 0.1, torch.zeros(16, width, device=META), generator)
    assert off_device([alignment.accuracies, alignment.confusions], META) == []
    assert off_device([net, parts], META) == []


def test_mine_starts_its_average_on_the_first_batch_without_a_host_branch():
    mine = MINELoss(0.5)
    first, second = torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])
    assert float(mine.update_average(first)) == pytest.approx(np.log(np.mean(np.exp([0.0, 1.0]))), rel=1e-6)
    expected = np.log(0.5 * np.mean(np.exp([0.0, 1.0])) + 0.5 * np.mean(np.exp([2.0, 3.0])))
    assert float(mine.update_average(second)) == pytest.approx(expected, rel=1e-6)


def test_a_detector_takes_cpu_images_to_its_device():
    detector = pytest.importorskip("fedsim.models.detector")
    model = detector.build_detector(detector.DetectorSpec(3, 64, width=4, fpn_channels=8, head_convs=1), 0).to(META)
    maps = model.maps(torch.rand(2, 3, 64, 64))
    assert {t.device for t in [*maps["features"], *maps["cls_logits"], *maps["bbox_regression"]]} == {META}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    root = write_image_domains(tmp_path_factory.mktemp("gpu-images"))
    cache = tmp_path_factory.mktemp("gpu-cache")
    return [
        "data.benchmark=npz",
        f"data.root={root}",
        "data.target=img1",
        f"data.cache_dir={cache}",
        "run.backend=local",
        "run.rounds=2",
        "run.progress=false",
        "run.tensorboard=false",
        "run.checkpoint_every=0",
        "method.batch_size=16",
        "method.lr=0.05",
    ]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> list[str]:
    pytest.importorskip("torchvision")
    cache = tmp_path_factory.getbasetemp() / "scenes-tiny-cache"  # the tiny scenes test_fedod builds
    return [
        *("data.benchmark=scenes", "data.variant=tiny", "data.target=dusk", "data.sources=server,farm"),
        *(
            f"data.cache_dir={cache}",
            "run.backend=local",
            "run.rounds=1",
            "run.progress=false",
            "run.tensorboard=false",
        ),
        *("method.batch_size=4", "method.width=4", "method.fpn_channels=8", "method.head_convs=1"),
        *("method.base_iters=2", "method.client_iters=1"),
    ]


def method_config(images, scenes_options, name: str, *extra: str):
    if name in DETECTION:
        return load_config(None, [*scenes_options, f"method.name={name}", *extra])
    own = ["method.encoder_rounds=1"] if name in ("feddadil", "dadil") else []
    return load_config(None, [*images, f"method.name={name}", *own, *extra])


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("name", CLASSIFICATION + DETECTION)
def test_every_client_state_is_built_on_the_clients_device(request, images, name, device):
    """What a Ray client actor with GPUs builds: every model, part and buffer of each hosted client's state."""
    scenes_options = request.getfixturevalue("scenes") if name in DETECTION else None
    config = method_config(images, scenes_options, name)
    federation = build_federation(config.data)
    host = ClientHost(config, federation, federation.client_ids, device=device)
    assert host.method.device == torch.device(device)
    wanted = torch.device(device, 0) if device == "cuda" else torch.device(device)
    for cid in federation.client_ids:
        state = host.private_state(cid)
        kept = (
            {k: v for k, v in state.items() if k not in CPU_STATE.get(name, ())} if isinstance(state, dict) else state
        )
        assert off_device(kept, wanted) == [], (name, cid)


def test_fractional_gpus_share_a_gpu_among_client_actors(images, monkeypatch, caplog):
    backend = pytest.importorskip("fedsim.actors.backend")
    config = load_config(None, [*images, "resources.gpus_per_client=0.5"])
    federation = build_federation(config.data)
    monkeypatch.setattr(backend.ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 1.0})
    plan = backend.plan_actors(config, federation)
    assert plan.resources == ((1.0, 0.5),) * 2 and sorted(set(plan.assignment.values())) == [0, 1]
    monkeypatch.setattr(backend.ray, "cluster_resources", lambda: {"CPU": 8.0})
    with caplog.at_level(logging.WARNING):
        plan = backend.plan_actors(config, federation)
    assert plan.resources == ((1.0, 0.0),) * 3
    assert "--gpus-per-client 0.5 asked for GPUs but the Ray cluster has none: running on CPU" in caplog.text


def test_a_gpu_request_runs_on_the_cpu_where_cuda_is_missing(images, monkeypatch):
    import fedsim

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = fedsim.run(load_config(None, [*images, "resources.gpus_per_client=0.5", "run.rounds=1"]))
    assert result.summary["rounds"] == 1 and 0.0 <= result.summary["target_accuracy"] <= 1.0


@cuda
@pytest.mark.parametrize("name", ["fedavg", "fada", "feddadil", "fedod"])
def test_a_tiny_run_scores_alike_on_the_cpu_and_the_gpu(request, images, name):
    from fedsim.runtime import Server, Simulator
    from tools.benchmarks.gpu_check import DeviceExecutor

    scenes_options = request.getfixturevalue("scenes") if name in DETECTION else None
    config = method_config(images, scenes_options, name)
    federation = build_federation(config.data)
    summaries = []
    for device in ("cpu", "cuda"):
        server = Server(config, federation, DeviceExecutor(config, federation, device))
        try:
            summaries.append(Simulator(config, server, None).run())
        finally:
            server.close()
    one_sample = 1.0 / federation.info(federation.target_ids[0]).num_test  # rounding may flip one prediction
    assert abs(summaries[0]["target_accuracy"] - summaries[1]["target_accuracy"]) <= one_sample + 1e-9


def test_the_gpu_check_says_in_one_line_that_there_is_no_gpu(monkeypatch, capsys):
    from tools.benchmarks import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "no GPU: torch.cuda.is_available() is False, nothing measured (--cpu-only times the CPU trials)"
    ]
