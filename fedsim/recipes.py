"""Recipes: the settings a paper's protocol uses for one (method, benchmark) pair, each with its source.

A plain ``fedsim run --method feddadil --benchmark cwru`` (or ``fedsim.run(method=..., benchmark=...)``, a sweep's
trial, a spec's trial) runs what the table ran: :func:`apply_recipe` fills every key of the pair's recipe that the
config leaves unset. Precedence, lowest first: the library's defaults (the dataclasses, a method's
``config_defaults``), the recipe, the config file, ``--set`` and the named flags. ``--set run.recipe=none`` turns
recipes off (the bare defaults). A setting's source is the paper, the authors' script, or a rule on the sources
(never target accuracy); where fedsim departs from the paper, the method's docs page says why (Deviations).

A user's package adds its own with :func:`register` (a method or benchmark of its own, or another pair).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from fedsim.errors import UserError

AUTO, NONE = "auto", "none"
"""The values of ``run.recipe``: apply the (method, benchmark) pair's recipe, or none (the bare defaults)."""
FIXED_KEYS = ("method.name", "data.benchmark", "data.target", "run.recipe")
"""Keys a recipe never sets: they choose the recipe or the run."""


@dataclass(frozen=True)
class Setting:
    """One key of a recipe: its dotted config key, its value and where the value comes from."""

    key: str
    value: Any
    source: str
    """Where the value comes from: the paper, the authors' script or a rule on the sources, with a short citation."""


@dataclass(frozen=True)
class Recipe:
    """The settings of one (method, benchmark) pair's protocol; ``when`` restricts it to a benchmark variant."""

    method: str
    benchmark: str
    settings: tuple[Setting, ...]
    when: tuple[tuple[str, Any], ...] = ()
    """``(("data.variant", "snapshot"),)``: the recipe applies only where these benchmark options (given, else their
    defaults; an alias the benchmark's ``Options.ALIASES`` names counts as its canonical value) have these values."""
    protocol: str = ""
    """The table it reproduces (a results directory or a spec)."""

    def __post_init__(self):
        for s in self.settings:
            if s.key.count(".") != 1 or s.key in FIXED_KEYS:
                raise ValueError(f"recipe {self.name}: bad key {s.key!r} (section.key, never {', '.join(FIXED_KEYS)})")
        if len({s.key for s in self.settings}) != len(self.settings):
            raise ValueError(f"recipe {self.name} sets a key twice")

    @property
    def name(self) -> str:
        when = ", ".join(f"{k}={v}" for k, v in self.when)
        return f"{self.method} on {self.benchmark}" + (f" ({when})" if when else "")

    @property
    def values(self) -> dict[str, Any]:
        """Dotted key -> value."""
        return {s.key: s.value for s in self.settings}


def _s(key: str, value: Any, source: str) -> Setting:
    return Setting(key, value, source)


# ---- the sources, written once ---------------------------------------------------------------------------------
_EVAL_ONCE = "the authors evaluate after the last round; fedsim's default evaluates every 10 rounds (cost only)"
_ENCODER = "authors' CWRU script: an MLP trained on the sources, then frozen (fedsim: FedAvg rounds x local epochs)"
_WIDTH = "authors' CWRU script: 256 encoder features"
_CWRU_FEATURES = "authors' CWRU script: its standardization line, on the encoded features, is commented out"
_CWRU_ALIGN = "the papers' lambda_domain = 1 (Ganin et al.; Long et al.)"
_CWRU_ROUNDS = (
    "rule on the sources (docs/benchmarks.md, cwru): 20 rounds leave the sources at 0.71-0.77 under the lr anneal, "
    "100 take them to 0.998-1.000"
)
_TEP_ENCODER = "as on CWRU (authors' scripts): an encoder trained on the sources, frozen, 256 features"
_TEP_SCALING = "authors' TEP build: each mode scaled by its own statistics"
_TEP_CNN = (
    "fedsim's: the authors' CNN (their source-only notebook, 128 features) trained on the sources by FedAvg, one epoch "
    "a round as FedAvg's TEP runs, then frozen"
)
_TEP_ADAM = "authors' multi-source source-only notebook (tep-domain-adaptation): Adam, learning rate 1e-4, no L2"
_TEP_EPOCHS = "authors' multi-source source-only notebook: batches of 256, 70 epochs (one a round)"
_FED_ROUNDS = "paper / parse_args_fed_dadil: 50 FedDaDiL rounds (n_iter), after the encoder rounds"
_CEN_ROUNDS = "authors' parse_args_dadil: 40 iterations (n_iter), after the encoder rounds"
_LAMBDA = "rule on the sources (docs/baselines.md): of 1, 0.3, 0.1 the smallest worst source drop against FedAvg"
_FEDREP_LR = "rule on the sources (docs/baselines.md): at FedAvg's 0.05 the representation epoch diverged"


