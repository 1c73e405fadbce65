"""`fedsim run` / `fedsim list` end to end, and every bad input: one line, exit code 2, nothing written."""

import json
import re
import subprocess
import sys

import pytest

from fedsim.experiments.cli import main


def _flags(overrides):
    flags = []
    for item in overrides:
        flags += ["--set", item]
    return flags


def test_run_local_writes_outputs_and_prints_table(toy_overrides, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(
        ["run", "--backend", "local", "--out", str(out), "--rounds", "2", "--seed", "4"] + _flags(toy_overrides)
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "target" in printed and "dom1" in printed and "dom0" in printed
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "method",
        "benchmark",
        "target",
        "backend",
        "seed",
        "rounds",
        "target_accuracy",
        "source_accuracy",
        "bytes_sent",
        "bytes_received",
        "wall_seconds",
    ):
        assert key in summary
    assert (summary["backend"], summary["seed"], summary["rounds"]) == ("local", 4, 2)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in lines] == [1, 2]
    for m in lines:
        assert {"train_loss", "target_accuracy", "source_accuracy", "bytes_sent", "bytes_received"} <= m.keys()
    assert sum(m["bytes_sent"] for m in lines) == summary["bytes_sent"]
    assert (out / "config.yaml").exists()
    assert any((out / "tb").iterdir()), "TensorBoard events are written"


def test_run_ray_gives_same_target_accuracy_as_local(toy_overrides, tmp_path, ray_cluster):
    results = {}
    for backend in ("local", "ray"):
        out = tmp_path / backend
        assert (
            main(["run", "-q", "--backend", backend, "--out", str(out), "--method", "fedprox"] + _flags(toy_overrides))
            == 0
        )
        results[backend] = json.loads((out / "summary.json").read_text())
    assert results["local"]["target_accuracy"] == results["ray"]["target_accuracy"]


def test_run_with_clients_per_domain_and_dirichlet(toy_overrides, tmp_path):
    out = tmp_path / "split"
    args = [
        "run",
        "-q",
        "--backend",
        "local",
        "--out",
        str(out),
        "--clients-per-domain",
        "3",
        "--set",
        "data.partition=dirichlet",
    ]
    assert main(args + _flags(toy_overrides)) == 0
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert len(first["train_loss"]) == 6  # 2 source domains x 3 clients


def test_list_shows_methods_benchmarks_and_domains(capsys):
    from fedsim.registry import BENCHMARKS, METHODS

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for word in ("mnistm", "usps", "synth"):
        assert any(word in line for line in lines)
    for registry in (METHODS, BENCHMARKS):
        for name in registry.names():
            cls = registry.get(name)
            description = cls.description()
            assert description and cls.task in ("classification", "detection"), name
            # one line per entry: the name, its task, its one-line description
            assert any(
                line.split()[:2] == [name, cls.task] and line.rstrip().endswith(description) for line in lines
            ), name
    assert any(line.split()[:2] == ["fedod", "detection"] for line in lines)


BAD_INPUTS = [
    (["--method", "fedavgg"], "unknown method 'fedavgg'"),
    (["--target", "svhn"], "unknown target domain"),
    (["--rounds", "0"], "--rounds must be an integer of 1 or more, got '0'"),
    (["--rounds", "-2"], "--rounds must be an integer of 1 or more, got '-2'"),
    (["--rounds", "2.5"], "--rounds must be an integer of 1 or more, got '2.5'"),
    (["--rounds", "many"], "--rounds must be an integer of 1 or more, got 'many'"),
    (["--local-epochs", "-1"], "--local-epochs must be an integer of 1 or more, got '-1'"),
    (["--clients-per-domain", "0"], "--clients-per-domain must be an integer of 1 or more, got '0'"),
    (["--seed", "-1"], "--seed must be an integer of 0 or more, got '-1'"),
    (["--gpus-per-client", "-0.5"], "--gpus-per-client must be a number of 0 or more, got '-0.5'"),
    (["--inject-faults", "-1"], "--inject-faults must be an integer of 0 or more, got '-1'"),
    (["--set", "run.rounds=0"], "run.rounds must be a positive integer"),
    (["--method", "fedod", "--benchmark", "digits"], "pick a detection benchmark with --benchmark (coco, scenes)"),
    (["--method", "fedavg", "--benchmark", "scenes"], "pick a classification benchmark"),
    (["--set", "method.lrr=0.1"], "did you mean 'lr'"),
    (["--config", "/nonexistent/config.yaml"], "does not exist"),
    (["--backend", "spark"], "run.backend must be 'ray' or 'local'"),
    (["--cpus-per-client", "0"], "--cpus-per-client must be a number above 0, got '0'"),
    (["--benchmark", "npz"], "no default target"),
    (["--benchmark", "npz", "--target", "a"], "data.root"),
    (["--sources", "svhn"], "unknown source domain"),
    (["--clients-per-round", "0"], "--clients-per-round must be a number above 0, got '0'"),
]


