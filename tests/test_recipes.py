"""Recipes (fedsim/recipes.py): a plain run is the table's run; defaults < recipe < config file < --set and flags;
run.recipe=none; the specs rely on the recipes instead of repeating them; fedsim list and the docs show them."""

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from fedsim.api import make_config
from fedsim.config import load_config, parse_override, read_yaml
from fedsim.errors import UserError
from fedsim.experiments.cli import build_parser, config_from_args, main
from fedsim.experiments.reproduce_spec import SPECS_DIR, PaperSpec, load_spec, to_sweep
from fedsim.experiments.sweep_grid import VARIANT_KEY
from fedsim.recipes import BUILT_IN, Recipe, Setting, recipe_for, recipes, register, table

ROOT = Path(__file__).resolve().parent.parent
SPEC_FILES = sorted(SPECS_DIR.glob("*.yaml")) + sorted((SPECS_DIR / "results").glob("*.yaml"))


def _cli(argv):
    return config_from_args(build_parser().parse_args(["run", *argv]))


def _spec_trial(spec_file: Path, variant: str):
    spec = PaperSpec(spec_file.stem, read_yaml(spec_file), spec_file.parent)
    return to_sweep(spec).config_for({VARIANT_KEY: variant, "run.seed": 0})


@pytest.mark.parametrize(
    "spec_file, variant, argv",
    [
        # the issue's command: the CWRU protocol's FedDaDiL and DaDiL rows
        (
            "results/feddadil-cwru.yaml",
            "feddadil@cwru_1hp.1hp",
            ["--method", "feddadil", "--benchmark", "cwru", "--sources", "2hp,3hp", "--target", "1hp"],
        ),
        (
            "results/feddadil-cwru.yaml",
            "dadil@cwru_2hp.2hp",
            ["--method", "dadil", "--benchmark", "cwru", "--sources", "1hp,3hp", "--target", "2hp"],
        ),
        (
            "results/feddadil-cwru.yaml",
            "feddann@cwru_3hp.3hp",
            ["--method", "feddann", "--benchmark", "cwru", "--sources", "1hp,2hp", "--target", "3hp"],
        ),
        ("results/baselines-real.yaml", "fedmmd@amazon.dvd", ["--method", "fedmmd", "--benchmark", "amazon_review"]),
        (
            "results/feddadil-office.yaml",
            "feddadil@office_surf.webcam",
            ["--method", "feddadil", "--benchmark", "office_caltech", "--target", "webcam"],
        ),
        ("results/baselines-images.yaml", "fedrep@office_images.dslr", ["--method", "fedrep", "--benchmark", "images"]),
    ],
)
def test_a_plain_command_builds_the_spec_trials_config(spec_file, variant, argv):
    """``fedsim run --method M --benchmark B`` (the spec's data keys and housekeeping aside) builds the config of the
    spec's trial: the recipe supplies what the spec used to set."""
    path = SPECS_DIR / spec_file
    trial = _spec_trial(path, variant)
    spec = load_spec(None, str(path))
    extra = [*spec.settings]  # the spec's common settings (tensorboard, rounds of the board), as --set
    bench = spec.benchmarks[variant.split("@")[1].split(".")[0]]
    extra += [s for s in bench.get("set", []) if not s.startswith("data.sources=")]
    run = variant.split("@")[0]
    extra += [s for s in _variant_settings(spec, run, variant.split("@")[1].split(".")[0]) if "method.name=" not in s]
    argv = [*argv, *[a for s in extra for a in ("--set", s)], "--set", "run.progress=false"]
    if "--target" not in argv:
        argv += ["--target", trial.data.target]
    plain = _cli(argv)
    assert plain == trial
    assert plain.run.recipe == "auto"


def test_the_issues_plain_cwru_command_runs_the_tables_encoder_stage():
    config = _cli(["--method", "dadil", "--benchmark", "cwru", "--sources", "2hp,3hp", "--target", "1hp"])
    assert (config.method.params.encoder_rounds, config.method.params.encoder_epochs) == (10, 5)
    assert (config.model.hidden, config.run.rounds, config.run.eval_every) == (256, 50, 1000)
    assert make_config(method="feddadil", benchmark="cwru", target="1hp").run.rounds == 60  # fedsim.run's path