def _dictionary(
    method: str, benchmark: str, rounds: int, rounds_source: str, protocol: str, variant: str = "", **extra
) -> Recipe:
    """FedDaDiL's or DaDiL's recipe: the rounds, one evaluation, and ``extra`` settings (key with ``__`` for
    ``.``, value, source); ``variant``: only on that ``data.variant``."""
    settings = [_s("run.rounds", rounds, rounds_source), _s("run.eval_every", 1000, _EVAL_ONCE)]
    settings += [_s(key.replace("__", "."), value, source) for key, (value, source) in extra.items()]
    when = (("data.variant", variant),) if variant else ()
    return Recipe(method, benchmark, tuple(settings), when, protocol)


def _encoder(source: str = _ENCODER, width: str = _WIDTH) -> dict:
    return {
        "method__encoder_rounds": (10, source),
        "method__encoder_epochs": (5, source),
        "model__hidden": (256, width),
    }


_CWRU = {**_encoder(), "method__feature_standardization": ("none", _CWRU_FEATURES)}


_TEP = {**_encoder(_TEP_ENCODER, _TEP_ENCODER), "data__normalization": ("per-domain", _TEP_SCALING)}
_TEP_WINDOWS = {"method__encoder_rounds": (10, _TEP_CNN), "method__encoder_epochs": (1, _TEP_CNN)}
_WINDOWS_TABLES = "results/feddadil-tep-windows"

BUILT_IN: tuple[Recipe, ...] = (
    _dictionary("feddadil", "cwru", 60, f"{_FED_ROUNDS} (10 + 50)", "results/feddadil-cwru", **_CWRU),
    _dictionary("dadil", "cwru", 50, f"{_CEN_ROUNDS} (10 + 40)", "results/feddadil-cwru", **_CWRU),
    *(
        Recipe(
            method,
            "cwru",
            (_s("method.lambda_domain", 1.0, _CWRU_ALIGN), _s("run.rounds", 100, _CWRU_ROUNDS)),
            (),
            "results/feddadil-cwru",
        )
        for method in ("feddann", "fedmmd")
    ),
    _dictionary("feddadil", "tep", 60, f"{_FED_ROUNDS} (10 + 50)", "results/feddadil (TEP rows)", "snapshot", **_TEP),
    _dictionary("dadil", "tep", 50, f"{_CEN_ROUNDS} (10 + 40)", "results/feddadil (TEP rows)", "snapshot", **_TEP),
    _dictionary("feddadil", "tep", 60, f"{_FED_ROUNDS} (10 + 50)", _WINDOWS_TABLES, "windows", **_TEP_WINDOWS),
    _dictionary("dadil", "tep", 50, f"{_CEN_ROUNDS} (10 + 40)", _WINDOWS_TABLES, "windows", **_TEP_WINDOWS),
    Recipe(
        "centralized",
        "tep",
        (
            _s("method.optimizer", "adam", _TEP_ADAM),
            _s("method.lr", 1e-4, _TEP_ADAM),
            _s("method.weight_decay", 0.0, _TEP_ADAM),
            _s("method.batch_size", 256, _TEP_EPOCHS),
            _s("method.local_epochs", 1, _TEP_EPOCHS),
            _s("run.rounds", 70, _TEP_EPOCHS),
        ),
        (("data.variant", "windows"),),
        _WINDOWS_TABLES,
    ),
    _dictionary("feddadil", "digits", 55, f"{_FED_ROUNDS} (5 + 50)", "results/feddadil (digits rows)"),
    _dictionary("dadil", "digits", 45, f"{_CEN_ROUNDS} (5 + 40)", "results/feddadil (digits rows)"),
    Recipe("feddadil", "office_caltech", (_s("run.eval_every", 1000, _EVAL_ONCE),), (), "results/feddadil-office"),
    Recipe("dadil", "office_caltech", (_s("run.eval_every", 1000, _EVAL_ONCE),), (), "results/feddadil-office"),
    *(
        Recipe(method, bench, (_s("method.lambda_domain", value, _LAMBDA),), (), board)
        for method in ("feddann", "fedmmd")
        for bench, value, board in (
            ("office_caltech", 0.1, "results/baselines-real"),
            ("amazon_review", 0.1, "results/baselines-real"),
            ("images", 0.3, "results/baselines-images"),
        )
    ),
    *(
        Recipe("fedrep", bench, (_s("method.lr", 0.01, _FEDREP_LR),), (), board)
        for bench, board in (
            ("cwru", "results/baselines-real"),
            ("office_caltech", "results/baselines-real"),
            ("amazon_review", "results/baselines-real"),
            ("images", "results/baselines-images"),
        )
    ),
)
"""fedsim's recipes, each pair's settings from its table's spec (``experiments/specs/results/``)."""

