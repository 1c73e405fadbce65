"""Seeds derived from (root seed, round, client, operation).

Each random draw in a simulation uses its own seed, computed from what it is
for rather than from a global stream, so the result does not depend on the
order in which clients run, on how many actors there are, or on the backend.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch  # imported where a generator is made: a numpy-only process (a FedAvg server) never loads it


def _key(part) -> int:
    if isinstance(part, (int, np.integer)):
        return int(part) & 0xFFFFFFFF
    return zlib.crc32(str(part).encode())


def derive_seed(root: int, *parts) -> int:
    """A 63-bit seed for ``parts`` (ints or strings) under ``root``.

    >>> derive_seed(0, 3, 1, "fit") == derive_seed(0, 3, 1, "fit")
    True
    """
    sequence = np.random.SeedSequence([_key(root)] + [_key(p) for p in parts])
    return int(
        sequence.generate_state(2, dtype=np.uint32).astype(np.uint64) @ np.array([1 << 31, 1], dtype=np.uint64)
    ) & ((1 << 63) - 1)


def numpy_rng(root: int, *parts) -> np.random.Generator:
    """A numpy generator seeded with :func:`derive_seed` ``(root, *parts)``."""
    return np.random.default_rng(derive_seed(root, *parts))


def torch_generator(root: int, *parts) -> torch.Generator:
    """A torch (CPU) generator seeded with :func:`derive_seed` ``(root, *parts)``."""
    import torch

    generator = torch.Generator()
    generator.manual_seed(derive_seed(root, *parts))
    return generator
