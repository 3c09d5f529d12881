"""The range of data magnitudes the kernels keep their bounds over (docs/guarantees.md, Numerics): F32 and BF16 data
scaled by 2^-60 and 2^52, forwards and backwards, rows of one vector, of short rows' block kernels and of more than
a 4096-element chunk, against float64 references with the usual per-dtype bounds, on every device.

The statistics are sums of squares in F32 lanes, so the top of the range is where a lane's sum of squares nears
F32's largest value (3.4e38): 2^52 (4.5e15) keeps data of standard-normal spread in rows of 5000 a factor of about
ten below it. The bottom is where squares near F32's smallest normal value (1.2e-38): 2^-60 (8.7e-19) squares to
7.5e-37. Row coefficients that are products of several statistics (RMSNorm's rstd^3, about |x|^-3) pass F32's range
far inside these bounds if formed in F32 in the wrong order."""

import numpy as np
import pytest

import infiniop_py
from _devices import DEVICES, call_on
from _helpers import (BF16, F32, TOLERANCE, assert_close, batch_norm_backward_reference, batch_norm_forward_reference,
                      f64, layer_norm_backward_reference, layer_norm_forward_reference, rms_norm_backward_reference,
                      rms_norm_forward_reference, rounded)

SCALES = {"2^-60": 2.0 ** -60, "2^52": 2.0 ** 52}
ROW_SHAPES = ((3, 16), (40, 128), (3, 5000))
BATCH_SHAPES = ((4, 3, 16), (2, 3, 2500))


def scaled_data(seed, shape, dtype, scale):
    """Data of standard-normal spread about an offset of the same size, times scale, rounded to dtype."""
    rng = np.random.default_rng(seed)
    return rounded((rng.standard_normal(shape) + rng.uniform(-2, 2)) * scale, dtype)


def parameters(seed, length, dtype):
    rng = np.random.default_rng(seed)
    return rounded(rng.normal(1.0, 0.5, length), dtype), rounded(rng.standard_normal(length), dtype)


def assert_each_close(actual, reference, dtype, names):
    for name, a, r in zip(names, actual, reference):
        assert np.all(np.isfinite(f64(a))), f"{name}: not finite"
        assert_close(a, r, dtype, name)


def each_case(shapes):
    """Every device, shape, scale and dtype."""
    def decorate(test):
        test = pytest.mark.parametrize("device", DEVICES)(test)
        test = pytest.mark.parametrize("dtype", (F32, BF16), ids=str)(test)
        test = pytest.mark.parametrize("scale", SCALES.values(), ids=SCALES.keys())(test)
        return pytest.mark.parametrize("shape", shapes, ids=str)(test)
    return decorate


@each_case(ROW_SHAPES)
def test_rms_norm_forward_and_backward(device, shape, scale, dtype):
    x = scaled_data(0, shape, dtype, scale)
    w, _ = parameters(1, shape[-1], dtype)
    grad_y = scaled_data(2, shape, dtype, 1.0)

    y, rstd = call_on(device, infiniop_py.rms_norm, x, w, eps=0.0, need_rstd=True)
    assert_each_close((y, rstd), rms_norm_forward_reference(x, w, 0.0), dtype, ("y", "rstd"))
    grads = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w)
    assert_each_close(grads, rms_norm_backward_reference(grad_y, x, w), dtype, ("grad_x", "grad_w"))


@each_case(ROW_SHAPES)
def test_layer_norm_forward_and_backward(device, shape, scale, dtype):
    x = scaled_data(3, shape, dtype, scale)
    w, b = parameters(4, shape[-1], dtype)
    grad_output = scaled_data(5, shape, dtype, 1.0)

    y, mean, rstd = call_on(device, infiniop_py.layer_norm, x, w, b, eps=0.0, need_stats=True)
    reference = layer_norm_forward_reference(x, w, b, 1, 0.0)
    assert_each_close((y, mean, rstd), reference[:3], dtype, ("y", "mean", "rstd"))
    # The backward from the input and the statistics the forward saved, against the float64 one of the same.
    grads = call_on(device, infiniop_py.layer_norm_backward, grad_output, w, input=x, mean=mean, rstd=rstd)
    xhat = (f64(x) - f64(mean)[:, None]) * f64(rstd)[:, None]
    expected = layer_norm_backward_reference(grad_output, w, xhat, 1.0 / f64(rstd))
    assert_each_close(grads, expected, dtype, ("grad_input", "grad_weight", "grad_bias"))


@each_case(BATCH_SHAPES)
def test_batch_norm_forward_and_backward(device, shape, scale, dtype):
    x = scaled_data(6, shape, dtype, scale)
    weight, bias = parameters(7, shape[1], F32)
    grad_output = scaled_data(8, shape, dtype, 1.0)

    y, save_mean, save_invstd = call_on(device, infiniop_py.batch_norm, x, weight, bias, eps=0.0, need_stats=True)
    reference = batch_norm_forward_reference(x, weight, bias, None, None, True, 0.1, 0.0)
    assert_each_close((y, save_mean, save_invstd), reference[:3], dtype, ("y", "save_mean", "save_invstd"))
    mean, var = f64(x).mean(axis=(0, 2)), f64(x).var(axis=(0, 2))
    grads = call_on(device, infiniop_py.batch_norm_backward, x, grad_output, weight, rounded(mean, F32),
                    rounded(var, F32))
    expected = batch_norm_backward_reference(x, grad_output, weight, rounded(mean, F32), rounded(var, F32))
    assert_each_close(grads, expected, dtype, ("grad_input", "grad_weight", "grad_bias"))
