"""Model selection without target labels: scores computed where the data lives, combined on the server.

In unsupervised domain adaptation the target has no labels, so hyperparameters are chosen by scores computed
without them. Each client computes small sufficient statistics of its own rows; the server adds them and forms
the scores (every one oriented so that higher is better, as skada's scorers are). No score reads a target label:
:func:`target_statistics` takes none.

* ``source_accuracy`` / ``source_loss`` (Gulrajani & Lopez-Paz, ICLR 2021, training-domain validation): on each
  source client's held-out validation part; the client sends n, the count correct and the sum of cross-entropies.
* ``entropy`` (Morerio et al., ICLR 2018): minus the mean prediction entropy, on each target client's unlabeled
  training inputs; the client sends n and the sum of entropies.
* ``snd`` (Saito et al., ICCV 2021): soft neighborhood density of the target's softmax outputs (temperature
  0.05), computed whole on each target client (it needs every pair of rows); the client sends n and its value, and
  several target clients combine as the n-weighted mean. On request only (not "auto"): its cost grows with the
  square of the target client's rows.
* ``mano`` (Xie et al., NeurIPS 2024): the scaled L4 matrix norm of the target's normalized logits, softmax or the
  order-2 Taylor normalization as the pooled criterion decides; each target client sends K, n and three sums.
* ``iwv`` (Sugiyama et al., JMLR 2007) and ``dev`` (You et al., ICML 2019): the sources' validation losses weighed
  by the density ratio w = p_target / p_source. One more exchange: every client first sends its feature moments
  (count, sum, scatter: 1 + d + d*d numbers, :func:`moment_statistics`), the server fits the ratio
  (:func:`fit_density_ratio`: d + 1 numbers, :class:`DensityRatio`) and sends it to the sources, which send 3 (iwv)
  or 5 (dev) numbers: their weighted sums, scaled by their own largest weight, and its log. iwv is self-normalized
  (sum w l / sum w). Requested only (not "auto").

:func:`resolve_scores` checks a request; :func:`combine_statistics` forms ``{"score_<name>": value}``. Each score is
a :class:`Score` subclass in :data:`SCORES` (:data:`fedsim.registry.SCORES`), the built-ins as a user's score:
``run.scores=entropy,mypkg.scores:MyScore`` adds one from the user's package (``docs/extending.md``). Modules:
:mod:`fedsim.selection.scores` (the interface and the request), :mod:`fedsim.selection.statistics` (the built-in
scores, per-client sums and their combination), :mod:`fedsim.selection.density` (the density ratio).
"""

from fedsim.registry import SCORES
from fedsim.selection.density import DensityRatio, fit_density_ratio, moment_statistics
from fedsim.selection.scores import Score, resolve_scores
from fedsim.selection.statistics import combine_statistics, source_statistics, target_statistics

__all__ = [
    "SCORES",
    "Score",
    "resolve_scores",
    "source_statistics",
    "target_statistics",
    "moment_statistics",
    "fit_density_ratio",
    "DensityRatio",
    "combine_statistics",
]
