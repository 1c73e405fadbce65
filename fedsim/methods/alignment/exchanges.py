"""What FedDANN's and FedMMD's training exchanges send (:class:`~fedsim.methods.alignment.base.FeatureAlignment`'s
``privacy_exchanges``, read by :mod:`fedsim.privacy`)."""

from __future__ import annotations

from functools import partial

from fedsim.privacy.exchanges import EACH, MODEL_UPDATE, SOURCES, TARGETS, WEIGHTED, Exchanges, Stage

NO_PER_RECORD_LOSS = (
    "its domain loss is not declared to have a per-record objective (DomainLoss.per_record), so DP-SGD has no "
    "gradient of one record to clip; a subclass whose domain loss has one (per_record_objective) declares "
    "privacy_exchanges = staticmethod(feddann_exchanges)"
)
"""Why a feature-alignment method takes no ``privacy.unit=record`` unless it declares otherwise (FedDANN does)."""


def feature_alignment_exchanges(config, record_level: str = NO_PER_RECORD_LOSS) -> Exchanges:
    """FedDANN and FedMMD (:mod:`fedsim.methods.alignment.base`): target features, then FedAvg on the sources. Under
    ``privacy.unit=record`` the target clips and noises each feature row it sends (:mod:`fedsim.privacy.rows`) and
    the sources' steps are DP-SGD's, unless ``record_level`` says why not."""
    batch = config.method.params.target_batch
    features = Stage(
        "features",
        TARGETS,
        f"encoded features of {batch} of its unlabeled training inputs ({batch} x model.hidden), the encoder's output "
        "for the target's own rows: the data's features, sent on to every source",
        EACH,
        records=f"the target's encoded features, one vector per unlabeled row ({batch} rows)",
        readers="the server, which sends them on to every source",
        record_mechanism="each row clipped to privacy.stage_clip.features and Gaussian noise added on the target "
        "before it leaves (local DP, fedsim.privacy.rows)",
    )
    fit = Stage("fit", SOURCES, MODEL_UPDATE, WEIGHTED)
    return Exchanges((features, fit), lambda rnd, method: (("features", False), ("fit", False)), record_level)


feddann_exchanges = partial(feature_alignment_exchanges, record_level="")
"""FedDANN's: its discriminator's loss is a sum over records (DANNLoss.per_record_objective), so DP-SGD applies."""
fedmmd_exchanges = partial(
    feature_alignment_exchanges,
    record_level="its MMD couples a batch's source records in pairs (k(s_i, s_j)), so no record has a gradient of its "
    "own to clip",
)
"""FedMMD's: refused under ``privacy.unit=record``."""
