"""What FADA's training exchanges send (:class:`~fedsim.methods.fada.method.FADA`'s ``privacy_exchanges``, read by
:mod:`fedsim.privacy`)."""

from __future__ import annotations

from fedsim.privacy.exchanges import EACH, SOURCES, TARGETS, Exchanges, Stage


def fada_exchanges(config) -> Exchanges:
    """FADA (Peng et al., ICLR 2020, Alg. 1; :mod:`fedsim.methods.fada.method`): every reply is used on its own,
    by the target (deltas, gradients) or by the sources (features)."""
    p = config.method.params
    last = "disentangle" if p.disentangle else "adversarial" if p.adversarial else "fit"
    delta = "Delta_i = w_i - w_t, one tensor per model tensor (already a difference: clipped as it is)"
    to_target = "the server, which sends them on to the target"
    stages = (
        Stage(
            "fit",
            SOURCES,
            f"{delta} when it is the round's last source stage (model I); nothing otherwise",
            EACH,
            readers=to_target,
        ),
        Stage(
            "features",
            TARGETS,
            f"G_t's features of {p.target_batch} of its unlabeled inputs ({p.target_batch} x feature width): the "
            "data's features, sent on to every source",
            EACH,
            records=f"G_t's features of the target's rows, one vector per row ({p.target_batch} rows)",
            readers="the server, which sends them on to every source",
        ),
        Stage(
            "adversarial",
            SOURCES,
            f"the gradient of the confusion loss w.r.t. the target features ({p.target_batch} x feature width), and "
            f"{delta} at the last step when disentanglement is off",
            EACH,
            records="the confusion loss's gradient at each of the target's feature rows",
            readers=to_target,
        ),
        Stage("align", TARGETS, "no tensor (a gradient norm, as a metric)", EACH, tensors=False),
        Stage("disentangle", SOURCES, delta, EACH, readers=to_target),
        Stage(
            "update",
            TARGETS,
            "the new target model w_t, clipped as its difference from the w_t the server sent in the round",
            EACH,
            readers="the server, which sends it to every source as the next round's w_t",
        ),
    )

    def calls(rnd: int, method) -> tuple[tuple[str, bool], ...]:
        made: list[tuple[str, bool]] = [("fit", True)] if last == "fit" else []
        if p.adversarial:
            made += [("features", False), ("adversarial", True)] * p.adversarial_steps
        if p.disentangle:
            made.append(("disentangle", True))
        return (*made, ("update", False))

    return Exchanges(
        stages,
        calls,
        record_level="its discriminator, MINE and disentanglement steps are training loops of their own that DP-SGD "
        "does not cover, and the target's update trains G_t through its own rows",
    )
