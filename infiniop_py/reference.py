"""float64 references of the three operators, backward (design.md section 2) and forward (training, saving what the
backward takes), input makers, tolerances.

The references take the dT-rounded inputs (any float dtype) and compute in float64.
"""

import ml_dtypes
import numpy as np

# max|err| / max|ref| allowed for every output, by compute dtype.
TOLERANCES = {
    np.dtype(np.float32): 5e-5,
    np.dtype(np.float16): 2e-3,
    np.dtype(ml_dtypes.bfloat16): 1.6e-2,
}


def _f64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def rms_norm_backward(grad_y, x, w):
    grad_y, x, w = _f64(grad_y, x, w)
    d = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
    dot = np.sum(grad_y * w * x, axis=-1, keepdims=True)
    grad_x = r * (grad_y * w) - r**3 * x * dot / d
    grad_w = (grad_y * x * r).reshape(-1, d).sum(axis=0)
    return grad_x, grad_w


def layer_norm_backward(grad_output, weight, input_standardization, input_std_deviation):
    grad_output, weight, xhat, std = _f64(grad_output, weight, input_standardization, input_std_deviation)
    length = xhat.shape[-1]
    g = grad_output * weight
    grad_input = (g - g.mean(axis=-1, keepdims=True) - xhat * (g * xhat).mean(axis=-1, keepdims=True)) / std[..., None]
    grad_weight = (grad_output * xhat).reshape(-1, length).sum(axis=0)
    grad_bias = grad_output.reshape(-1, length).sum(axis=0)
    return grad_input, grad_weight, grad_bias


def batch_norm_backward(input, grad_output, weight, running_mean, running_var):
    x, grad_output, weight, mean, var = _f64(input, grad_output, weight, running_mean, running_var)
    count = x.shape[0] * x.shape[2]
    inv = 1.0 / np.sqrt(var)[None, :, None]
    xhat = (x - mean[None, :, None]) * inv
    sum_grad = grad_output.sum(axis=(0, 2))
    sum_grad_xhat = (grad_output * xhat).sum(axis=(0, 2))
    grad_input = weight[None, :, None] * inv * (
        grad_output - sum_grad[None, :, None] / count - xhat * sum_grad_xhat[None, :, None] / count
    )
    return grad_input, sum_grad_xhat, sum_grad


def rms_norm(x, w, eps=1e-6):
    """(y, rstd) of the RMSNorm forward over the last dim."""
    x, w = _f64(x, w)
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1) + eps)
    return x * rstd[..., None] * w, rstd


def layer_norm(x, w, b, eps=1e-5):
    """(y, mean, rstd) of the LayerNorm forward over the last dim (biased variance)."""
    x, w, b = _f64(x, w, b)
    mean = x.mean(axis=-1)
    rstd = 1.0 / np.sqrt(x.var(axis=-1) + eps)
    return (x - mean[..., None]) * rstd[..., None] * w + b, mean, rstd


def batch_norm(x, weight, bias, running_mean, running_var, eps=1e-5):
    """(y, save_mean, save_invstd) of the BatchNorm training forward over (N, C, L): batch statistics (biased
    variance); the running statistics are only updated, never read."""
    x, weight, bias = _f64(x, weight, bias)
    mean, invstd = x.mean(axis=(0, 2)), 1.0 / np.sqrt(x.var(axis=(0, 2)) + eps)
    y = (x - mean[None, :, None]) * (invstd * weight)[None, :, None] + bias[None, :, None]
    return y, mean, invstd


def make_forward_inputs(shape, dtype, rng, names):
    """x of ``shape`` (offset from zero) and, per name in ``names``, a parameter vector of the normalized dim (the last,
    or dim 1 for BatchNorm's (N, C, L)), rounded to ``dtype``."""
    dtype = np.dtype(dtype)
    length = shape[1] if "running_mean" in names else shape[-1]
    inputs = {"x": (rng.standard_normal(shape) * 1.5 + 0.5).astype(dtype)}
    for name in names:
        values = rng.standard_normal(length) if name != "running_var" else rng.uniform(0.5, 2.0, length)
        inputs[name] = values.astype(dtype)
    return inputs


def make_rms_norm_inputs(shape, dtype, rng):
    """grad_y, x of ``shape`` and w of (D,), rounded to ``dtype``."""
    dtype = np.dtype(dtype)
    return {
        "grad_y": rng.standard_normal(shape).astype(dtype),
        "x": rng.standard_normal(shape).astype(dtype),
        "w": rng.standard_normal(shape[-1:]).astype(dtype),
    }


def make_layer_norm_inputs(shape, dtype, rng, eps=1e-5):
    """grad_output, weight, and xhat / std made from a random x with ``eps`` in float64, then rounded."""
    dtype = np.dtype(dtype)
    x = rng.standard_normal(shape) * 2.0 + 0.5
    mean = x.mean(axis=-1, keepdims=True)
    std = np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    return {
        "grad_output": rng.standard_normal(shape).astype(dtype),
        "weight": rng.standard_normal(shape[-1:]).astype(dtype),
        "input_standardization": ((x - mean) / std).astype(dtype),
        "input_std_deviation": std[..., 0].astype(dtype),
    }


def make_batch_norm_inputs(shape, dtype, rng):
    """input, grad_output (N, C, L), weight, and the batch mean / biased variance of the rounded input."""
    dtype = np.dtype(dtype)
    x = (rng.standard_normal(shape) * 1.5 + 0.25).astype(dtype)
    x64 = x.astype(np.float64)
    return {
        "input": x,
        "grad_output": rng.standard_normal(shape).astype(dtype),
        "weight": rng.standard_normal(shape[1:2]).astype(dtype),
        "running_mean": x64.mean(axis=(0, 2)).astype(dtype),
        "running_var": x64.var(axis=(0, 2)).astype(dtype),
    }


def relative_error(actual, expected):
    """max|actual - expected| / max|expected|, in float64 (0 when both are empty)."""
    actual, expected = _f64(actual, expected)
    if expected.size == 0:
        return 0.0
    scale = np.max(np.abs(expected))
    error = np.max(np.abs(actual - expected))
    return float(error / scale) if scale > 0 else float(error)
