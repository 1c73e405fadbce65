"""What FedDANN's and FedMMD's training exchanges send (:class:`~fedsim.methods.alignment.base.FeatureAlignment`'s
``privacy_exchanges``, read by :mod:`fedsim.privacy`)."""

from __future__ import annotations

from fedsim.privacy.exchanges import EACH, MODEL_UPDATE, SOURCES, TARGETS, WEIGHTED, Exchanges, Stage


def feature_alignment_exchanges(config) -> Exchanges:
    """FedDANN and FedMMD (:mod:`fedsim.methods.alignment.base`): target features, then FedAvg on the sources."""
    batch = config.method.params.target_batch
    features = Stage(
        "features",
        TARGETS,
        f"encoded features of {batch} of its unlabeled training inputs ({batch} x model.hidden), the encoder's output "
        "for the target's own rows: the data's features, sent on to every source",
        EACH,
        records=f"the target's encoded features, one vector per unlabeled row ({batch} rows)",
        readers="the server, which sends them on to every source",
    )
    fit = Stage("fit", SOURCES, MODEL_UPDATE, WEIGHTED)
    return Exchanges((features, fit), lambda rnd, method: (("features", False), ("fit", False)))
