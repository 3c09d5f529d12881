"""BatchNorm backward numerics (functional API) against the float64 reference."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import infiniop_py
from _devices import DEVICES, call_on
from _helpers import (
    F16, F32, BF16, BATCH_NORM, FREE_LAYOUTS, SUPPORTED_DTYPES, TOLERANCE, VECTOR_LAYOUTS, GuardedOutput,
    assert_close, assert_close_on_scale, assert_matches_reference, batch_norm_backward_reference,
    batch_norm_inputs, f16_sequential_sum, f64, relative_error, with_free_layout,
)

pytestmark = pytest.mark.parametrize("device", DEVICES)

# N * L >= 3: with one element per channel the variance is 0 (division by zero); with two, xhat is about +-1
# and grad_input cancels to ~0 (max|ref| is rounding noise; tested on its own below).
shapes = st.tuples(st.integers(1, 5), st.integers(1, 6), st.sampled_from([1, 2, 3, 7, 16, 65, 300])).filter(
    lambda s: s[0] * s[2] >= 3)
dtypes = st.sampled_from(SUPPORTED_DTYPES)
seeds = st.integers(0, 2**32 - 1)


@given(shape=shapes, dtype=dtypes, seed=seeds, weight_layout=st.sampled_from(FREE_LAYOUTS),
       mean_layout=st.sampled_from(FREE_LAYOUTS), var_layout=st.sampled_from(FREE_LAYOUTS))
def test_strided_channel_vectors_match_reference(device, shape, dtype, seed, weight_layout, mean_layout, var_layout):
    x, grad_output, weight, mean, var = batch_norm_inputs(np.random.default_rng(seed), shape, dtype)
    if var_layout == "broadcast" or mean_layout == "broadcast":
        # Broadcast statistics are the batch statistics only when every channel holds channel 0's data.
        x = np.ascontiguousarray(np.broadcast_to(x[:, :1], shape))
        mean, var = np.full_like(mean, mean[0]), np.full_like(var, var[0])
    inputs = (x, grad_output, with_free_layout(weight, weight_layout), with_free_layout(mean, mean_layout),
              with_free_layout(var, var_layout))

    outputs = call_on(device, infiniop_py.batch_norm_backward, *inputs)

    for out, expected_shape in zip(outputs, (shape, shape[1:2], shape[1:2])):
        assert out.shape == expected_shape and out.dtype == dtype and out.flags.c_contiguous
    assert_matches_reference(BATCH_NORM, outputs, inputs, dtype)


@given(shape=shapes, dtype=dtypes, seed=seeds, grad_weight_layout=st.sampled_from(VECTOR_LAYOUTS),
       grad_bias_layout=st.sampled_from(VECTOR_LAYOUTS))
def test_writes_strided_preallocated_outputs(device, shape, dtype, seed, grad_weight_layout, grad_bias_layout):
    inputs = batch_norm_inputs(np.random.default_rng(seed), shape, dtype)
    guarded = (
        GuardedOutput(shape, dtype, "contiguous"),
        GuardedOutput(shape[1:2], dtype, grad_weight_layout),
        GuardedOutput(shape[1:2], dtype, grad_bias_layout),
    )

    returned = call_on(device, infiniop_py.batch_norm_backward, *inputs, out=tuple(g.view for g in guarded))

    assert all(np.shares_memory(r, g.view) for r, g in zip(returned, guarded))
    assert_matches_reference(BATCH_NORM, tuple(g.view for g in guarded), inputs, dtype)
    for g in guarded:
        g.assert_only_view_written()


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_in_place_grad_input_is_grad_output(device, dtype):
    x, grad_output, weight, mean, var = batch_norm_inputs(np.random.default_rng(1), (4, 5, 70), dtype)
    original_grad_output = grad_output.copy()
    grad_weight, grad_bias = np.empty(5, dtype), np.empty(5, dtype)

    call_on(device, infiniop_py.batch_norm_backward, x, grad_output, weight, mean, var,
            out=(grad_output, grad_weight, grad_bias))

    assert_matches_reference(BATCH_NORM, (grad_output, grad_weight, grad_bias),
                             (x, original_grad_output, weight, mean, var), dtype)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(0, 4, 16), (3, 4, 0)])
def test_empty_batch_gives_zero_weight_and_bias_gradients(device, dtype, shape):
    inputs = batch_norm_inputs(np.random.default_rng(2), shape, dtype)
    grad_weight, grad_bias = np.full(4, -1.0, dtype), np.full(4, -1.0, dtype)

    grad_input, _, _ = call_on(device, infiniop_py.batch_norm_backward, *inputs,
                               out=(np.empty(shape, dtype), grad_weight, grad_bias))

    assert grad_input.shape == shape
    assert np.array_equal(f64(grad_weight), np.zeros(4)) and np.array_equal(f64(grad_bias), np.zeros(4))


def test_zero_channels(device):
    inputs = batch_norm_inputs(np.random.default_rng(3), (3, 0, 8), F32)

    grad_input, grad_weight, grad_bias = call_on(device, infiniop_py.batch_norm_backward, *inputs)

    assert grad_input.shape == (3, 0, 8) and grad_weight.shape == (0,) and grad_bias.shape == (0,)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_channel_longer_than_65536(device, dtype):
    inputs = batch_norm_inputs(np.random.default_rng(4), (2, 2, 70001), dtype)

    outputs = call_on(device, infiniop_py.batch_norm_backward, *inputs)

    assert_matches_reference(BATCH_NORM, outputs, inputs, dtype)


def test_f16_large_batch_needs_f32_accumulation(device):
    """grad_bias sums 8192 positive terms per channel: an F16 accumulator stalls far outside the bound."""
    inputs = batch_norm_inputs(np.random.default_rng(5), (64, 3, 128), F16, positive=True)
    reference_grad_bias = batch_norm_backward_reference(*inputs)[2]
    per_channel = f64(inputs[1]).transpose(1, 0, 2).reshape(3, -1)
    assert relative_error(f16_sequential_sum(per_channel, axis=1), reference_grad_bias) > TOLERANCE[F16]

    outputs = call_on(device, infiniop_py.batch_norm_backward, *inputs)

    assert_matches_reference(BATCH_NORM, outputs, inputs, F16)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_f32_accumulation_over_large_batches(device, dtype):
    for shape in ((512, 4, 16), (3, 5, 4097)):
        inputs = batch_norm_inputs(np.random.default_rng(7), shape, dtype, positive=True)
        assert_matches_reference(BATCH_NORM, call_on(device, infiniop_py.batch_norm_backward, *inputs), inputs, dtype)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 4, 2), (2, 4, 1)])
def test_two_elements_per_channel(device, dtype, shape):
    """N * L = 2: xhat is about +-1 and grad_input cancels to ~0, so max|ref| is rounding noise; measure the
    error on the scale of the cancelling terms instead."""
    inputs = batch_norm_inputs(np.random.default_rng(9), shape, dtype)
    x, grad_output, weight, mean, var = (f64(a) for a in inputs)
    term_scale = np.max(np.abs(grad_output * (weight / np.sqrt(var))[None, :, None]))
    reference_grad_input, reference_grad_weight, reference_grad_bias = batch_norm_backward_reference(*inputs)

    grad_input, grad_weight, grad_bias = call_on(device, infiniop_py.batch_norm_backward, *inputs)

    assert_close_on_scale(grad_input, reference_grad_input, dtype, term_scale, "grad_input")
    assert_close(grad_weight, reference_grad_weight, dtype, "grad_weight")
    assert_close(grad_bias, reference_grad_bias, dtype, "grad_bias")
