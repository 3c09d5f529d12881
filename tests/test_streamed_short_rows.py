"""The CPU's LayerNorm and RMSNorm forwards stream y past the caches on F32 short rows of whole vectors (read in place,
simd::RowView) where y is large (cpu::kStreamShortRowsBytes, 64 MiB), 64-byte aligned and every row a whole number of
vectors from the first (cpu::streamShortRows). Streamed or cached, each element comes from the same instructions:
every layout of y must hold the bits of a run that cannot stream (y 16 bytes off a 64-byte boundary), and those must
be close to the float64 reference. Streamed layouts: contiguous, and rows 96 apart (the gaps left as they were);
cached ones: rows 80 apart, and in place."""

import numpy as np
import pytest

import infiniop_py
from _helpers import F32, at_vector_offset, rounded, rms_norm_forward_reference
from test_layer_norm import assert_y_close as assert_layer_norm_close
from test_rms_norm import assert_y_close as assert_rms_norm_close

ROWS, DIM = 262144, 64  # a 64 MiB y: the least that streams
SENTINEL = -1234.0
EPS = 1e-5


def run(op, x, w, b, y):
    if op == "layer_norm":
        infiniop_py.layer_norm(x, w, b, eps=EPS, out=(y, None, None))
    else:
        infiniop_py.rms_norm(x, w, eps=EPS, out=(y, None))


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(11)
    x = rounded(rng.standard_normal((ROWS, DIM)) * rng.uniform(0.2, 5.0, (ROWS, 1)) + rng.uniform(-3, 3, (ROWS, 1)),
                F32)
    return at_vector_offset(x, 0, 64), rounded(rng.normal(1.0, 0.5, DIM), F32), rounded(rng.normal(0.0, 0.5, DIM), F32)


@pytest.fixture(scope="module")
def cached_outputs(inputs):
    """Each op's y where it cannot stream (16 bytes past a 64-byte boundary), checked against the reference."""
    x, w, b = inputs
    outputs = {}
    for op in ("layer_norm", "rms_norm"):
        y = at_vector_offset(np.zeros((ROWS, DIM), F32), 16, 64)
        run(op, x, w, b if op == "layer_norm" else None, y)
        outputs[op] = y
    assert_layer_norm_close(outputs["layer_norm"], x, w, b, 1, F32, eps=EPS)
    assert_rms_norm_close(outputs["rms_norm"], rms_norm_forward_reference(x, w, EPS)[0], F32)
    return outputs


def padded_rows(padded):
    """y's rows `padded` elements apart in a SENTINEL-filled, 64-byte aligned buffer: (y, the buffer)."""
    buffer = at_vector_offset(np.full((ROWS, padded), SENTINEL, F32), 0, 64)
    return buffer[:, :DIM], buffer


@pytest.mark.parametrize("layout", ["contiguous", "rows 96 apart", "rows 80 apart", "in place"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_every_layout_of_y_has_the_cached_bits(inputs, cached_outputs, op, layout):
    x, w, b = inputs
    b = b if op == "layer_norm" else None
    buffer = None
    if layout == "contiguous":
        y = at_vector_offset(np.zeros((ROWS, DIM), F32), 0, 64)
    elif layout == "in place":
        y = x.copy()
        x = y
    else:
        y, buffer = padded_rows(96 if layout == "rows 96 apart" else 80)
    run(op, x, w, b, y)
    assert np.array_equal(y.view(np.uint32), cached_outputs[op].view(np.uint32)), f"{op}, y {layout}: other bits"
    if buffer is not None:
        assert np.all(buffer[:, DIM:] == SENTINEL), f"{op}, y {layout}: written between the rows"
