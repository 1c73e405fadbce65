"""The CWRU loader on tiny recordings the tests write: both namings, class choice (ten classes or the nine faults),
the authors' split (sources whole, target folds), one-line refusals."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.io

from fedsim.config import DataConfig, data_config
from fedsim.data.benchmarks.cwru import CLASSES, FILE_NUMBERS, FOLDS, CWRUBenchmark, window_starts
from fedsim.errors import UserError

RATE = 12000.0
FREQS = {"normal": 600.0, "inner_007": 1500.0, "outer_007": 3000.0}


def _signal(cls: str, load: int, n: int = 5000) -> np.ndarray:
    t = np.arange(n) / RATE
    rng = np.random.default_rng(load)
    return (np.sin(2 * np.pi * FREQS[cls] * t) + 0.05 * rng.normal(size=n)).reshape(-1, 1)


def _write_cwru(root, loads=("1hp", "2hp", "3hp"), numbered=False, classes=tuple(FREQS)):
    """One recording per class and load; ``numbered``: named as shipped, ``<class>_<number>.mat``."""
    number = 98
    for load in loads:
        (root / load).mkdir(exist_ok=True)
        for cls in classes:
            name = f"{cls}_{number}.mat" if numbered else f"{cls}.mat"
            scipy.io.savemat(
                str(root / load / name),
                {
                    f"X{number:03d}_DE_time": _signal(cls, int(load[0])),
                    f"X{number:03d}_FE_time": _signal(cls, 9),
                    f"X{number:03d}RPM": np.array([[1772]]),
                },
            )
            number += 1


def _bench(root, **kwargs) -> CWRUBenchmark:
    return CWRUBenchmark(data_config(benchmark="cwru", root=str(root), **kwargs))


def _windows(dom) -> tuple[np.ndarray, np.ndarray]:
    """Every window of a domain once: a source's test split is its training split (its whole data), the target's
    two splits are disjoint."""
    if dom.train_x.shape == dom.test_x.shape and np.array_equal(dom.train_x, dom.test_x):
        return dom.train_x, dom.train_y
    return np.concatenate([dom.train_x, dom.test_x]), np.concatenate([dom.train_y, dom.test_y])


def test_cwru_windows_and_fft_features(tmp_path):
    _write_cwru(tmp_path)
    bench = _bench(tmp_path)
    assert bench.domains() == ["1hp", "2hp", "3hp"]
    assert bench.classes == ("normal", "inner_007", "outer_007")  # the fixed class order, present ones only
    dom = bench.load("2hp")
    assert dom.num_classes == 3 and dom.input_shape == (512,)
    x, y = _windows(dom)
    assert len(y) == 3 * (5000 // 1024)  # non-overlapping windows
    for label, freq in enumerate(FREQS.values()):  # the spectrum peaks at the class's frequency
        assert np.all(np.abs(np.argmax(x[y == label], axis=1) - freq / RATE * 1024) <= 1)
    raw = _bench(tmp_path, variant="raw", samples_per_class=10).load("1hp")
    assert raw.input_shape == (1024,) and len(raw.train_y) + len(raw.test_y) == 30  # overlapping, evenly spread
    np.testing.assert_array_equal(window_starts(5000, 1024, 3), [0, 1988, 3976])


def test_cwru_files_named_as_shipped_read_their_numbered_variable(tmp_path):
    _write_cwru(tmp_path, numbered=True)
    plain = tmp_path / "plain"
    plain.mkdir()
    _write_cwru(plain)
    numbered, renamed = _bench(tmp_path).load("3hp"), _bench(plain).load("3hp")
    np.testing.assert_array_equal(numbered.train_x, renamed.train_x)  # same recordings, same windows
    assert _bench(tmp_path).classes == ("normal", "inner_007", "outer_007")


def test_cwru_several_signals_need_the_number(tmp_path):
    _write_cwru(tmp_path, loads=("1hp", "2hp"))
    both = {"X098_DE_time": _signal("normal", 1), "X099_DE_time": _signal("normal", 2, n=3000)}
    scipy.io.savemat(str(tmp_path / "2hp" / "normal.mat"), both)
    with pytest.raises(UserError, match="normal_<number>|<class>_<number>"):
        _bench(tmp_path).load("2hp")
    (tmp_path / "2hp" / "normal.mat").rename(tmp_path / "2hp" / "normal_99.mat")
    dom = _bench(tmp_path).load("2hp")
    assert np.bincount(_windows(dom)[1])[0] == 3000 // 1024  # X099 was used


def test_cwru_default_classes_are_those_every_chosen_load_has(tmp_path, caplog):
    """As the public copies ship: normal only at 0hp, so the default leaves it out and says so once."""
    _write_cwru(tmp_path, loads=("0hp",), numbered=True)
    _write_cwru(tmp_path, loads=("1hp", "2hp"), numbered=True, classes=("inner_007", "outer_007"))
    with caplog.at_level(logging.INFO, logger="fedsim.data.benchmarks.cwru"):
        bench = _bench(tmp_path, target="2hp", loads=("0hp", "1hp", "2hp"))
        assert bench.classes == ("inner_007", "outer_007")
        assert bench.load("0hp").num_classes == 2 and bench.load("1hp").num_classes == 2
    lines = [r.getMessage() for r in caplog.records if "classes" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("cwru: 2 classes common to loads 0hp, 1hp, 2hp, not the authors' 10")
    assert "normal missing (1hp/normal_98.mat, 2hp/normal_99.mat)" in lines[0]
    # Loads left out of the task (target + sources) do not restrict the classes.
    assert _bench(tmp_path, target="0hp", sources=("1hp",)).classes == ("inner_007", "outer_007")
    (tmp_path / "more").mkdir()
    _write_cwru(tmp_path / "more", loads=("0hp", "3hp"))
    _write_cwru(tmp_path / "more", loads=("1hp",), classes=("normal", "inner_007"))
    assert _bench(tmp_path / "more", target="3hp", sources=("0hp",)).classes == tuple(FREQS)


def test_cwru_domains_are_the_authors_three_loads_and_the_named_ones(tmp_path):
    """The authors' A, B, C are 1hp, 2hp, 3hp; 0hp is a domain only when the task names it."""
    _write_cwru(tmp_path, loads=("0hp", "1hp", "2hp", "3hp"))
    assert CWRUBenchmark.default_target == "1hp"
    assert _bench(tmp_path).domains() == ["1hp", "2hp", "3hp"]
    assert _bench(tmp_path, target="2hp").domains() == ["1hp", "2hp", "3hp"]
    assert _bench(tmp_path, target="0hp").domains() == ["0hp", "1hp", "2hp", "3hp"]
    assert _bench(tmp_path, target="3hp", sources=("0hp",)).domains() == ["0hp", "1hp", "2hp", "3hp"]
    assert _bench(tmp_path, loads=("3hp", "0hp")).domains() == ["0hp", "3hp"]
    with pytest.raises(UserError, match=r"load 0hp is not in the task \(loads 1hp, 2hp, 3hp\).*data.loads") as info:
        _bench(tmp_path).load("0hp")
    assert "\n" not in str(info.value)