# A line Ray streams from an actor of an earlier test in this shared Ray session ("(ServerActor pid=123) ..."):
# not this command's output, so not counted against its one line.
RAY_ACTOR_LINE = re.compile(r"^(\x1b\[[0-9;]*m)*\((raylet|[\w:.]*\s?pid=\d+)")


@pytest.mark.parametrize("args, expected", BAD_INPUTS)
def test_bad_input_one_line_exit_2_nothing_written(args, expected, tmp_path, capsys):
    out = tmp_path / "never"
    code = main(["run", "-q", "--out", str(out)] + args)
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    own = [line for line in err.strip().splitlines() if not RAY_ACTOR_LINE.match(line)]
    assert len(own) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_bad_yaml_key_and_syntax(tmp_path, capsys):
    bad_key = tmp_path / "k.yaml"
    bad_key.write_text("run:\n  roundz: 3\n")
    bad_syntax = tmp_path / "s.yaml"
    bad_syntax.write_text("run: {rounds: 3\n")
    for path, expected in ((bad_key, "did you mean 'rounds'"), (bad_syntax, "not valid YAML")):
        assert main(["run", "--config", str(path), "--out", str(tmp_path / "x")]) == 2
        assert expected in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_existing_run_directory_is_not_overwritten(toy_overrides, tmp_path, capsys):
    out = tmp_path / "done"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    assert main(["run", "--backend", "local", "--out", str(out)] + _flags(toy_overrides)) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_unreachable_address_subprocess(toy_overrides, tmp_path):
    """A real process: one line on stderr, exit code 2, no traceback, no run directory."""
    out = tmp_path / "never"
    proc = subprocess.run(
        [sys.executable, "-m", "fedsim.experiments.cli", "run", "--address", "127.0.0.1:1", "--out", str(out)]
        + _flags(toy_overrides),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("fedsim: error: cannot reach a Ray cluster at 127.0.0.1:1")
    assert not out.exists()


def test_unreachable_address_message(toy_overrides, tmp_path, capsys):
    from fedsim.actors.backend import check_reachable
    from fedsim.errors import UserError

    with pytest.raises(UserError, match="cannot reach a Ray cluster at 127.0.0.1:1"):
        check_reachable("127.0.0.1:1")
    with pytest.raises(UserError, match="bad cluster address"):
        check_reachable("nonsense")


def test_digits_end_to_end_on_both_backends(tmp_path_factory, ray_cluster):
    """The embedded benchmark through the CLI: Ray client actors build their own digits data."""
    cache = tmp_path_factory.mktemp("digits-cache")
    out = tmp_path_factory.mktemp("digits-runs")
    summaries = {}
    for backend in ("local", "ray"):
        args = [
            "run",
            "-q",
            "--backend",
            backend,
            "--target",
            "usps",
            "--rounds",
            "1",
            "--out",
            str(out / backend),
            "--set",
            "data.max_train_per_domain=100",
            "--set",
            f"data.cache_dir={cache}",
        ]
        assert main(args) == 0
        summaries[backend] = json.loads((out / backend / "summary.json").read_text())
    assert summaries["local"]["target_accuracy"] == summaries["ray"]["target_accuracy"]
    assert set(summaries["ray"]["source_accuracy"]) == {"mnist", "mnistm", "synth"}


def test_resume_of_a_missing_run(capsys):
    assert main(["run", "--resume", "/nonexistent/run"]) == 2
    err = capsys.readouterr().err
    assert "no such run directory" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_flag_names_the_subcommands_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--output", "x"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --output x (see 'fedsim run --help')" in capsys.readouterr().err
