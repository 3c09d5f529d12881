"""Element offsets beyond 2**31 are computed in 64 bits: rows and vector elements more than 2**31 elements
apart, in strided views over lazily allocated (never-touched pages cost nothing) anonymous mappings, so the
test stays small in real memory."""

import mmap
import sys

import numpy as np
import pytest

from _helpers import F32, OPS, assert_matches_reference

FAR = 2**31 + 64  # a stride, in elements, that no 32-bit offset can express
MAP_NORESERVE = 0x4000  # Linux: reserve no swap for the mapping; pages materialize only when touched

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="lazy anonymous mappings (MAP_NORESERVE) are Linux's")


def lazy_view(values, strides):
    """A view equal to `values` whose element strides are `strides` (negative ones allowed), over a fresh
    mapping as large as the view's footprint. Returns (view, mapping); keep the mapping alive."""
    itemsize = values.dtype.itemsize
    low = sum(s * (n - 1) for s, n in zip(strides, values.shape) if s < 0)
    high = sum(s * (n - 1) for s, n in zip(strides, values.shape) if s > 0)
    mapping = mmap.mmap(-1, (high - low + 1) * itemsize, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    base = np.frombuffer(mapping, dtype=values.dtype)
    view = np.lib.stride_tricks.as_strided(base[-low:], values.shape, tuple(s * itemsize for s in strides))
    view[...] = values
    return view, mapping


def far_strides(shape, sign):
    """Strides that put consecutive indices of every leading dim FAR (times sign) elements apart; last dim packed."""
    return tuple(sign * FAR for _ in shape[:-1]) + (1,)


@pytest.mark.parametrize("sign", [1, -1], ids=["forward", "reversed"])
@pytest.mark.parametrize("case", [c for c in OPS if c.row_tensors], ids=str)
def test_rows_more_than_2_31_elements_apart(case, sign):
    shape = (2, 64)
    inputs = case.make_inputs(np.random.default_rng(0), shape, F32)
    mappings = []
    views = []
    for name, values in zip(case.input_names, inputs):
        if name in case.row_tensors:
            view, mapping = lazy_view(values, far_strides(shape, sign))
            views.append(view)
            mappings.append(mapping)
        else:
            views.append(values)
    grad, grad_mapping = lazy_view(np.zeros(shape, F32), far_strides(shape, sign))
    vectors = [np.empty(s, F32) for s in case.output_shapes(shape)[1:]]

    case.function()(*views, out=(grad, *vectors))

    assert_matches_reference(case, (grad, *vectors), inputs, F32)
    del grad, views


@pytest.mark.parametrize("case", OPS, ids=str)
def test_vector_elements_more_than_2_31_elements_apart(case):
    """Weight-like vectors (and LayerNorm's per-row std), outputs included, strided so that their last element
    lies beyond element 2**31."""
    shape = (2, 3, 8) if case.contiguous_tensors else (2, 16)
    inputs = list(case.make_inputs(np.random.default_rng(1), shape, F32))
    mappings = []

    def far(values):
        view, mapping = lazy_view(values, (-(-FAR // (values.size - 1)),))
        mappings.append(mapping)
        return view

    big = shape
    views = [values if values.shape == big else far(values) for values in inputs]
    outputs = [np.zeros(big, F32)] + [far(np.zeros(s, F32)) for s in case.output_shapes(big)[1:]]

    case.function()(*views, out=tuple(outputs))

    assert_matches_reference(case, outputs, inputs, F32)