_REGISTERED: list[Recipe] = list(BUILT_IN)


def register(recipe: Recipe) -> Recipe:
    """Add a recipe (a user's own pair); one whose pair and ``when`` are already taken raises ValueError."""
    clash = [
        r for r in _REGISTERED if (r.method, r.benchmark, r.when) == (recipe.method, recipe.benchmark, recipe.when)
    ]
    if clash:
        raise ValueError(f"a recipe for {recipe.name} exists already")
    _REGISTERED.append(recipe)
    return recipe


def recipes(method: Optional[str] = None) -> list[Recipe]:
    """Every recipe (of ``method``), in the order registered."""
    return [r for r in _REGISTERED if method is None or r.method == method]


def _option(benchmark: str, data: Mapping[str, Any], key: str) -> Any:
    """A benchmark option of a config's ``data`` section (``data.variant``): given, else the ``Options`` default;
    an alias in the ``Options.ALIASES`` of the benchmark (``{"variant": {"default": "windows"}}``) as its value."""
    from fedsim.registry import BENCHMARKS

    name = key.split(".", 1)[1]
    options = getattr(BENCHMARKS.get(benchmark), "Options", None)
    defaults = {f.name: f.default for f in dataclasses.fields(options)} if options is not None else {}
    value = data[name] if name in data else defaults.get(name)
    aliases = getattr(options, "ALIASES", {}).get(name, {})
    return aliases.get(value, value) if isinstance(value, str) else value


def recipe_for(method: str, benchmark: str, data: Mapping[str, Any]) -> Optional[Recipe]:
    """The recipe of ``method`` on ``benchmark`` whose ``when`` the ``data`` section (data keys -> values) meets, or
    None."""
    for recipe in _REGISTERED:
        if (recipe.method, recipe.benchmark) == (method, benchmark):
            if all(_option(benchmark, data, key) == value for key, value in recipe.when):
                return recipe
    return None


def apply_recipe(sections: dict[str, dict], method: str, benchmark: str) -> Optional[Recipe]:
    """Fill the keys of the recipe of ``method`` on ``benchmark`` that ``sections`` (a config's raw sections: the
    file, ``--set``, the flags) leave unset, in place; returns the recipe applied (None: none, or ``run.recipe:
    none``)."""
    choice = sections.get("run", {}).get("recipe", AUTO)
    if choice not in (AUTO, NONE):
        raise UserError(
            f"run.recipe must be {AUTO!r} (the method and benchmark's recipe) or {NONE!r} (the bare defaults), "
            f"got {choice!r}"
        )
    recipe = recipe_for(method, benchmark, sections.get("data", {})) if choice == AUTO else None
    for key, value in (recipe.values if recipe else {}).items():
        section, name = key.split(".")
        sections.setdefault(section, {}).setdefault(name, value)
    return recipe


def applied(config) -> Optional[Recipe]:
    """The recipe an ExperimentConfig's method and data match (None under ``run.recipe: none``)."""
    if config.run.recipe == NONE:
        return None
    return recipe_for(config.method.name, config.data.benchmark, config.to_dict()["data"])


def table(rows: Iterable[Recipe]) -> str:
    """A markdown table of recipes: pair, key, value and source (what ``docs/<method>.md`` shows)."""
    out = ["| method on benchmark | setting | source |", "|---|---|---|"]
    for recipe in rows:
        for s in recipe.settings:
            out.append(f"| {recipe.name} | `{s.key}={s.value}` | {s.source} |")
    return "\n".join(out)
