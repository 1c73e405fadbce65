import numpy as np

from fedsim.messages import Instruction, Reply
from fedsim.seeding import derive_seed, numpy_rng


def test_message_bytes_count_tensor_buffers():
    tensors = {"w": np.zeros((10, 10), np.float32), "b": np.zeros(10, np.float64)}
    assert Instruction("fit", tensors).nbytes == 400 + 80
    assert Reply(0, {}).nbytes == 0


def test_derived_seeds_depend_on_every_part_and_only_on_them():
    base = derive_seed(0, 3, 1, "fit")
    assert base == derive_seed(0, 3, 1, "fit")
    others = {
        derive_seed(1, 3, 1, "fit"),
        derive_seed(0, 4, 1, "fit"),
        derive_seed(0, 3, 2, "fit"),
        derive_seed(0, 3, 1, "evaluate"),
    }
    assert base not in others and len(others) == 4
    assert 0 <= base < 2**63


def test_numpy_rng_is_reproducible():
    assert np.array_equal(numpy_rng(5, "a").integers(0, 100, 10), numpy_rng(5, "a").integers(0, 100, 10))
