"""The CPU benchmark's data: 64-byte aligned, as torch allocates, and handed to torch without a copy, so both
sides of each comparison run on the same memory."""

import numpy as np
import pytest

from _helpers import BF16, F16, F32
from infiniop_py.bench import cpu as bench

torch = pytest.importorskip("torch", reason="torch is optional: the benchmark compares against it when present")


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: d.name)
def test_bench_arrays_are_aligned_and_shared_with_torch(dtype):
    values = np.arange(3 * 1000, dtype=np.float32).reshape(3, 1000).astype(dtype)
    placed = bench.aligned(values)
    assert placed.ctypes.data % 64 == 0
    assert placed.tobytes() == values.tobytes()
    tensor = bench._to_torch(torch, placed)
    assert tensor.data_ptr() == placed.ctypes.data
    assert tensor.shape == placed.shape
    assert np.array_equal(tensor.float().numpy(), placed.astype(np.float32))
