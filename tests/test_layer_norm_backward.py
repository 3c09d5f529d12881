"""LayerNorm backward numerics (functional API) against the float64 reference."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import infiniop_py
from _devices import DEVICES, call_on
from _helpers import (
    F16, F32, BF16, FREE_LAYOUTS, INPUT_ROW_LAYOUTS, LAYER_NORM, ROW_LAYOUTS, SUPPORTED_DTYPES, TOLERANCE,
    VECTOR_LAYOUTS, GuardedOutput, assert_close, assert_close_on_scale, assert_matches_reference,
    f16_sequential_sum, f64, layer_norm_backward_reference, layer_norm_inputs, relative_error, with_free_layout,
    with_row_layout,
)

pytestmark = pytest.mark.parametrize("device", DEVICES)

leading_shapes = st.one_of(
    st.tuples(st.integers(1, 9)),
    st.tuples(st.integers(1, 4), st.integers(1, 5)),
)
# L <= 2 makes grad_input cancel to ~0 (max|ref| is rounding noise): tested on its own below.
row_lengths = st.sampled_from([3, 4, 7, 8, 31, 64, 129, 1000, 4099])  # 4099: a 16-bit weight read as stored
dtypes = st.sampled_from(SUPPORTED_DTYPES)
seeds = st.integers(0, 2**32 - 1)


@given(lead=leading_shapes, length=row_lengths, dtype=dtypes, seed=seeds,
       grad_output_layout=st.sampled_from(INPUT_ROW_LAYOUTS), xhat_layout=st.sampled_from(INPUT_ROW_LAYOUTS),
       weight_layout=st.sampled_from(FREE_LAYOUTS), std_layout=st.sampled_from(FREE_LAYOUTS))
@example(lead=(1,), length=7, dtype=F16, seed=0,  # a single row
         grad_output_layout="padded", xhat_layout="reversed", weight_layout="stride2", std_layout="reversed")
def test_strided_inputs_match_reference(device, lead, length, dtype, seed, grad_output_layout, xhat_layout,
                                        weight_layout, std_layout):
    grad_output, weight, xhat, std = layer_norm_inputs(np.random.default_rng(seed), lead + (length,), dtype)
    inputs = (
        with_row_layout(grad_output, grad_output_layout),
        with_free_layout(weight, weight_layout),
        with_row_layout(xhat, xhat_layout),
        with_free_layout(std, std_layout),
    )

    outputs = call_on(device, infiniop_py.layer_norm_backward, *inputs)

    for out, shape in zip(outputs, (lead + (length,), (length,), (length,))):
        assert out.shape == shape and out.dtype == dtype and out.flags.c_contiguous
    assert_matches_reference(LAYER_NORM, outputs, inputs, dtype)


@given(lead=leading_shapes, length=row_lengths, dtype=dtypes, seed=seeds,
       grad_input_layout=st.sampled_from(ROW_LAYOUTS), grad_weight_layout=st.sampled_from(VECTOR_LAYOUTS),
       grad_bias_layout=st.sampled_from(VECTOR_LAYOUTS))
def test_writes_strided_preallocated_outputs(device, lead, length, dtype, seed, grad_input_layout, grad_weight_layout,
                                             grad_bias_layout):
    inputs = layer_norm_inputs(np.random.default_rng(seed), lead + (length,), dtype)
    guarded = (
        GuardedOutput(lead + (length,), dtype, grad_input_layout),
        GuardedOutput((length,), dtype, grad_weight_layout),
        GuardedOutput((length,), dtype, grad_bias_layout),
    )

    returned = call_on(device, infiniop_py.layer_norm_backward, *inputs, out=tuple(g.view for g in guarded))

    assert all(np.shares_memory(r, g.view) for r, g in zip(returned, guarded))
    assert_matches_reference(LAYER_NORM, tuple(g.view for g in guarded), inputs, dtype)
    for g in guarded:
        g.assert_only_view_written()


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ROW_LAYOUTS)
def test_in_place_grad_input_is_grad_output(device, dtype, layout):
    grad_output, weight, xhat, std = layer_norm_inputs(np.random.default_rng(1), (5, 6, 80), dtype)
    grad_output = with_row_layout(grad_output, layout)
    original_grad_output = grad_output.copy()
    grad_weight, grad_bias = np.empty(80, dtype), np.empty(80, dtype)

    call_on(device, infiniop_py.layer_norm_backward, grad_output, weight, xhat, std,
            out=(grad_output, grad_weight, grad_bias))

    assert_matches_reference(LAYER_NORM, (grad_output, grad_weight, grad_bias),
                             (original_grad_output, weight, xhat, std), dtype)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0, 16), (0, 3, 16), (4, 0, 16)])
def test_zero_rows_give_zero_weight_and_bias_gradients(device, dtype, shape):
    inputs = layer_norm_inputs(np.random.default_rng(2), shape, dtype)
    grad_weight, grad_bias = np.full(16, -1.0, dtype), np.full(16, -1.0, dtype)

    grad_input, _, _ = call_on(device, infiniop_py.layer_norm_backward, *inputs,
                               out=(np.empty(shape, dtype), grad_weight, grad_bias))

    assert grad_input.shape == shape
    assert np.array_equal(f64(grad_weight), np.zeros(16)) and np.array_equal(f64(grad_bias), np.zeros(16))


@pytest.mark.parametrize("shape", [(3, 0), (2, 3, 0)])
def test_zero_length_rows(device, shape):
    inputs = layer_norm_inputs(np.random.default_rng(3), shape, F32)

    grad_input, grad_weight, grad_bias = call_on(device, infiniop_py.layer_norm_backward, *inputs)

    assert grad_input.shape == shape and grad_weight.shape == (0,) and grad_bias.shape == (0,)


@pytest.mark.parametrize("dtype", [F32, BF16, F16], ids=str)
def test_row_longer_than_65536(device, dtype):
    inputs = layer_norm_inputs(np.random.default_rng(4), (2, 70001), dtype)

    outputs = call_on(device, infiniop_py.layer_norm_backward, *inputs)

    assert_matches_reference(LAYER_NORM, outputs, inputs, dtype)


def test_f16_many_rows_needs_f32_accumulation(device):
    """grad_bias sums 8192 positive terms: an F16 accumulator stalls far outside the bound, F32 does not."""
    inputs = layer_norm_inputs(np.random.default_rng(5), (8192, 48), F16, positive=True)
    reference_grad_bias = layer_norm_backward_reference(*inputs)[2]
    assert relative_error(f16_sequential_sum(f64(inputs[0]), axis=0), reference_grad_bias) > TOLERANCE[F16]

    outputs = call_on(device, infiniop_py.layer_norm_backward, *inputs)

    assert_matches_reference(LAYER_NORM, outputs, inputs, F16)


def test_f16_long_rows_need_f32_accumulation(device):
    """mean(grad_output * weight) over 8192 mostly positive terms: an F16 accumulator spoils grad_input."""
    inputs = layer_norm_inputs(np.random.default_rng(6), (4, 8192), F16, positive=True)
    grad_output, weight, xhat, std = (f64(a) for a in inputs)
    reference_grad_input = layer_norm_backward_reference(*inputs)[0]
    g = grad_output * weight
    f16_mean_g = f64(f16_sequential_sum(g, axis=-1))[:, None] / g.shape[-1]
    f16_grad_input = (g - f16_mean_g - xhat * (g * xhat).mean(-1, keepdims=True)) / std[:, None]
    assert relative_error(f16_grad_input, reference_grad_input) > TOLERANCE[F16]

    outputs = call_on(device, infiniop_py.layer_norm_backward, *inputs)

    assert_matches_reference(LAYER_NORM, outputs, inputs, F16)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_f32_accumulation_over_many_rows_and_long_rows(device, dtype):
    for shape in ((4096, 40), (3, 5, 4097)):
        inputs = layer_norm_inputs(np.random.default_rng(7), shape, dtype, positive=True)
        assert_matches_reference(LAYER_NORM, call_on(device, infiniop_py.layer_norm_backward, *inputs), inputs, dtype)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("length", [1, 2])
def test_rows_of_one_or_two(device, dtype, length):
    """L <= 2: xhat is 0 or about +-1 and grad_input cancels to ~0, so max|ref| is rounding noise; measure the
    error on the scale of the cancelling terms instead."""
    inputs = layer_norm_inputs(np.random.default_rng(9), (6, 5, length), dtype)
    grad_output, weight, xhat, std = (f64(a) for a in inputs)
    term_scale = np.max(np.abs(grad_output * weight / std[..., None]))
    reference_grad_input, reference_grad_weight, reference_grad_bias = layer_norm_backward_reference(*inputs)

    grad_input, grad_weight, grad_bias = call_on(device, infiniop_py.layer_norm_backward, *inputs)

    assert_close_on_scale(grad_input, reference_grad_input, dtype, term_scale, "grad_input")
    assert_close(grad_weight, reference_grad_weight, dtype, "grad_weight")
    assert_close(grad_bias, reference_grad_bias, dtype, "grad_bias")
