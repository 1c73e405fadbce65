"""A method, a benchmark, a model with options of its own, a selection score and a privacy mechanism from a package
outside fedsim: by dotted path and by entry point, on both backends, through ``fedsim.run``, ``fedsim run`` and
``fedsim sweep``; bad plugin paths end in one line.

The package ``plugpkg`` is written to a temporary folder; its installed metadata (a ``*.dist-info`` folder with
the entry points) to another one, so that a Ray worker given only the package resolves the entry-point names
through the table fedsim passes it.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import assert_same_results

import fedsim
from fedsim.config import load_config
from fedsim.experiments.cli import main
from fedsim.privacy.accountant import spent_epsilon
from fedsim.registry import BENCHMARKS, MECHANISMS, METHODS, MODELS, SCORES

REGISTRIES = (METHODS, BENCHMARKS, MODELS, SCORES, MECHANISMS)

METHOD = "plugpkg.methods:ServerMomentum"
BENCHMARK = "plugpkg.data:Clusters"
MODEL = "plugpkg.nets:tiny_net"
DEEP = "plugpkg.nets:deep_net"
ENTRY_POINTS = {"fedsim.methods": {"momentum": METHOD}, "fedsim.benchmarks": {"clusters": BENCHMARK}}
ENTRY_POINTS["fedsim.models"] = {"tinynet": MODEL}
SCORE = "plugpkg.scores:TopProbability"
MECHANISM = "plugpkg.privacy:EvenSplit"
ENTRY_POINTS["fedsim.scores"] = {"topprob": SCORE}
ENTRY_POINTS["fedsim.privacy"] = {"evensplit": MECHANISM}

SOURCES = {
    "__init__.py": '"""A package of fedsim plugins."""\n',
    "methods.py": '''
        """FedAvg with server momentum."""

        from dataclasses import dataclass

        import numpy as np

        from fedsim.errors import UserError
        from fedsim.methods.fedavg import FedAvg


        class ServerMomentum(FedAvg):
            """FedAvg with server momentum: the averaged update feeds a velocity the server applies."""

            server_needs_torch = False

            @dataclass(frozen=True)
            class Params:
                server_momentum: float = 0.5
                server_lr: float = 1.0

                def __post_init__(self):
                    if not 0 <= self.server_momentum < 1:
                        raise UserError(f"method.server_momentum must be in [0, 1), got {self.server_momentum}")

            def init_server(self):
                state = super().init_server()
                return {**state, "velocity": {k: np.zeros_like(v) for k, v in state["weights"].items()}}

            def aggregate(self, ctx, state, replies):
                averaged, metrics = super().aggregate(ctx, state, replies)
                mean, old = averaged["weights"], state["weights"]
                beta, lr = self.params.server_momentum, self.params.server_lr
                velocity = {k: beta * state["velocity"][k] + (old[k] - mean[k]) for k in mean}
                weights = {k: (old[k] - lr * velocity[k]).astype(mean[k].dtype) for k in mean}
                return {**averaged, "weights": weights, "velocity": velocity}, metrics
    ''',
    "data.py": '''
        """Clusters: one Gaussian cluster per class in four dimensions; each domain shifted further."""

        from dataclasses import dataclass, field

        import numpy as np

        from fedsim.data.base import Benchmark
        from fedsim.data.benchmarks.splits import split_named_domain
        from fedsim.errors import UserError
        from fedsim.seeding import numpy_rng


        class Clusters(Benchmark):
            """Clusters: one Gaussian cluster per class, domains a, b, c shifted by data.shift"""

            default_target = "b"

            @dataclass(frozen=True)
            class Options:
                names: tuple[str, ...] = ("a", "b", "c")
                per_domain: int = 90
                shift: float = 0.5

                def __post_init__(self):
                    if self.per_domain < 12:
                        raise UserError(f"data.per_domain must be 12 or more, got {self.per_domain}")

            def domains(self):
                return list(self.options.names)

            def build_domain(self, domain):
                if domain not in self.domains():
                    raise UserError(f"unknown domain {domain!r}: choose one of {', '.join(self.domains())}")
                centers = numpy_rng(self.config.seed, "clusters").normal(0, 2.0, size=(3, 4))
                y = np.arange(self.options.per_domain) % 3
                noise = numpy_rng(self.config.seed, "clusters", domain).normal(0, 0.5, size=(len(y), 4))
                x = centers[y] + noise + self.options.shift * self.domains().index(domain)
                return split_named_domain(domain, x.astype(np.float32), y.astype(np.int64), 3, self.config)


        class Listed(Clusters):
            """Clusters whose options hold a list."""

            @dataclass(frozen=True)
            class Options:
                names: list = field(default_factory=lambda: ["a", "b"])
    ''',
    "nets.py": '''
        """A small perceptron."""

        from dataclasses import dataclass

        from torch import nn

        from fedsim.errors import UserError
        from fedsim.models import declares
        from fedsim.models.classifier import Classifier

        NOT_A_MODEL = 3


        @dataclass(frozen=True)
        class DeepOptions:
            depth: int = 1
            activation: str = "tanh"

            def __post_init__(self):
                if self.depth < 1:
                    raise UserError(f"model.depth must be 1 or more, got {self.depth}")


        @declares(DeepOptions)
        def deep_net(input_shape, num_classes, hidden=128, options=DeepOptions()):
            """model.depth hidden layers of model.hidden / 4 units."""
            (dim,) = input_shape
            width = max(4, hidden // 4)
            act = nn.Tanh if options.activation == "tanh" else nn.ReLU
            layers = [nn.Linear(dim, width), act()]
            for _ in range(options.depth - 1):
                layers += [nn.Linear(width, width), act()]
            return Classifier(nn.Sequential(*layers), nn.Linear(width, num_classes))


        def bare_net(input_shape, num_classes, hidden=128):
            """A model that is not a Classifier."""
            return nn.Linear(input_shape[0], num_classes)


        def failing_net(input_shape, num_classes, hidden=128):
            """A model whose own code raises."""
            raise ZeroDivisionError("the plugin's own bug")


        def tiny_net(input_shape, num_classes, hidden=128):
            """One hidden layer of model.hidden / 4 units."""
            (dim,) = input_shape
            width = max(4, hidden // 4)
            return Classifier(nn.Sequential(nn.Linear(dim, width), nn.Tanh()), nn.Linear(width, num_classes))
    ''',
    "scores.py": '''
        """A selection score: the target's mean top-class probability."""

        import math

        import numpy as np

        from fedsim.selection import Score


        class TopProbability(Score):
            name = "top_probability"
            description = "the target's mean largest softmax probability"

            def target_statistics(self, logits, log_probabilities):
                return {"top_probability_sum": math.fsum(np.exp(log_probabilities).max(axis=1))}

            def combine(self, sources, targets):
                rows = math.fsum(t["n_target"] for t in targets)
                return math.fsum(t["top_probability_sum"] for t in targets) / rows


        class Unnamed(TopProbability):
            name = ""
    ''',
    "privacy.py": '''
        """A privacy mechanism: the Gaussian noise split evenly over the replies, accounted without sampling."""

        import math

        from fedsim.errors import UserError
        from fedsim.privacy.mechanism import Mechanism


        class EvenSplit(Mechanism):
            description = "Gaussian noise of std z C / sqrt(m) on each of the m replies, no amplification by sampling"

            def check(self, settings):
                if settings.stage_clip:
                    raise UserError("privacy.mode=EvenSplit takes one clip: leave privacy.stage_clip out")

            def noise_stds(self, combined, noise_multiplier, clip, weights):
                return {cid: noise_multiplier * clip / math.sqrt(len(weights)) for cid in weights}
    ''',
    "broken.py": 'raise RuntimeError("this module does not import")\n',
}


def write_plugins(folder):
    """``folder/plugpkg``: the package of the plugins."""
    (folder / "plugpkg").mkdir(parents=True)
    for name, text in SOURCES.items():
        (folder / "plugpkg" / name).write_text(textwrap.dedent(text).lstrip())
    return folder


def write_metadata(folder, entry_points, name="plugpkg"):
    """``folder/<name>-0.1.dist-info``: what installing a distribution with these entry points records."""
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    groups = [
        "[%s]\n" % group + "".join(f"{k} = {v}\n" for k, v in names.items()) for group, names in entry_points.items()
    ]
    info.joinpath("entry_points.txt").write_text("\n".join(groups))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("plugins")
    return {
        "package": write_plugins(base / "package"),
        "metadata": write_metadata(base / "metadata", ENTRY_POINTS),
        "clash": write_metadata(base / "clash", {"fedsim.methods": {"fedavg": METHOD}}, name="clashing"),
        "cache": base / "cache",
    }


@pytest.fixture
def plugins(folders, monkeypatch):
    """The package and its metadata on this process's path (not on PYTHONPATH: Ray workers do not see them unless
    fedsim ships them); afterwards the registries without them."""
    monkeypatch.syspath_prepend(str(folders["metadata"]))
    monkeypatch.syspath_prepend(str(folders["package"]))
    for registry in REGISTRIES:
        registry._entry_points = None  # read again, with the metadata on the path
    yield folders
    for registry in REGISTRIES:
        for name in [n for n, obj in registry._entries.items() if str(obj.__module__).startswith("plugpkg")]:
            del registry._entries[name]
            registry.targets.pop(name, None)
            registry.origins.pop(name, None)
        registry._entry_points = None
    for name in [m for m in sys.modules if m == "plugpkg" or m.startswith("plugpkg.")]:
        del sys.modules[name]


def settings(folders, **extra):
    return {
        "rounds": 2,
        "seed": 1,
        "set": {
            "model.name": MODEL,
            "model.hidden": 32,
            "method.server_momentum": 0.3,
            "method.batch_size": 16,
            "data.shift": 1.0,
            "data.cache_dir": str(folders["cache"]),
            "run.tensorboard": False,
            **extra,
        },
    }


def test_local_and_ray_give_identical_numbers_by_dotted_path(plugins, ray_cluster, tmp_path):
    results = {
        backend: fedsim.run(
            method=METHOD, benchmark=BENCHMARK, backend=backend, out=tmp_path / backend, **settings(plugins)
        )  # fmt: skip
        for backend in ("local", "ray")
    }
    local, ray = results["local"], results["ray"]
    assert local.summary["method"] == METHOD and local.summary["benchmark"] == BENCHMARK
    assert local.summary["target"] == "b" and set(local.summary["source_accuracy"]) == {"a", "c"}
    assert_same_results(local, ray, ("target_accuracy", "source_accuracy", "bytes_sent", "bytes_received"))
    assert [r["source_accuracy"] for r in local.history] == [r["source_accuracy"] for r in ray.history]
    assert local.summary["source_accuracy"]["a"] > 0.5  # three classes: well above chance
    # the config written to the run directory reads back as the run's config (what --resume does)
    written = load_config(tmp_path / "local" / "config.yaml", values={"run.backend": "local", "run.progress": False})
    assert written.data.options.shift == 1.0 and written.method.params.server_momentum == 0.3
    assert written == fedsim.make_config(method=METHOD, benchmark=BENCHMARK, **settings(plugins))


def test_entry_point_names_run_on_ray_without_the_metadata_on_the_workers(plugins, ray_cluster, tmp_path):
    """The workers get the package's folder, not the metadata's: they resolve the names by fedsim's table."""
    by_path = fedsim.run(method=METHOD, benchmark=BENCHMARK, **settings(plugins))
    by_name = fedsim.run(
        method="momentum", benchmark="clusters", backend="ray", **settings(plugins, **{"model.name": "tinynet"})
    )
    assert by_name.summary["method"] == "momentum" and by_name.summary["benchmark"] == "clusters"
    assert_same_results(by_path, by_name, ("target_accuracy", "source_accuracy", "bytes_sent"))
    assert METHODS.origins["momentum"] == f"{METHOD} (entry point of plugpkg 0.1)"


def _flags(folders, model=MODEL):
    flags = ["--rounds", "2", "--seed", "1", "--set", f"model.name={model}", "--set", "model.hidden=32"]
    for key in ("method.server_momentum=0.3", "method.batch_size=16", "data.shift=1.0", "run.tensorboard=false"):
        flags += ["--set", key]
    return flags + ["--set", f"data.cache_dir={folders['cache']}"]


def _fedsim(args, folders, cwd, *path):
    """``fedsim ...`` in a fresh process whose PYTHONPATH holds ``path`` (run in ``cwd``, away from the package)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(p) for p in path] + [os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "fedsim.experiments.cli", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_fedsim_run_on_ray_and_fedsim_list_in_a_fresh_process(folders, tmp_path):
    """The command line in another folder, the package and its metadata on PYTHONPATH: the run's own local Ray
    cluster imports the plugins by their entry-point names; the numbers are the local backend's."""
    (tmp_path / "elsewhere").mkdir()
    path = (folders["package"], folders["metadata"])
    listing = _fedsim(["list"], folders, tmp_path / "elsewhere", *path)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert any(line.split()[:2] == ["momentum", "classification"] and "server momentum" in line for line in lines)
    assert any(line.split()[:2] == ["clusters", "classification"] for line in lines)
    assert any(line.split()[:1] == ["tinynet"] and "hidden layer" in line for line in lines)
    assert f"plugin: {METHOD} (entry point of plugpkg 0.1)" in listing.stdout
    assert "domains: a, b, c" in listing.stdout
    assert any(line.split()[:1] == ["topprob"] and "largest softmax probability" in line for line in lines)
    assert any(line.split()[:1] == ["evensplit"] and "no amplification by sampling" in line for line in lines)
    for target in (SCORE, MECHANISM):
        assert f"plugin: {target} (entry point of plugpkg 0.1)" in listing.stdout
    assert "options: model.weights, model.backbone, model.head" in listing.stdout  # the ResNets' own
    out = tmp_path / "run"
    args = ["run", "-q", "--method", "momentum", "--benchmark", "clusters", "--backend", "ray", "--out", str(out)]
    result = _fedsim(args + _flags(folders, "tinynet"), folders, tmp_path / "elsewhere", *path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    sys.path[:0] = [str(folders["package"])]
    try:
        local = fedsim.run(method=METHOD, benchmark=BENCHMARK, **settings(folders)).summary
    finally:
        sys.path.remove(str(folders["package"]))
    assert (summary["method"], summary["backend"]) == ("momentum", "ray")
    assert (summary["target_accuracy"], summary["source_accuracy"]) == (local["target_accuracy"],
                                                                        local["source_accuracy"])  # fmt: skip


def test_an_entry_point_named_as_a_built_in_is_refused(folders, monkeypatch, tmp_path, capsys):
    monkeypatch.syspath_prepend(str(folders["clash"]))
    monkeypatch.setattr(METHODS, "_entry_points", None)  # read again, with the clashing metadata on the path
    for args in (["list"], ["run", "--method", "fedavg", "--backend", "local", "--out", str(tmp_path / "x")]):
        assert main(args) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"fedsim: error: the entry point 'fedavg' of {METHOD} (entry point of clashing 0.1) has the name of the "
            "built-in method 'fedavg': rename it in that package's entry points (group fedsim.methods)"
        ]
    assert not (tmp_path / "x").exists()


def test_a_plugin_model_declares_its_options_and_runs_alike_on_both_backends(plugins, ray_cluster, tmp_path):
    deep = {"model.name": DEEP, "model.depth": 2, "model.activation": "relu"}
    local = fedsim.run(method=METHOD, benchmark=BENCHMARK, out=tmp_path / "local", **settings(plugins, **deep))
    ray = fedsim.run(method=METHOD, benchmark=BENCHMARK, backend="ray", **settings(plugins, **deep))
    assert_same_results(local, ray, ("target_accuracy", "source_accuracy", "bytes_sent", "bytes_received"))
    assert local.global_tensors["encoder.2.weight"].shape == (8, 8) and "encoder.4.weight" not in local.global_tensors
    written = load_config(tmp_path / "local" / "config.yaml", values={"run.progress": False})
    assert written.to_dict()["model"] == {"name": DEEP, "hidden": 32, "depth": 2, "activation": "relu"}
    assert type(written.model.options).__name__ == "DeepOptions" and written.model.options.depth == 2
    one = fedsim.run(method=METHOD, benchmark=BENCHMARK, **settings(plugins, **{"model.name": DEEP}))
    assert "encoder.2.weight" not in one.global_tensors  # the option reached the model: one layer by default


def test_fedsim_sweep_runs_a_plugin_score_mechanism_and_model_with_options(plugins, ray_cluster, tmp_path):
    """``--select`` a score named by its dotted path: every trial reports it under its declared name, and the
    selection report reads it there."""
    out = tmp_path / "sweep"
    flags = ["--methods", METHOD, "--benchmark", BENCHMARK, "--seeds", "1", "--out", str(out), "--select", SCORE]
    extended = {**EXTENDED, "run.scores": "entropy", "model.name": DEEP, "model.depth": 2}
    flags += ["--rounds", "1"] + [arg for key, value in extended.items() for arg in ("--set", f"{key}={value}")]
    assert main(["sweep", "-q"] + flags + _flags(plugins)[6:]) == 0
    (row,) = list(csv.DictReader((out / "results.csv").open()))
    assert row["status"] == "finished", row
    assert 1 / 3 <= float(row["score_top_probability"]) <= 1 and float(row["score_entropy"]) == float(
        row["score_entropy"]
    )
    local = fedsim.run(
        method=METHOD, benchmark=BENCHMARK, **{**settings(plugins, **extended), "rounds": 1}
    ).summary  # fmt: skip
    assert float(row["target_accuracy"]) == pytest.approx(local["target_accuracy"], abs=1e-9)
    assert "top_probability" in (out / "selection.md").read_text()


def test_fedsim_sweep_runs_a_plugin_method(plugins, ray_cluster, tmp_path):
    out = tmp_path / "sweep"
    flags = ["--methods", "momentum", "--benchmark", BENCHMARK, "--seeds", "1", "--out", str(out)]
    flags += ["--rounds", "2"] + _flags(plugins)[4:]
    assert main(["sweep", "-q"] + flags) == 0
    (row,) = list(csv.DictReader((out / "results.csv").open()))
    assert row["method"] == "momentum" and row["status"] == "finished"
    local = fedsim.run(method=METHOD, benchmark=BENCHMARK, **settings(plugins)).summary
    assert float(row["target_accuracy"]) == pytest.approx(local["target_accuracy"], abs=1e-9)


BAD = [
    (["--method", "plugpkg.nothing:X"], "cannot import module 'plugpkg.nothing' of method 'plugpkg.nothing:X': "),
    (["--method", "plugpkg.methods:ServerMomentm"], "'plugpkg.methods' has no attribute 'ServerMomentm'"),
    (["--method", "plugpkg.methods:ServerMomentm"], "did you mean 'ServerMomentum'?"),
    (["--method", BENCHMARK], f"method '{BENCHMARK}' is the class Clusters, not a method: give a subclass of"),
    (["--benchmark", METHOD], f"benchmark '{METHOD}' is the class ServerMomentum, not a benchmark"),
    (["--set", "model.name=plugpkg.nets:NOT_A_MODEL"], "is an object of type int, not a model: give a function"),
    (["--method", "plugpkg.broken:X"], "importing 'plugpkg.broken' for method 'plugpkg.broken:X' failed (RuntimeError"),
    (["--method", "plug pkg:X"], "bad method 'plug pkg:X': write a plugin as module.path:Attribute"),
    (["--benchmark", BENCHMARK, "--set", "data.shiftt=1"], "'data.shiftt' for benchmark 'plugpkg.data:Clusters'"),
    (["--benchmark", BENCHMARK, "--set", "data.shiftt=1"], "did you mean 'shift'?"),
    (["--benchmark", BENCHMARK, "--set", "data.per_domain=5"], "data.per_domain must be 12 or more, got 5"),
    (["--method", METHOD, "--set", "method.server_momentum=1"], "method.server_momentum must be in [0, 1)"),
    (["--benchmark", "plugpkg.data:Listed", "--target", "a"], "hold an unhashable value (unhashable type: 'list')"),
    (["--method", "momentun"], "unknown method 'momentun': did you mean 'momentum'?"),
    (
        ["--set", "model.name=plugpkg.nets:bare_net"],
        "returned an object of type Linear, not a fedsim.models.Classifier",
    ),
    (["--set", f"run.scores={MODEL}"], f"score '{MODEL}' is an object of type function, not a score: give a subclass"),
    (
        ["--set", "run.scores=plugpkg.scores:Unnamed"],
        "score 'plugpkg.scores:Unnamed' declares no name (its metric is score_<name>), it has '': set name = ",
    ),
    (
        ["--set", f"run.scores={SCORE},topprob"],
        "selection scores 'plugpkg.scores:TopProbability' and 'topprob' both report score_top_probability",
    ),
    (["--set", f"model.name={DEEP}", "--set", "model.dept=2"], f"'model.dept' for model '{DEEP}' (its own keys: depth"),
    (["--set", f"model.name={DEEP}", "--set", "model.depth=0"], "model.depth must be 1 or more, got 0"),
    (["--set", f"model.name={DEEP}", "--set", "model.depth=two"], "model.depth"),
    (["--set", "model.depth=2"], "unknown config key 'model.depth' for model 'auto' (it has no keys of its own)"),
    (
        ["--set", f"privacy.mode={SCORE}", "--set", "privacy.noise_multiplier=1", "--set", "privacy.clip=1"],
        f"privacy mechanism '{SCORE}' is the class TopProbability, not a privacy mechanism",
    ),  # fmt: skip
    (
        [
            "--set",
            f"privacy.mode={MECHANISM}",
            "--set",
            "privacy.noise_multiplier=1",
            "--set",
            "privacy.clip=1",
            "--set",
            "privacy.stage_clip={fit: 2}",
        ],
        "privacy.mode=EvenSplit takes one clip",
    ),  # fmt: skip
]


@pytest.mark.parametrize("args, expected", BAD)
def test_a_bad_plugin_is_one_line_exit_2_and_nothing_written(plugins, args, expected, tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["run", "-q", "--backend", "local", "--out", str(out)] + args)
    err = capsys.readouterr().err
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_the_runtime_environment_of_each_way_to_reach_ray(plugins, monkeypatch):
    """A fresh local cluster: the package's folder on PYTHONPATH; a joined cluster: the package uploaded; a Ray the
    caller initialized: each actor's PYTHONPATH; every time the entry-point names' table and the user's settings."""
    plugin = pytest.importorskip("fedsim.actors.plugins")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("FEDSIM_PLUGINS", raising=False)
    config = fedsim.make_config(method="momentum", benchmark=BENCHMARK, set={"model.name": "tinynet"})
    found = plugin.plugins_of([config])
    package = str(plugins["package"].resolve())
    assert found.modules == (f"{package}/plugpkg",) and found.roots == (package,)
    table = {"fedsim.methods": {"momentum": METHOD}, "fedsim.models": {"tinynet": MODEL}}
    user = {"pip": ["tqdm"], "env_vars": {"A": "1"}, "py_modules": ["/opt/shared"]}
    local = plugin.job_runtime_env(found, user, joins=False)
    assert local == {
        "pip": ["tqdm"],
        "py_modules": ["/opt/shared"],
        "env_vars": {
            "A": "1",
            "FEDSIM_PLUGINS": json.dumps(table, sort_keys=True),
            "PYTHONPATH": f"{package}:/elsewhere",
        },
    }
    joined = plugin.job_runtime_env(found, user, joins=True)
    assert joined["py_modules"] == ["/opt/shared", f"{package}/plugpkg"] and "PYTHONPATH" not in joined["env_vars"]
    each = plugin.actor_runtime_env(found)
    assert each == {
        "env_vars": {"FEDSIM_PLUGINS": json.dumps(table, sort_keys=True), "PYTHONPATH": f"{package}:/elsewhere"}
    }
    monkeypatch.setenv("FEDSIM_PLUGINS", json.dumps(table))  # a process fedsim started with them: children inherit
    assert plugin.actor_runtime_env(found) is None
    builtin = plugin.plugins_of([fedsim.make_config()])
    assert not builtin and plugin.job_runtime_env(builtin, None, joins=True) is None
    with pytest.raises(fedsim.errors.UserError, match="ray.runtime_env differs between the trials"):
        plugin.check_user_env([config, fedsim.make_config(config, set={"ray.runtime_env": user})])


def test_a_bad_runtime_env_is_one_line(capsys, tmp_path):
    assert main(["run", "--out", str(tmp_path / "x"), "--set", "ray.runtime_env=5"]) == 2
    assert "ray.runtime_env must be a mapping of Ray runtime-environment fields, got 5" in capsys.readouterr().err


EXTENDED = {"run.scores": f"entropy,{SCORE}", "privacy.mode": MECHANISM, "privacy.noise_multiplier": 1.0}
EXTENDED["privacy.clip"] = 5.0


def test_a_plugin_score_and_mechanism_run_alike_on_both_backends(plugins, ray_cluster, tmp_path):
    """A score and a privacy mechanism from the user's package, with the plugin method (a FedAvg subclass: it
    inherits FedAvg's privacy exchanges), by dotted path on the local backend and by entry-point names on Ray."""
    local = fedsim.run(method=METHOD, benchmark=BENCHMARK, **settings(plugins, **EXTENDED))
    by_name = {**EXTENDED, "run.scores": "entropy,topprob", "privacy.mode": "evensplit"}
    ray = fedsim.run(method=METHOD, benchmark=BENCHMARK, backend="ray", **settings(plugins, **by_name))
    for result in (local, ray):  # one metric, score_<Score.name>, whichever way the score is named
        last = result.history[-1]
        assert 1 / 3 <= last["score_top_probability"] <= 1 and "score_entropy" in last
        assert not [key for key in last if key.startswith("score_top") and key != "score_top_probability"]
        # no sampling amplification: two rounds of one Gaussian exchange at z = 1
        assert last["privacy_epsilon"] == pytest.approx(spent_epsilon([(1.0,)] * 2, 1.0, 1e-5))
    assert ray.history[-1]["score_top_probability"] == local.history[-1]["score_top_probability"]
    assert ray.history[-1]["target_accuracy"] == local.history[-1]["target_accuracy"]


def test_a_plugin_model_that_raises_keeps_its_traceback_and_names_the_plugin(plugins):
    with pytest.raises(ZeroDivisionError) as error:
        fedsim.run(
            method=METHOD, benchmark=BENCHMARK, **settings(plugins, **{"model.name": "plugpkg.nets:failing_net"})
        )
    assert "raised by the model plugin 'plugpkg.nets:failing_net'" in error.value.__notes__[0]
