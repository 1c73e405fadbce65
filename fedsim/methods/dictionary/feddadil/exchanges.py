"""What FedDaDiL's training exchanges send (:class:`~fedsim.methods.dictionary.feddadil.method.FedDaDiL`'s
``privacy_exchanges``, read by :mod:`fedsim.privacy`)."""

from __future__ import annotations

from fedsim.privacy.exchanges import CLIENTS, EACH, MODEL_UPDATE, SOURCES, UNIFORM, WEIGHTED, Exchanges, Stage


def feddadil_exchanges(config) -> Exchanges:
    """FedDaDiL (Castellon et al., ICASSP 2024; :mod:`fedsim.methods.dictionary.feddadil.method`): the encoder
    stage's FedAvg rounds, then the atoms' rows every round."""
    p = config.method.params
    combined = UNIFORM if p.aggregation == "avg" else EACH
    rows = "the whole dictionary" if p.exchange == "full" else "the round's mini-batch of rows of every atom"
    drawn = "the server, which sends the one it draws on to every client"
    readers = drawn if p.aggregation == "random" else "the server"  # "avg", "wbary": the server combines them
    standardization = p.feature_standardization  # "none": no sums travel; "all": the target's too
    stats = Stage(
        "feature_stats",
        CLIENTS if standardization == "all" else SOURCES,
        "count (an integer), sum and sum of squares of its encoded training features (d each): the encoded "
        "features' standardization, once",
        UNIFORM,
        setup=True,
        integers="the sample count",
    )
    stages = (
        Stage("fit", SOURCES, f"encoder stage: {MODEL_UPDATE}", WEIGHTED),
        *((stats,) if standardization != "none" else ()),
        Stage(
            "dil",
            CLIENTS,
            f"its version of {rows}: features (K x rows x d, in the data's own space, or the frozen encoder's) and "
            "label logits (K x rows x C, floats: soft labels), clipped as their difference from the rows sent",
            combined,
            records="atom rows fitted to its encoded batches of records (synthetic rows in the data's space)",
            readers=readers,
        ),
    )

    def calls(rnd: int, method) -> tuple[tuple[str, bool], ...]:
        encoder = method.encoder
        if encoder.is_encoder_round(rnd):
            return (("fit", True),)
        first = encoder.uses_encoder and rnd == encoder.rounds + 1  # encoder and standardization reach every client
        return (("dil", not first),)

    return Exchanges(stages, calls)