def test_precedence_defaults_recipe_config_file_then_set_and_flags(tmp_path):
    recipe = recipe_for("feddadil", "cwru", {})
    assert recipe.values["run.rounds"] == 60
    bare = load_config(None, values={"method.name": "feddadil", "data.benchmark": "cwru", "run.recipe": "none"})
    assert (bare.run.rounds, bare.model.hidden, bare.run.eval_every) == (50, 128, 10)  # the method's config_defaults
    file = tmp_path / "c.yaml"
    file.write_text(
        yaml.safe_dump({"method": {"name": "feddadil"}, "data": {"benchmark": "cwru"}, "run": {"rounds": 7}})
    )
    from_file = _cli(["--config", str(file)])
    assert (from_file.run.rounds, from_file.model.hidden) == (7, 256)  # the file over the recipe, the recipe elsewhere
    assert _cli(["--config", str(file), "--set", "run.rounds=9"]).run.rounds == 9
    assert _cli(["--config", str(file), "--rounds", "11"]).run.rounds == 11
    assert _cli(["--config", str(file), "--set", "model.hidden=64"]).model.hidden == 64
    none = _cli(["--config", str(file), "--set", "run.recipe=none"])
    assert (none.run.rounds, none.model.hidden, none.method.params.encoder_rounds) == (
        7,
        128,
        bare.method.params.encoder_rounds,
    )
    # a recipe conditioned on a benchmark option applies only there
    assert make_config(method="feddadil", benchmark="tep", set={"data.variant": "snapshot"}).model.hidden == 256
    assert make_config(method="feddadil", benchmark="tep", set={"data.variant": "windows"}).model.hidden == 128
    # a pair without a recipe, and a full config read back, are left as they are
    assert make_config(method="feddann", benchmark="digits").method.params.lambda_domain == 1.0
    full = make_config(method="feddann", benchmark="amazon_review", target="books")
    assert full.method.params.lambda_domain == 0.1
    assert make_config(method="feddann", benchmark="cwru").method.params.lambda_domain == 1.0
    assert load_config(None, base=full.to_dict()) == full


def test_a_bad_recipe_choice_is_one_line():
    with pytest.raises(UserError, match=r"^run.recipe must be 'auto' .* or 'none' .*, got 'off'$"):
        make_config(method="feddadil", benchmark="cwru", set={"run.recipe": "off"})


def test_every_recipe_builds_a_valid_config_and_names_its_sources():
    for recipe in BUILT_IN:
        data = {"benchmark": recipe.benchmark, "target": "t", **{k.split(".")[1]: v for k, v in recipe.when}}
        config = load_config(None, base={"data": data}, values={"method.name": recipe.method})
        flat = {f"{s}.{k}": v for s, keys in config.to_dict().items() for k, v in keys.items()}
        for s in recipe.settings:
            assert flat[s.key] == s.value, (recipe.name, s.key)
            assert len(s.source) > 10 and recipe.protocol, recipe.name
    with pytest.raises(ValueError, match="exists already"):
        register(copy.copy(BUILT_IN[0]))
    with pytest.raises(ValueError, match="bad key 'method.name'"):
        Recipe("fedavg", "digits", (Setting("method.name", "x", "y"),))


def _variant_settings(spec: PaperSpec, run: str, bench: str) -> list[str]:
    """The settings a spec's run gives on a benchmark: the run's own and the benchmark's run_set for it."""
    return list(spec.runs[run].get("set", [])) + list((spec.benchmarks[bench].get("run_set") or {}).get(run, []))


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: str(p.relative_to(SPECS_DIR)))
def test_no_spec_run_repeats_its_recipe(path):
    """A run's setting whose key its recipe holds must change the trial (it overrides a config file's value or the
    recipe's); one that changes nothing repeats the recipe and belongs there alone."""
    spec = load_spec(None, str(path))
    sweep = to_sweep(spec)
    for name, run, bench, _ in spec.variants():
        variant = sweep.variants[name]
        config = sweep.config_for({VARIANT_KEY: name, "run.seed": 0})
        recipe = recipe_for(config.method.name, config.data.benchmark, config.to_dict()["data"])
        for text in _variant_settings(spec, run, bench):
            (section, key), _ = parse_override(text)
            if recipe is None or f"{section}.{key}" not in recipe.values:
                continue
            trimmed = copy.deepcopy(variant)
            trimmed["overrides"].remove(text)
            sweep.variants[name] = trimmed
            try:
                assert sweep.config_for({VARIANT_KEY: name, "run.seed": 0}) != config, (name, text)
            finally:
                sweep.variants[name] = variant


