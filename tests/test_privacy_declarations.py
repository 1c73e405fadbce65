"""Each method declares its exchanges next to its code (``privacy_exchanges``) or why privacy cannot apply to it
(``privacy_refusal``), and fedsim.privacy reads the declaration: a plugin inherits its base's, a classmethod or a
refusal of its own is read too, a method declaring nothing is refused in one line naming what to declare, and
docs/privacy.md's disclosure table is what the declarations generate."""

import sys
import textwrap

import pytest

from fedsim.api import run_experiment
from fedsim.config import load_config
from fedsim.errors import UserError
from fedsim.experiments.cli import main
from fedsim.privacy import method_exchanges
from fedsim.privacy.exchanges import SOURCES, TARGETS, WEIGHTED, Exchanges, Stage, declaring_class, supported_methods
from fedsim.registry import METHODS
from tools.docs.privacy_disclosure import PAGE, page_section, section

ON = ["privacy.noise_multiplier=1.0", "privacy.clip=1.0"]
PLUGINS = textwrap.dedent(
    '''
    from fedsim.methods.alignment.feddann import FedDANN
    from fedsim.methods.base import SingleExchange
    from fedsim.methods.centralized import Centralized
    from fedsim.methods.fedavg import FedAvg
    from fedsim.methods.fedprox import FedProx
    from fedsim.privacy.exchanges import one_fit


    class MyProx(FedProx):
        """FedProx under another name: it declares nothing of its own."""


    class MyDANN(FedDANN):
        """FedDANN under another name."""


    class Silent(SingleExchange):
        """A method that declares nothing."""


    class RawRows(FedAvg):
        """A FedAvg that says why privacy cannot apply to it."""

        privacy_refusal = "sends its raw rows to the server"


    class ByClassmethod(SingleExchange):
        @classmethod
        def privacy_exchanges(cls, config):
            return one_fit(config)


    class MyCentralized(Centralized):
        """A centralized reference under another name."""
    '''
)
BUILT_IN = ["fada", "fedavg", "fedbn", "feddadil", "feddann", "fedmmd", "fedprox", "fedrep"]


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "declared_plugins.py").write_text(PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "declared_plugins"
    sys.modules.pop("declared_plugins", None)


def _config(toy_overrides, method, *extra):
    return load_config(None, toy_overrides + ["run.backend=local", f"method.name={method}", *ON, *extra])


def test_every_built_in_declares_its_exchanges_or_why_privacy_cannot_apply():
    assert supported_methods() == BUILT_IN
    assert all(declaring_class(METHODS.get(name)) is not None for name in METHODS.builtin_names())


def test_a_subclass_of_fedprox_runs_private_with_fedprox_s_numbers(toy_overrides, plugins):
    mine = run_experiment(_config(toy_overrides, f"{plugins}:MyProx"))
    built_in = run_experiment(_config(toy_overrides, "fedprox"))
    assert mine.history[-1]["privacy_epsilon"] > 0
    for key in ("target_accuracy", "privacy_epsilon", "privacy_noise_multiplier"):
        assert mine.summary[key] == built_in.summary[key], key


def test_a_subclass_of_feddann_inherits_its_stages(toy_overrides, plugins):
    mine = method_exchanges(_config(toy_overrides, f"{plugins}:MyDANN"))
    built_in = method_exchanges(_config(toy_overrides, "feddann"))
    assert mine.stages == built_in.stages and mine.operations == ("features", "fit")
    assert mine.calls(1, None) == (("features", False), ("fit", False))


def test_a_method_that_declares_nothing_is_refused_in_one_line_naming_privacy_exchanges(
    toy_overrides, plugins, tmp_path, capsys
):
    out = tmp_path / "run"
    sets = [arg for override in toy_overrides + ON for arg in ("--set", override)]
    code = main(["run", "-q", "--backend", "local", "--out", str(out), *sets, "--method", f"{plugins}:Silent"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and not out.exists(), err
    assert f"privacy cannot apply to method '{plugins}:Silent'" in err
    assert "declare them as the class attribute privacy_exchanges = staticmethod(" in err
    assert err.strip().endswith("use one of " + ", ".join(BUILT_IN)), err


def test_a_refusal_is_read_from_the_method_or_its_base(toy_overrides, plugins):
    with pytest.raises(UserError) as refused:
        _config(toy_overrides, f"{plugins}:RawRows")
    assert str(refused.value) == (
        f"privacy cannot apply to method '{plugins}:RawRows': it sends its raw rows to the server; use one of "
        + ", ".join(BUILT_IN)
    )
    with pytest.raises(UserError, match="it is a centralized reference: its 'upload' stage sends each client's"):
        _config(toy_overrides, f"{plugins}:MyCentralized")


def test_a_classmethod_declaration_is_read(toy_overrides, plugins):
    exchanges = method_exchanges(_config(toy_overrides, f"{plugins}:ByClassmethod"))
    assert exchanges.operations == ("fit",) and exchanges.stage("fit").combined == WEIGHTED
    assert exchanges.calls(1, None) == (("fit", True),) and exchanges.record_refusal() == ""


def test_a_stage_of_records_is_refused_under_record_unless_a_mechanism_bounds_them():
    fit = Stage("fit", SOURCES, "a model update", WEIGHTED)
    rows = Stage("features", TARGETS, "features", "each", records="one feature vector per row")

    def exchanges(*stages):
        return Exchanges(stages, lambda rnd, method: (), record_level="")

    assert exchanges(rows, fit).record_refusal() == (
        "its 'features' exchange sends one feature vector per row, values of single records that DP-SGD does not bound"
    )
    bounded = Stage(**{**rows.__dict__, "record_mechanism": "each row clipped and noised on the sender"})
    assert exchanges(bounded, fit).record_refusal() == ""
    assert Exchanges((fit,), lambda rnd, method: ()).record_refusal().startswith("its local update is not declared")


def test_the_disclosure_section_of_docs_privacy_is_what_the_declarations_generate():
    assert page_section(PAGE.read_text()) == section(), "run: python -m tools.docs.privacy_disclosure"