def test_cwru_default_run_builds_the_authors_task_without_target_statistics(tmp_path):
    """``fedsim run --benchmark cwru`` at its defaults: target 1hp, sources 2hp and 3hp, the raw FFT magnitudes
    (no standardization, so no client's statistics, the target's least of all, touch its inputs); per-domain
    standardization stays an option and scales each client by its own training split."""
    from fedsim.config import build_config
    from fedsim.data.scenario import build_federation, get_domain, resolve_normalization

    _write_cwru(tmp_path, loads=("0hp", "1hp", "2hp", "3hp"))
    config = build_config({"data": {"benchmark": "cwru", "root": str(tmp_path)}})
    assert config.data.target == "1hp" and resolve_normalization(config.data) == "none"
    federation = build_federation(config.data)
    assert federation.domains == ("1hp", "2hp", "3hp") and federation.target == "1hp"
    assert federation.num_classes == 3 and federation.input_shape == (512,)
    target = get_domain(config.data, "1hp")
    signal = _signal("normal", 1)[:1024, 0]
    expected = np.abs(np.fft.rfft(signal - signal.mean()))[:512] * (2.0 / 1024)
    rows = np.concatenate([target.train_x, target.test_x])
    assert np.min(np.abs(rows - expected.astype(np.float32)).max(axis=1)) < 1e-6  # a window, as computed
    assert abs(float(rows.mean())) > 1e-3 and rows.min() >= 0.0  # magnitudes, not centred by the target's mean

    from fedsim.data.normalization import normalize_domains

    per_domain = normalize_domains({"1hp": (target.train_x, target.test_x)}, "per-domain")["1hp"][0]
    np.testing.assert_allclose(per_domain.mean(axis=0), 0.0, atol=1e-4)
    spread = per_domain.std(axis=0)
    assert np.all((np.abs(spread - 1.0) < 1e-3) | (spread < 1e-6))