def test_fedsim_list_shows_each_recipe_with_its_source(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    listing = out[out.index("recipes (") :]
    for recipe in recipes():
        assert f"  {recipe.name}: the protocol of {recipe.protocol}" in listing
        for s in recipe.settings:
            assert f"    {s.key}={s.value}  ({s.source})" in listing


DOC_PAGES = {
    "feddadil.md": ("feddadil", "dadil"),
    "baselines.md": ("feddann", "fedmmd", "fedrep"),
    "fada.md": ("fada",),
    "fedod.md": ("fedod",),
}


@pytest.mark.parametrize("page, methods", DOC_PAGES.items())
def test_each_method_page_shows_its_recipes(page, methods):
    """Each method page's Recipes section holds :func:`fedsim.recipes.table` of its methods' recipes (regenerate
    it with ``python -c "from fedsim.recipes import table, recipes; print(table(r for m in (...) for r in
    recipes(m)))"``), or says the method has none."""
    text = (ROOT / "docs" / page).read_text()
    assert "\n## Recipes\n" in text
    rows = [r for m in methods for r in recipes(m)]
    section = text[text.index("\n## Recipes\n") :]
    if rows:
        assert table(rows) in section
    else:
        assert "no recipe" in section.split("\n## ")[1]


def test_a_recipe_is_a_frozen_dataclass():
    assert dataclasses.is_dataclass(Recipe) and Recipe.__dataclass_params__.frozen


@pytest.mark.parametrize("variant", [None, "default", "windows"])
def test_tep_windows_recipes_match_the_windows_and_their_alias(variant):
    """The windows variant (also "default", its alias, and the benchmark's default) gets the windows recipes: the
    authors' source-only training for centralized, the authors' CNN (128 features) trained by FedAvg one epoch a
    round for 10 rounds, then their 50 FedDaDiL rounds / 40 DaDiL iterations; the snapshot recipe elsewhere."""
    data = {} if variant is None else {"variant": variant}
    sets = {} if variant is None else {"data.variant": variant}
    feddadil = make_config(method="feddadil", benchmark="tep", set=sets)
    params = feddadil.method.params
    assert (feddadil.run.rounds, feddadil.run.eval_every, feddadil.model.hidden) == (60, 1000, 128)
    assert (params.encoder_rounds, params.encoder_epochs) == (10, 1)
    assert feddadil.data.normalization != "per-domain"  # the benchmark scales each mode itself (data.scaling)
    assert make_config(method="dadil", benchmark="tep", set=sets).run.rounds == 50
    central = make_config(method="centralized", benchmark="tep", set=sets)
    assert central.run.rounds == 70
    assert recipe_for("centralized", "tep", data).values == {
        "method.optimizer": "adam",
        "method.lr": 1e-4,
        "method.weight_decay": 0.0,
        "method.batch_size": 256,
        "method.local_epochs": 1,
        "run.rounds": 70,
    }
    assert recipe_for("feddadil", "tep", data).name == "feddadil on tep (data.variant=windows)"


def test_tep_recipes_are_kept_apart_by_variant():
    assert recipe_for("feddadil", "tep", {"variant": "snapshot"}).values["model.hidden"] == 256
    assert recipe_for("centralized", "tep", {"variant": "snapshot"}) is None
    assert recipe_for("feddadil", "tep", {"variant": "snapshot-hard"}) is None
    snapshot = make_config(method="centralized", benchmark="tep", set={"data.variant": "snapshot"})
    assert snapshot.run.rounds == 20  # the library's default: no recipe on the snapshots
