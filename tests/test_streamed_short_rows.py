"""The CPU's LayerNorm and RMSNorm forwards stream y past the caches on short rows of whole vectors (F32 read in place,
simd::RowView; F16 and BF16 widened, simd::RowBlock) where y is large (cpu::kStreamShortRowsBytes, 32 MiB), aligned for
the streamed stores (16 elements) and every row a whole number of 16 elements from the first (cpu::RowPlan::streams).
Streamed or cached, each element comes from the same instructions: every layout of y must hold the bits of a run that
cannot stream (y 16 bytes off a 64-byte boundary), and those must be close to the float64 reference. Streamed layouts:
contiguous, and rows 96 apart (the gaps left as they were); cached ones: rows 72 apart, and in place. LayerNorm's seed
form streams xhat with y where both can (cpu::RowPlan::streams), else neither."""

import numpy as np
import pytest

import infiniop_py
from _helpers import BF16, F16, F32, at_vector_offset, rounded, rms_norm_forward_reference
from test_layer_norm import assert_y_close as assert_layer_norm_close
from test_rms_norm import assert_y_close as assert_rms_norm_close

DIM = 64
Y_BYTES = 32 << 20  # the least that streams
SENTINEL = -1024.0  # exact in every dtype
EPS = 1e-5


def run(op, x, w, b, y):
    if op == "layer_norm":
        infiniop_py.layer_norm(x, w, b, eps=EPS, out=(y, None, None))
    else:
        infiniop_py.rms_norm(x, w, eps=EPS, out=(y, None))


def rows_of(dtype):
    return Y_BYTES // (DIM * dtype.itemsize)


@pytest.fixture(scope="module", params=[F32, BF16, F16], ids=lambda dtype: dtype.name)
def inputs(request):
    dtype = request.param
    rng = np.random.default_rng(11)
    rows = rows_of(dtype)
    x = rounded(rng.standard_normal((rows, DIM)) * rng.uniform(0.2, 5.0, (rows, 1)) + rng.uniform(-3, 3, (rows, 1)),
                dtype)
    w, b = rounded(rng.normal(1.0, 0.5, DIM), dtype), rounded(rng.normal(0.0, 0.5, DIM), dtype)
    return at_vector_offset(x, 0, 64), w, b


@pytest.fixture(scope="module")
def cached_outputs(inputs):
    """Each op's y where it cannot stream (16 bytes past a 64-byte boundary), checked against the reference."""
    x, w, b = inputs
    outputs = {}
    for op in ("layer_norm", "rms_norm"):
        y = at_vector_offset(np.zeros(x.shape, x.dtype), 16, 64)
        run(op, x, w, b if op == "layer_norm" else None, y)
        outputs[op] = y
    assert_layer_norm_close(outputs["layer_norm"], x, w, b, 1, x.dtype, eps=EPS)
    assert_rms_norm_close(outputs["rms_norm"], rms_norm_forward_reference(x, w, EPS)[0], x.dtype)
    return outputs


def padded_rows(padded, dtype):
    """y's rows `padded` elements apart in a SENTINEL-filled, 64-byte aligned buffer: (y, the buffer)."""
    buffer = at_vector_offset(np.full((rows_of(dtype), padded), SENTINEL, dtype), 0, 64)
    return buffer[:, :DIM], buffer


@pytest.mark.parametrize("layout", ["contiguous", "rows 96 apart", "rows 72 apart", "in place"])
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_every_layout_of_y_has_the_cached_bits(inputs, cached_outputs, op, layout):
    x, w, b = inputs
    b = b if op == "layer_norm" else None
    buffer = None
    if layout == "contiguous":
        y = at_vector_offset(np.zeros(x.shape, x.dtype), 0, 64)
    elif layout == "in place":
        y = x.copy()
        x = y
    else:
        y, buffer = padded_rows(96 if layout == "rows 96 apart" else 72, x.dtype)
    run(op, x, w, b, y)
    bits = np.dtype(f"u{x.dtype.itemsize}")
    assert np.array_equal(y.view(bits), cached_outputs[op].view(bits)), f"{op}, y {layout}: other bits"
    if buffer is not None:
        assert np.all(buffer[:, DIM:] == SENTINEL), f"{op}, y {layout}: written between the rows"


def seed_form(x, w, b, y_offset, xhat_offset):
    """(output, xhat, std) of the seed form (LayerNormXhat), output and xhat each that many bytes past a 64-byte
    boundary."""
    y, xhat = (at_vector_offset(np.zeros(x.shape, x.dtype), offset, 64) for offset in (y_offset, xhat_offset))
    std = np.empty(x.shape[:-1], x.dtype)
    with infiniop_py.Handle() as handle, infiniop_py.LayerNormXhat(handle, y, xhat, std, x, w, b, eps=EPS) as op:
        op(y, xhat, std, x, w, b)
    return y, xhat, std


@pytest.fixture(scope="module")
def cached_seed_form(inputs):
    """The seed form where neither output can stream (both 16 bytes off), its xhat checked against the reference."""
    x, w, b = inputs
    outputs = seed_form(x, w, b, 16, 16)
    assert_layer_norm_close(outputs[1], x, None, None, 1, x.dtype, eps=float(np.float32(EPS)))
    return outputs


@pytest.mark.parametrize("offsets", [(0, 0), (0, 16)], ids=["output and xhat aligned", "xhat 16 bytes off"])
def test_seed_form_has_the_cached_bits(inputs, cached_seed_form, offsets):
    x, w, b = inputs
    bits = np.dtype(f"u{x.dtype.itemsize}")
    for name, got, cached in zip(("output", "xhat", "std"), seed_form(x, w, b, *offsets), cached_seed_form):
        assert np.array_equal(got.view(bits), cached.view(bits)), f"{name}, offsets {offsets}: other bits"