def test_cwru_window_option(tmp_path):
    _write_cwru(tmp_path)
    dom = _bench(tmp_path, window=2048).load("1hp")
    assert dom.input_shape == (1024,) and len(dom.train_y) + len(dom.test_y) == 3 * (5000 // 2048)
    x, y = np.concatenate([dom.train_x, dom.test_x]), np.concatenate([dom.train_y, dom.test_y])
    assert np.all(np.abs(np.argmax(x[y == 2], axis=1) - 3000 / RATE * 2048) <= 1)  # outer_007 at 3 kHz
    with pytest.raises(UserError, match="data.window must be an integer of at least 8"):
        _bench(tmp_path, window=4)
    with pytest.raises(UserError, match="at least one window of 8192"):
        _bench(tmp_path, window=8192).load("1hp")


@pytest.mark.parametrize(
    "loads, message",
    [
        (("1hp", "4hp"), "unknown cwru load '4hp'"),
        (("1hp", "1hp"), "names 1hp more than once"),
        (("2hp",), "a task needs a source and a target"),
        (("0hp", "1hp"), "load 0hp is named \\(data.loads\\) but 0hp/ is not under"),
    ],
)
def test_cwru_load_choice_refusals(tmp_path, loads, message):
    _write_cwru(tmp_path)
    with pytest.raises(UserError, match=message) as info:
        _bench(tmp_path, loads=loads).domains()
    assert "\n" not in str(info.value)


def test_cwru_too_few_task_loads(tmp_path):
    _write_cwru(tmp_path, loads=("0hp", "1hp"))
    with pytest.raises(UserError, match=r"the task has 1 load \(1hp\).*data.loads"):
        _bench(tmp_path).domains()
    assert _bench(tmp_path, target="0hp").domains() == ["0hp", "1hp"]
    with pytest.raises(UserError, match="load 3hp is named \\(--target or data.sources\\)"):
        _bench(tmp_path, target="3hp").domains()


def test_cwru_named_classes_in_the_order_given(tmp_path):
    _write_cwru(tmp_path)
    bench = _bench(tmp_path, classes=("outer_007", "normal"))
    assert bench.classes == ("outer_007", "normal")
    dom = bench.load("1hp")
    x, y = np.concatenate([dom.train_x, dom.test_x]), np.concatenate([dom.train_y, dom.test_y])
    assert dom.num_classes == 2 and np.all(np.abs(np.argmax(x[y == 0], axis=1) - 3000 / RATE * 1024) <= 1)


@pytest.mark.parametrize(
    "classes, message",
    [
        (("normal", "ball_07"), "unknown cwru class 'ball_07': did you mean 'ball_007'"),
        (("normal", "normal"), "names normal more than once"),
        (("normal",), "at least two"),
        (("normal", "inner_007"), "names normal but load 2hp has no normal.mat or normal_<number>.mat"),
    ],
)
def test_cwru_class_choice_refusals(tmp_path, classes, message):
    _write_cwru(tmp_path)
    (tmp_path / "2hp" / "normal.mat").unlink()
    with pytest.raises(UserError, match=message) as info:
        _bench(tmp_path, classes=classes).domains()
    assert "\n" not in str(info.value)
    if "load 2hp" in message:  # how to fix it: the classes every load has, or leave the load out
        assert "inner_007, outer_007" in str(info.value) and "data.sources" in str(info.value)


def test_cwru_fewer_than_two_common_classes(tmp_path):
    _write_cwru(tmp_path, loads=("1hp",), classes=("normal", "inner_007"))
    _write_cwru(tmp_path, loads=("2hp",), classes=("inner_007", "outer_007"))
    with pytest.raises(UserError, match=r"every chosen load has \(inner_007\) are fewer than two"):
        _bench(tmp_path).domains()


@pytest.mark.parametrize("case", ["bad_name", "no_de", "short", "corrupt", "wrong_number", "duplicate"])
def test_cwru_bad_files_name_the_file(tmp_path, case):
    _write_cwru(tmp_path)
    target = tmp_path / "3hp" / "outer_007.mat"
    if case == "bad_name":
        target.rename(tmp_path / "3hp" / "outer.mat")
        target = tmp_path / "3hp" / "outer.mat"
    elif case == "no_de":
        scipy.io.savemat(str(target), {"X200_FE_time": _signal("outer_007", 3)})
    elif case == "short":
        scipy.io.savemat(str(target), {"X200_DE_time": _signal("outer_007", 3, n=500)})
    elif case == "corrupt":
        target.write_bytes(b"\x00" * 64)
    elif case == "wrong_number":
        target.rename(tmp_path / "3hp" / "outer_007_555.mat")
        target = tmp_path / "3hp" / "outer_007_555.mat"
    elif case == "duplicate":
        scipy.io.savemat(str(tmp_path / "3hp" / "outer_007_130.mat"), {"X130_DE_time": _signal("outer_007", 3)})
    with pytest.raises(UserError) as info:
        bench = _bench(tmp_path)
        for domain in bench.domains():
            bench.load(domain)
    message = str(info.value)
    assert ("outer_007.mat" in message or str(target) in message) and "\n" not in message


def test_cwru_layout_errors(tmp_path):
    with pytest.raises(UserError, match="data.root"):
        CWRUBenchmark(DataConfig(benchmark="cwru")).domains()
    _write_cwru(tmp_path, loads=("1hp",))
    with pytest.raises(UserError, match="at least two of 0hp"):
        _bench(tmp_path).domains()
    (tmp_path / "0hp").mkdir()
    with pytest.raises(UserError, match="at least two classes|fewer than two"):
        _bench(tmp_path, target="0hp").domains()  # an empty load folder has no class in common with the others
    (tmp_path / "0hp").rmdir()
    _write_cwru(tmp_path, loads=("2hp",))
    with pytest.raises(UserError, match="fft"):
        _bench(tmp_path, variant="wavelet").load("1hp")
    with pytest.raises(UserError, match="1hp"):
        _bench(tmp_path).load("0hp")


def _write_release(root, loads=("0hp", "1hp", "2hp", "3hp"), classes=CLASSES, windows=4):
    """One small recording per class and load, named and numbered as the data centre ships it
    (``1hp/normal_98.mat`` holding ``X098_DE_time``); each class its own frequency."""
    for load in loads:
        (root / load).mkdir(exist_ok=True)
        index = ("0hp", "1hp", "2hp", "3hp").index(load)
        for cls in classes:
            number = FILE_NUMBERS[cls][index]
            t = np.arange(windows * 1024) / RATE
            freq = 300.0 * (1 + CLASSES.index(cls))
            signal = np.sin(2 * np.pi * freq * t) * (1 + index) + 0.01 * np.random.default_rng(number).normal(
                size=len(t)
            )
            scipy.io.savemat(
                str(root / load / f"{cls}_{number}.mat"), {f"X{number:03d}_DE_time": signal.reshape(-1, 1)}
            )


def test_cwru_ten_classes_when_the_normal_recordings_are_there(tmp_path, caplog):
    """A full release (normal 97-100 at 0-3 hp): the authors' ten classes, normal first, said in one line."""
    _write_release(tmp_path)
    with caplog.at_level(logging.INFO, logger="fedsim.data.benchmarks.cwru"):
        bench = _bench(tmp_path)
        assert bench.classes == CLASSES and len(CLASSES) == 10
        dom = bench.load("3hp")
    lines = [r.getMessage() for r in caplog.records if "classes" in r.getMessage()]
    assert lines == ["cwru: 10 classes, the authors' ten, in loads 1hp, 2hp, 3hp"]
    x, y = _windows(dom)
    assert dom.num_classes == 10 and np.array_equal(np.bincount(y), [4] * 10)
    normal = x[y == 0]  # the normal class is 3hp/normal_100.mat's signal at 300 Hz
    assert np.all(np.abs(np.argmax(normal, axis=1) - 300.0 / RATE * 1024) <= 1)


def test_cwru_nine_faults_without_the_normal_recordings_in_one_line(tmp_path, caplog):
    """As ../shared/data/cwru ships (normal only at 0hp): the nine faults, and one line naming the three files that
    would give the ten classes."""
    _write_release(tmp_path, loads=("0hp",))
    _write_release(tmp_path, loads=("1hp", "2hp", "3hp"), classes=CLASSES[1:])
    with caplog.at_level(logging.INFO, logger="fedsim.data.benchmarks.cwru"):
        bench = _bench(tmp_path, target="2hp")
        assert bench.classes == CLASSES[1:]
        assert bench.load("2hp").num_classes == 9
    lines = [r.getMessage() for r in caplog.records if "classes" in r.getMessage()]
    assert lines == [
        "cwru: 9 classes common to loads 1hp, 2hp, 3hp, not the authors' 10: normal missing (1hp/normal_98.mat, "
        "2hp/normal_99.mat, 3hp/normal_100.mat); add those files (as the data centre names them) for the 10 classes"
    ]
    # 0hp named as a source: its normal recording does not bring the class back (the other loads lack it).
    assert _bench(tmp_path, target="1hp", sources=("0hp", "2hp")).classes == CLASSES[1:]
    assert _bench(tmp_path, target="0hp", sources=("1hp",)).classes == CLASSES[1:]


def test_cwru_split_sources_whole_target_in_five_folds(tmp_path):
    """The authors' split: each source trains on all its windows (and is evaluated on them); the target's windows
    fall in 5 class-stratified folds, ``data.target_fold`` the test one, the other four its unlabeled training part."""
    _write_release(tmp_path, loads=("1hp", "2hp", "3hp"), classes=CLASSES[1:], windows=10)
    source = _bench(tmp_path, target="2hp").load("1hp")
    assert len(source.train_y) == 90 and np.array_equal(source.train_x, source.test_x)
    tests = []
    for fold in range(FOLDS):
        target = _bench(tmp_path, target="2hp", target_fold=fold).load("2hp")
        assert len(target.train_y) == 72 and len(target.test_y) == 18
        assert np.array_equal(np.bincount(target.test_y), [2] * 9)  # 10 windows a class: 2 in each fold
        train_rows = {row.tobytes() for row in target.train_x}
        assert not any(row.tobytes() in train_rows for row in target.test_x)  # disjoint
        tests.append({row.tobytes() for row in target.test_x})
    assert len(set().union(*tests)) == 90 and sum(len(t) for t in tests) == 90  # the folds partition the windows
    again = _bench(tmp_path, target="2hp", target_fold=3).load("2hp")
    assert {row.tobytes() for row in again.test_x} == tests[3]  # the same folds from the same data.seed
    other = _bench(tmp_path, target="2hp", target_fold=3, seed=1).load("2hp")
    assert {row.tobytes() for row in other.test_x} != tests[3]  # data.seed draws the folds
    # The default target (1hp) is split; 2hp is then a source, whole.
    assert len(_bench(tmp_path).load("1hp").test_y) == 18 and len(_bench(tmp_path).load("2hp").test_y) == 90
    holdout = _bench(tmp_path, target="2hp", split="holdout")
    assert [len(holdout.load(d).test_y) for d in ("1hp", "2hp")] == [18, 18]  # every domain 80/20
    assert len(holdout.load("1hp").train_y) == 72


@pytest.mark.parametrize(
    "options, message",
    [
        ({"target_fold": 5}, "data.target_fold must be an integer from 0 to 4"),
        ({"target_fold": -1}, "data.target_fold must be an integer from 0 to 4"),
        ({"split": "kfold"}, "unknown cwru split 'kfold'"),
    ],
)
def test_cwru_split_refusals(tmp_path, options, message):
    _write_cwru(tmp_path)
    with pytest.raises(UserError, match=message) as info:
        _bench(tmp_path, **options)
    assert "\n" not in str(info.value)
