"""One line per event: a warning is logged once, through ``logging``, without a Python source line."""

import logging
import warnings

from fedsim.actors.backend import RAY_AUTH_LOGGER, gpus_or_cpu, quiet_logger


def test_gpu_fallback_is_one_log_line(caplog, capsys):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        assert gpus_or_cpu(0.5, cluster_gpus=0) == 0.0
    assert [r.getMessage() for r in caplog.records] == [
        "--gpus-per-client 0.5 asked for GPUs but the Ray cluster has none: running on CPU"
    ]
    assert caught == []  # no RuntimeWarning (whose report would repeat the line with its source)
    captured = capsys.readouterr()
    assert ".py:" not in captured.out + captured.err


def test_gpus_are_kept_where_the_cluster_has_them(caplog):
    with caplog.at_level(logging.WARNING):
        assert gpus_or_cpu(0.5, cluster_gpus=2) == 0.5
        assert gpus_or_cpu(0.0, cluster_gpus=0) == 0.0
    assert caplog.records == []


def test_rays_token_notice_is_quiet_while_a_local_cluster_starts(caplog):
    logger = logging.getLogger(RAY_AUTH_LOGGER)
    with caplog.at_level(logging.WARNING, logger=RAY_AUTH_LOGGER):
        before = logger.level
        with quiet_logger(RAY_AUTH_LOGGER):
            logger.warning("Token authentication is enabled for this Ray cluster.")
            logger.error("a real error still shows")
        assert logger.level == before
    assert [r.getMessage() for r in caplog.records] == ["a real error still shows"]


def test_the_cli_keeps_the_digits_build_lines_out_of_a_run(capsys):
    from fedsim.experiments.cli import QUIET_LOGGERS, main

    assert main(["list"]) == 0
    for name in QUIET_LOGGERS:
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING
    assert logging.getLogger("fedsim").getEffectiveLevel() == logging.INFO  # the run's own notices still show
