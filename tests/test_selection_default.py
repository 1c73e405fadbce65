"""A selection's default is the setting a plain run of the method on the benchmark uses (its defaults and its
recipe), found from the grid and the config alone, for sweeps and specs alike: no trial runs here."""

import pytest

from fedsim.experiments.cli import build_parser
from fedsim.experiments.selection import plain_config, select
from fedsim.experiments.sweep import default_setting, selection_keys
from fedsim.experiments.sweep_grid import spec_from_args

ISSUE_SWEEP = [
    "sweep",
    "--methods",
    "feddann",
    "--seeds",
    "37",
    "--set",
    "data.target=usps",
    "--set",
    "method.lambda_domain=0.01,0.1,1",
    "--select",
    "entropy,mano",
]


def _records(lambdas, method="feddann"):
    """One finished trial per lambda; the oracle and both scores favour the smallest lambda."""
    return [
        {
            "trial_id": f"t{i}",
            "status": "finished",
            "params": {"method": method, "local_epochs": 1, "seed": 37, "method.lambda_domain": value},
            "target_accuracy": 0.7 - 0.1 * i,
            "mean_source_accuracy": 0.9,
            "summary": {"score_entropy": -0.1 * (i + 1), "score_mano": 0.5 - 0.1 * i},
        }
        for i, value in enumerate(lambdas)
    ]


def test_the_issues_sweep_reports_lambda_1_as_the_default():
    spec = spec_from_args(build_parser().parse_args(ISSUE_SWEEP))
    group_by, candidates = selection_keys(spec)
    assert (group_by, candidates) == (["method"], ["local_epochs", "method.lambda_domain"])
    default = default_setting(spec, candidates)
    assert default({"method": "feddann"}) == {"local_epochs": 1, "method.lambda_domain": 1.0}  # the papers' lambda
    (row,) = select(_records([0.01, 0.1, 1]), ["entropy", "mano"], group_by, candidates, default)
    assert row.default.params == {"local_epochs": 1, "method.lambda_domain": 1}
    assert row.default.gap == pytest.approx(0.2)
    assert row.picks["entropy"].label == "local_epochs=1, method.lambda_domain=0.01" == row.oracle.label


def test_a_grid_without_the_default_says_so_in_one_line():
    argv = [a if a != "method.lambda_domain=0.01,0.1,1" else "method.lambda_domain=0.01,0.1" for a in ISSUE_SWEEP]
    spec = spec_from_args(build_parser().parse_args(argv))
    (row,) = select(
        _records([0.01, 0.1]),
        ["entropy"],
        ["method"],
        ["local_epochs", "method.lambda_domain"],
        default_setting(spec, ["local_epochs", "method.lambda_domain"]),
    )
    assert row.default is None
    assert row.notes == ["the default (local_epochs=1, method.lambda_domain=1.0) is not in the grid"]


def test_the_default_takes_the_recipe_of_the_benchmark_not_the_sweeps_config(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("method: {name: feddann, lambda_domain: 0.3}\ndata: {benchmark: amazon_review, target: books}\n")
    argv = ["sweep", "--config", str(config), "--methods", "feddann,fedmmd", "--set", "method.lr=0.01,0.05"]
    spec = spec_from_args(build_parser().parse_args(argv))
    default = default_setting(spec, ["method.lr"])
    assert default({"method": "feddann"}) == {"method.lr": 0.05}
    plain = plain_config("feddann", {"benchmark": "amazon_review", "target": "books"})
    assert plain.method.params.lambda_domain == 0.1  # the recipe on Amazon, not the config file's 0.3
