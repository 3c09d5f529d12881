"""RMSNorm backward numerics (functional API) against the float64 reference."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import infiniop_py
from _devices import DEVICES, call_on
from _helpers import (
    F16, F32, BF16, FREE_LAYOUTS, INPUT_ROW_LAYOUTS, ROW_LAYOUTS, RMS_NORM, SUPPORTED_DTYPES, TOLERANCE,
    VECTOR_LAYOUTS, GuardedOutput, assert_close, assert_close_on_scale, assert_matches_reference,
    f16_sequential_sum, f64, relative_error, rms_norm_backward_reference, rms_norm_inputs, rms_reference,
    with_free_layout, with_row_layout,
)

pytestmark = pytest.mark.parametrize("device", DEVICES)

leading_shapes = st.one_of(
    st.tuples(st.integers(1, 9)),
    st.tuples(st.integers(1, 4), st.integers(1, 5)),
)
# D = 1 makes grad_x mathematically zero (pure rounding noise against max|ref|): tested on its own below.
row_lengths = st.sampled_from([2, 3, 7, 8, 31, 64, 129, 1000, 4099])  # 4099: a 16-bit weight read as stored
dtypes = st.sampled_from(SUPPORTED_DTYPES)
seeds = st.integers(0, 2**32 - 1)


@given(lead=leading_shapes, d=row_lengths, dtype=dtypes, seed=seeds,
       grad_y_layout=st.sampled_from(INPUT_ROW_LAYOUTS), x_layout=st.sampled_from(INPUT_ROW_LAYOUTS),
       w_layout=st.sampled_from(FREE_LAYOUTS))
@example(lead=(1,), d=7, dtype=F16, seed=0,  # a single row
         grad_y_layout="padded", x_layout="reversed", w_layout="stride2")
def test_strided_inputs_match_reference(device, lead, d, dtype, seed, grad_y_layout, x_layout, w_layout):
    grad_y, x, w = rms_norm_inputs(np.random.default_rng(seed), lead + (d,), dtype)
    grad_y = with_row_layout(grad_y, grad_y_layout)
    x = with_row_layout(x, x_layout)
    w = with_free_layout(w, w_layout)

    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w)

    for out, shape in ((grad_x, lead + (d,)), (grad_w, (d,))):
        assert out.shape == shape and out.dtype == dtype and out.flags.c_contiguous
    assert_matches_reference(RMS_NORM, (grad_x, grad_w), (grad_y, x, w), dtype)


@given(lead=leading_shapes, d=row_lengths, dtype=dtypes, seed=seeds,
       grad_x_layout=st.sampled_from(ROW_LAYOUTS), grad_w_layout=st.sampled_from(VECTOR_LAYOUTS))
def test_writes_strided_preallocated_outputs(device, lead, d, dtype, seed, grad_x_layout, grad_w_layout):
    inputs = rms_norm_inputs(np.random.default_rng(seed), lead + (d,), dtype)
    grad_x_out = GuardedOutput(lead + (d,), dtype, grad_x_layout)
    grad_w_out = GuardedOutput((d,), dtype, grad_w_layout)

    returned = call_on(device, infiniop_py.rms_norm_backward, *inputs, out=(grad_x_out.view, grad_w_out.view))

    assert np.shares_memory(returned[0], grad_x_out.view) and np.shares_memory(returned[1], grad_w_out.view)
    assert_matches_reference(RMS_NORM, (grad_x_out.view, grad_w_out.view), inputs, dtype)
    grad_x_out.assert_only_view_written()
    grad_w_out.assert_only_view_written()


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
def test_in_place_grad_x_is_grad_y(device, dtype, layout):
    grad_y, x, w = rms_norm_inputs(np.random.default_rng(1), (6, 5, 96), dtype)
    grad_y = with_row_layout(grad_y, layout)
    original_grad_y = grad_y.copy()
    grad_w = np.empty(96, dtype)

    call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, out=(grad_y, grad_w))

    assert_matches_reference(RMS_NORM, (grad_y, grad_w), (original_grad_y, x, w), dtype)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0, 16), (0, 3, 16), (4, 0, 16)])
def test_zero_rows_give_zero_grad_w(device, dtype, shape):
    grad_y, x, w = rms_norm_inputs(np.random.default_rng(2), shape, dtype)
    grad_w = np.full(16, -1.0, dtype)

    grad_x, _ = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, out=(np.empty(shape, dtype), grad_w))

    assert grad_x.shape == shape
    assert np.array_equal(f64(grad_w), np.zeros(16))


@pytest.mark.parametrize("shape", [(3, 0), (2, 3, 0)])
def test_zero_length_rows(device, shape):
    grad_y, x, w = rms_norm_inputs(np.random.default_rng(3), shape, F32)

    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w)

    assert grad_x.shape == shape and grad_w.shape == (0,)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_row_longer_than_65536(device, dtype):
    inputs = rms_norm_inputs(np.random.default_rng(4), (2, 70001), dtype)

    outputs = call_on(device, infiniop_py.rms_norm_backward, *inputs)

    assert_matches_reference(RMS_NORM, outputs, inputs, dtype)


def test_f16_many_rows_needs_f32_accumulation(device):
    """grad_w sums 8192 positive terms: an F16 accumulator stalls far outside the bound, F32 does not."""
    inputs = rms_norm_inputs(np.random.default_rng(5), (8192, 48), F16, positive=True)
    grad_y, x, w = (f64(a) for a in inputs)
    reference_grad_w = rms_norm_backward_reference(*inputs)[1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
    f16_accumulated_grad_w = f16_sequential_sum(grad_y * x * r, axis=0)
    assert relative_error(f16_accumulated_grad_w, reference_grad_w) > TOLERANCE[F16]

    outputs = call_on(device, infiniop_py.rms_norm_backward, *inputs)

    assert_matches_reference(RMS_NORM, outputs, inputs, F16)


def test_f16_long_rows_need_f32_accumulation(device):
    """sum(x^2) over 8192 positive terms: with an F16 accumulator r (hence grad_x) misses the bound."""
    inputs = rms_norm_inputs(np.random.default_rng(6), (4, 8192), F16, positive=True)
    grad_y, x, w = (f64(a) for a in inputs)
    reference_grad_x = rms_norm_backward_reference(*inputs)[0]
    r = 1.0 / np.sqrt(f64(f16_sequential_sum(x * x, axis=-1))[:, None] / x.shape[-1])
    f16_grad_x = r * grad_y * w - r**3 * x * np.sum(grad_y * w * x, -1, keepdims=True) / x.shape[-1]
    assert relative_error(f16_grad_x, reference_grad_x) > TOLERANCE[F16]

    outputs = call_on(device, infiniop_py.rms_norm_backward, *inputs)

    assert_matches_reference(RMS_NORM, outputs, inputs, F16)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_f32_accumulation_over_many_rows_and_long_rows(device, dtype):
    for shape in ((4096, 40), (3, 5, 4097)):
        inputs = rms_norm_inputs(np.random.default_rng(7), shape, dtype, positive=True)
        assert_matches_reference(RMS_NORM, call_on(device, infiniop_py.rms_norm_backward, *inputs), inputs, dtype)


def test_row_of_zeros_does_not_crash_other_rows(device):
    """Without epsilon a zero row divides by zero; the call must still return and the other rows be right."""
    grad_y, x, w = rms_norm_inputs(np.random.default_rng(8), (5, 33), F32)
    x[2] = 0

    grad_x, _ = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w)

    reference_grad_x = rms_norm_backward_reference(grad_y, x, w)[0]
    other_rows = [0, 1, 3, 4]
    assert_close(grad_x[other_rows], reference_grad_x[other_rows], F32, "grad_x")


@pytest.mark.parametrize("rows, dim", ((4, 64), (4, 1024), (140, 12000), (4, 20000)), ids=str)
def test_zero_row_with_an_epsilon_below_f32s_range(device, rows, dim):
    """eps = 1e-50, which F32 holds as 0, and a row of zeros: rstd = 1e25 and grad_x = 1e25 * grad_y * w, finite in
    BF16, that row's grad_w terms 0. On CUDA the plans whose row sums and rstd are F32 (warp rows at D = 64, the
    packed ones at 1024 and 12000: two vectors a thread, which rows over 4096 take only where they outnumber the
    SMs) gave NaN grad_x for the row and NaN grad_w for every column; D = 20000 takes the split plan (F64)."""
    grad_y, x, w = rms_norm_inputs(np.random.default_rng(dim), (rows, dim), BF16)
    x[1] = 0
    eps = 1e-50

    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, eps=eps)

    expected_x, expected_w, _ = rms_reference(grad_y, x, w, eps=eps)
    others = np.arange(rows) != 1
    assert_close(grad_x[1], expected_x[1], BF16, "grad_x of the zero row")
    assert_close(grad_x[others], expected_x[others], BF16, "grad_x of the other rows")
    assert_close(grad_w, expected_w, BF16, "grad_w")
    y, rstd = call_on(device, infiniop_py.rms_norm, x, w, eps=eps, need_rstd=True)  # the forward, the same rule
    assert np.all(np.isfinite(f64(y))) and f64(rstd)[1] == pytest.approx(1e25, rel=1e-6)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_single_element_rows(device, dtype):
    """D = 1: grad_x = r*g*w - r^3*x*(g*w*x) cancels to ~0, so max|ref| is rounding noise; measure the error
    on the scale of the cancelling terms instead."""
    inputs = rms_norm_inputs(np.random.default_rng(9), (7, 3, 1), dtype)
    grad_y, x, w = (f64(a) for a in inputs)
    term_scale = np.max(np.abs(grad_y * w / np.abs(x)))
    reference_grad_x, reference_grad_w = rms_norm_backward_reference(*inputs)

    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, *inputs)

    assert_close_on_scale(grad_x, reference_grad_x, dtype, term_scale, "grad_x")
    assert_close(grad_w, reference_grad_w, dtype, "grad_w")
