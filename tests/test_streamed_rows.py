"""From cpu::kStreamShortRowsBytes (64 MiB) the CPU's row kernels stream their output past the caches on rows of any
length (cpu::RowPlan::stream_output), also the rows run one at a time: rows of 128 F32 here, too long for the
short-row block kernels. Each thread fences its streamed stores once, after its run of rows (cpu::runRows), not
after every row. Streamed or cached, each row comes from the same instructions: a 64 MiB call must give the bits of
its two 32 MiB halves called alone (cached), and those must match the float64 reference."""

import numpy as np
import pytest

import infiniop_py
from _helpers import (F32, LAYER_NORM, RMS_NORM, assert_matches_reference, layer_norm_inputs, rms_norm_forward_reference,
                      rms_norm_inputs, rounded)
from test_layer_norm import assert_y_close as assert_layer_norm_close
from test_rms_norm import assert_y_close as assert_rms_norm_close

ROWS, DIM = 131072, 128  # a 64 MiB F32 output, streamed; each half 32 MiB, cached
EPS = 1e-5


def halves(arrays):
    """The arrays' first and second halves of rows (per-row arrays split too, vectors of DIM whole in both)."""
    half = ROWS // 2
    return ([a[:half] if len(a) == ROWS else a for a in arrays], [a[half:] if len(a) == ROWS else a for a in arrays])


def assert_halves_have_the_bits(op, call, arrays):
    """call(*arrays)'s row output (the first) has the bits of the halves' calls: returns the whole call's outputs."""
    outputs = call(*arrays)
    first, second = (call(*part)[0] for part in halves(arrays))
    expected = np.concatenate([first, second])
    assert np.array_equal(outputs[0].view(np.uint32), expected.view(np.uint32)), f"{op}: streamed, other bits"
    return outputs


@pytest.fixture(scope="module")
def forward_inputs():
    rng = np.random.default_rng(5)
    x = rounded(rng.standard_normal((ROWS, DIM)) * rng.uniform(0.2, 5.0, (ROWS, 1)) + rng.uniform(-3, 3, (ROWS, 1)),
                F32)
    return x, rounded(rng.normal(1.0, 0.5, DIM), F32), rounded(rng.normal(0.0, 0.5, DIM), F32)


def test_layer_norm_forward(forward_inputs):
    x, w, b = forward_inputs
    (y,) = assert_halves_have_the_bits("layer_norm", lambda *a: (infiniop_py.layer_norm(*a, eps=EPS),), (x, w, b))
    assert_layer_norm_close(y, x, w, b, 1, F32, eps=EPS)


def test_rms_norm_forward(forward_inputs):
    x, w, _ = forward_inputs
    (y,) = assert_halves_have_the_bits("rms_norm", lambda *a: (infiniop_py.rms_norm(*a, eps=EPS),), (x, w))
    assert_rms_norm_close(y, rms_norm_forward_reference(x, w, EPS)[0], F32)


def test_rms_norm_backward():
    inputs = rms_norm_inputs(np.random.default_rng(6), (ROWS, DIM), F32)
    outputs = assert_halves_have_the_bits("rms_norm_backward", infiniop_py.rms_norm_backward, inputs)
    assert_matches_reference(RMS_NORM, outputs, inputs, F32)


def test_layer_norm_backward():
    inputs = layer_norm_inputs(np.random.default_rng(7), (ROWS, DIM), F32)
    outputs = assert_halves_have_the_bits("layer_norm_backward", infiniop_py.layer_norm_backward, inputs)
    assert_matches_reference(LAYER_NORM, outputs, inputs, F32)
