"""From cpu::kStreamShortRowsBytes (32 MiB) the CPU's row kernels stream their output past the caches
(cpu::RowPlan::stream_output), rows of fewer than 4096 bytes where they are whole aligned vectors (cpu::RowPlan::streams;
F32 rows of 100 here are not), also the rows run one at a time: the forwards' F32 rows of 128 here, too long for their
short-row block kernels, and the backwards' F32 rows of 256; and the short rows that block kernels run (streamed, of up
to cpu::kShortStreamedRowBytes: RMSNorm backward's, and the forwards' 16-bit rows of 256, which their halves run row
by row). Each thread fences its streamed
stores once, after its run of rows or row block (cpu::runRows), not after every row. Streamed or cached, each row
comes from the same instructions: a 32 MiB call must give the bits of its two 16 MiB halves called alone (cached),
and those must match the float64 reference. LayerNorm's seed form streams its xhat with y."""

import numpy as np
import pytest

import infiniop_py
from _helpers import (BF16, F32, LAYER_NORM, RMS_NORM, assert_matches_reference, at_vector_offset, layer_norm_inputs,
                      rms_norm_forward_reference, rms_norm_inputs, rounded)
from test_layer_norm import assert_y_close as assert_layer_norm_close, seed_form_on
from test_rms_norm import assert_y_close as assert_rms_norm_close

ROWS, DIM = 65536, 128  # a 32 MiB F32 output, streamed; each half 16 MiB, cached
# The forwards, 32 MiB: F32 rows of 128 and of 100 (not whole vectors: cached) run the whole-row kernels
# (cpu::runWholeRowsAlways), BF16 rows of 256 row blocks of the row kernels (cpu::kShortStreamedRowBytes).
FORWARD_CASES = [(F32, (ROWS, DIM)), (BF16, (ROWS, 2 * DIM)), (F32, (84000, 100))]
EPS = 1e-5
# The backwards, 32 MiB too: F32 rows of 256 run one at a time; their block kernels run F32 rows of 64 (a vector
# column at a time down a group of rows) and BF16 rows of 128 (row by row), and RMSNorm's F32 rows of 128 and BF16
# rows of 256 (kShortStreamedRowBytes; their halves run row by row, with the same bits; LayerNorm's run one at a
# time); F32 rows of 100 one at a time, cached.
BACKWARD_CASES = [(F32, (32768, 256)), (F32, (ROWS, DIM)), (F32, (131072, 64)), (BF16, (131072, 128)),
                  (BF16, (65536, 256)), (F32, (84000, 100))]


def halves(arrays):
    """The arrays' first and second halves of rows, as many as the first array has (per-row arrays split too,
    vectors of DIM whole in both)."""
    rows = len(arrays[0])
    half = rows // 2
    return [[a[part] if len(a) == rows else a for a in arrays] for part in (slice(None, half), slice(half, None))]


def assert_halves_have_the_bits(op, call, arrays, row_outputs=1):
    """call(*arrays)'s first row_outputs outputs (by rows) have the bits of the halves' calls: returns the whole
    call's outputs."""
    outputs = call(*arrays)
    first, second = (call(*part) for part in halves(arrays))
    for i in range(row_outputs):
        expected = np.concatenate([first[i], second[i]])
        assert np.array_equal(outputs[i].view(np.uint8), expected.view(np.uint8)), f"{op}: output {i}, other bits"
    return outputs


def case_id(case):
    dtype, shape = case
    return f"{np.dtype(dtype).name}-{shape[0]}x{shape[1]}"


@pytest.fixture(scope="module", params=FORWARD_CASES, ids=map(case_id, FORWARD_CASES))
def forward_inputs(request):
    """(x, w, b, dtype): rows of their own spread and mean, parameters of the data's dtype."""
    dtype, (rows, dim) = request.param
    rng = np.random.default_rng(5)
    x = rounded(rng.standard_normal((rows, dim)) * rng.uniform(0.2, 5.0, (rows, 1)) + rng.uniform(-3, 3, (rows, 1)),
                dtype)
    return x, rounded(rng.normal(1.0, 0.5, dim), dtype), rounded(rng.normal(0.0, 0.5, dim), dtype), dtype


def test_layer_norm_forward(forward_inputs):
    x, w, b, dtype = forward_inputs
    (y,) = assert_halves_have_the_bits("layer_norm", lambda *a: (infiniop_py.layer_norm(*a, eps=EPS),), (x, w, b))
    assert_layer_norm_close(y, x, w, b, 1, dtype, eps=EPS)


def test_layer_norm_seed_form(forward_inputs):
    x, w, b, dtype = forward_inputs
    aligned = lambda a: at_vector_offset(np.empty_like(a), 0, 64)  # noqa: E731 (output and xhat: the same alignment)
    seed_form = lambda *a: seed_form_on("cpu", *a, dtype, EPS, empty_like=aligned)  # noqa: E731 (std: w's dtype)
    y, xhat, _ = assert_halves_have_the_bits("layer_norm seed form", seed_form, (x, w, b), row_outputs=3)
    eps = float(np.float32(EPS))  # the seed create takes a float
    assert_layer_norm_close(y, x, w, b, 1, dtype, eps=eps)
    assert_layer_norm_close(xhat, x, None, None, 1, dtype, eps=eps)


def test_rms_norm_forward(forward_inputs):
    x, w, _, dtype = forward_inputs
    (y,) = assert_halves_have_the_bits("rms_norm", lambda *a: (infiniop_py.rms_norm(*a, eps=EPS),), (x, w))
    assert_rms_norm_close(y, rms_norm_forward_reference(x, w, EPS)[0], dtype)


@pytest.mark.parametrize("dtype, shape", BACKWARD_CASES, ids=map(case_id, BACKWARD_CASES))
def test_rms_norm_backward(dtype, shape):
    inputs = rms_norm_inputs(np.random.default_rng(6), shape, dtype)
    outputs = assert_halves_have_the_bits("rms_norm_backward", infiniop_py.rms_norm_backward, inputs)
    assert_matches_reference(RMS_NORM, outputs, inputs, dtype)


@pytest.mark.parametrize("dtype, shape", BACKWARD_CASES, ids=map(case_id, BACKWARD_CASES))
def test_layer_norm_backward(dtype, shape):
    inputs = layer_norm_inputs(np.random.default_rng(7), shape, dtype)
    outputs = assert_halves_have_the_bits("layer_norm_backward", infiniop_py.layer_norm_backward, inputs)
    assert_matches_reference(LAYER_NORM, outputs, inputs, dtype)
