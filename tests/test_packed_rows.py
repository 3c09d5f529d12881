"""The row backwards on F16/BF16 rows laid one stride apart: on CUDA these take the packed plans
(native/src/ops/row_backward_nvidia.cuh): rows of up to 512 elements 4-32 lanes of a warp a row (packedWarpRowsKernel,
one or two 16-byte vectors of each input a lane, no CTA barrier per row), longer ones a CTA a row (packedRowsKernel, one
16-byte vector of each input a thread, the next row loading through this one's single barrier). Every form that
reaches it, against float64 references of the exact rounded inputs: RMSNorm from x alone, with F32 weights and a
saved rstd, without grad_w; LayerNorm from xhat and std, and from the input with its mean and rstd; rows that end
inside a warp (D = 1000 and 3000), several rows a CTA (the prefetch and the alternating sum slots), one or several
leading dims. Rows that end inside a vector need padded rows (contiguous 16-bit rows 16 bytes apart hold whole
vectors): the padded-rows tests, which run the forwards' packed kernel too. The CPU runs the same cases."""

import collections

import numpy as np
import pytest

import infiniop_py
from _devices import DEVICES, EMULATED_CUDA, call_on
from _helpers import (BF16, F16, F32, LAYER_NORM_EPS, assert_close, at_vector_offset, empty_padded_rows, f64,
                      layer_norm_forward_reference, layer_norm_reference, rms_norm_forward_reference, rms_reference,
                      rounded)

# (leading dims, D): the warp rows' groups of 4, 8, 16 and 32 lanes a row with one vector a lane (D = 24, 64, 128,
# 256; more rows than a CTA's groups take at once, the last ones leaving part of a warp idle, which must still meet
# its butterflies) and a warp with two (D = 264: lane 0's second vector is the row's last, the other lanes' second
# ones empty); then the CTA-a-row plan's D from its least to its most; 141 rows of 4104 and 140 of 8192 are more
# than an H200's 132 SMs, which the packed plan needs for rows over 4096 (fewer take the split plan).
# Past 8192: D = 12004 (contiguous rows 24008 bytes apart: not the packed plans), and 16384: two vectors a thread
# (packedTwoVectorRowsKernel; LayerNorm's partials in shared memory by columns).
SHAPES = [((1100,), 24), ((300,), 64), ((5, 31), 128), ((70,), 256), ((9, 13), 264), ((67,), 512), ((4, 10), 1000),
          ((33,), 3000), ((3, 47), 4104), ((140,), 8192), ((140,), 12004), ((140,), 16384)]
DTYPES = (F16, BF16)


def _name(dtype):
    return np.dtype(dtype).name


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("leading, dim", SHAPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_forms(device, leading, dim, dtype):
    rng = np.random.default_rng(dim)
    shape = leading + (dim,)
    grad_y, x = (rounded(rng.standard_normal(shape) * rng.uniform(0.5, 2.0, leading + (1,)), dtype)
                 for _ in range(2))
    w = rounded(rng.uniform(0.5, 1.5, dim), dtype)
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w)
    expected_x, expected_w, _ = rms_reference(grad_y, x, w)
    assert_close(grad_x, expected_x, dtype, "grad_x")
    assert_close(grad_w, expected_w, dtype, "grad_w")

    # Ex: F32 weights and the forward's saved rstd (F32), grad_w not wanted.
    eps = 1e-6
    w32 = w.astype(F32)
    rstd = (1.0 / np.sqrt(np.mean(f64(x) ** 2, axis=-1) + eps)).astype(F32)
    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w32, eps=eps, rstd=rstd,
                             need_grad_weight=False)
    expected_x, _, _ = rms_reference(grad_y, x, w32, rstd=rstd)
    assert grad_w is None
    assert_close(grad_x, expected_x, dtype, "grad_x with a saved rstd")


@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
@pytest.mark.parametrize("leading, dim", SHAPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_forms(device, leading, dim, dtype):
    rng = np.random.default_rng(dim + 1)
    shape = leading + (dim,)
    per_row = leading + (1,)
    grad_output = rounded(rng.standard_normal(shape), dtype)
    x = rounded(rng.standard_normal(shape) * rng.uniform(0.5, 3.0, per_row) + rng.uniform(-4, 4, per_row), dtype)
    weight = rounded(rng.uniform(0.5, 1.5, dim), dtype)

    # From xhat and std (std in the parameters' dtype, as the seed API has it).
    xhat = rounded(rng.standard_normal(shape), dtype)
    std = rounded(rng.uniform(0.5, 2.0, leading), dtype)
    outputs = call_on(device, infiniop_py.layer_norm_backward, grad_output, weight, xhat, std)
    for got, expected, what in zip(outputs, layer_norm_reference(grad_output, weight, xhat, std),
                                   ("grad_input", "grad_weight", "grad_bias")):
        assert_close(got, expected, dtype, what)

    # From the input, its mean and rstd (F32), with F32 parameters.
    mean = f64(x).mean(-1)
    rstd = 1.0 / np.sqrt(f64(x).var(-1) + LAYER_NORM_EPS)
    mean, rstd = mean.astype(F32), rstd.astype(F32)
    weight32 = weight.astype(F32)
    outputs = call_on(device, infiniop_py.layer_norm_backward, grad_output, weight32, input=x, mean=mean, rstd=rstd)
    xhat_exact = (f64(x) - f64(mean)[..., None]) * f64(rstd)[..., None]
    expected = layer_norm_reference(grad_output, weight32, xhat_exact, 1.0 / f64(rstd))
    for got, want, what in zip(outputs, expected, ("grad_input", "grad_weight", "grad_bias")):
        assert_close(got, want, dtype, f"{what} from the input")


# Padded rows, every tensor's 16 bytes apart, from an aligned base (the row ends inside a vector: its last vector
# element by element) and from one off the 16-byte grid (`vectors` false: every vector element by element), in the
# packed kernels of the forwards (F16/BF16/F32) and backwards (F16/BF16). (leading dims, D, padded row length): warp
# rows, a CTA a row, and two vectors a thread (both forwards and both backwards).
PADDED_ROWS = [((300,), 60, 64), ((33,), 1001, 1008), ((20,), 12004, 12008)]
BASES = {"aligned": 0, "off-grid": 1}  # elements past a 16-byte boundary


def _padded_rows(rng, leading, dim, padded, dtype, spread, base):
    full = rng.standard_normal(leading + (padded,)) * rng.uniform(0.5, 2.0, leading + (1,)) + spread
    return at_vector_offset(rounded(full, dtype), BASES[base] * np.dtype(dtype).itemsize)[..., :dim]


def _padded_empty(leading, dim, padded, dtype, base):
    return empty_padded_rows(leading, dim, padded, dtype, BASES[base] * np.dtype(dtype).itemsize)


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("dtype", (BF16, F32), ids=str)
@pytest.mark.parametrize("leading, dim, padded", PADDED_ROWS, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_padded_rows(device, leading, dim, padded, dtype, base):
    eps = 1e-6
    rng = np.random.default_rng(dim + 2)
    x, grad_y = (_padded_rows(rng, leading, dim, padded, dtype, 0.0, base) for _ in range(2))
    w = rounded(rng.uniform(0.5, 1.5, dim), dtype)

    y, rstd = call_on(device, infiniop_py.rms_norm, x, w, eps=eps, need_rstd=True,
                      out=(_padded_empty(leading, dim, padded, dtype, base), np.empty(leading, F32)))
    expected_y, expected_rstd = rms_norm_forward_reference(x, w, eps)
    assert_close(y, expected_y, dtype, "y")
    assert_close(rstd, expected_rstd, F32, "rstd")

    grad_x, grad_w = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, eps=eps,
                             out=(_padded_empty(leading, dim, padded, dtype, base), np.empty(dim, dtype)))
    expected_x, expected_w, _ = rms_reference(grad_y, x, w, eps=eps)
    assert_close(grad_x, expected_x, dtype, "grad_x")
    assert_close(grad_w, expected_w, dtype, "grad_w")


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("dtype", (BF16, F32), ids=str)
@pytest.mark.parametrize("leading, dim, padded", PADDED_ROWS, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_padded_rows(device, leading, dim, padded, dtype, base):
    rng = np.random.default_rng(dim + 3)
    x = _padded_rows(rng, leading, dim, padded, dtype, 3.0, base)
    grad_output = _padded_rows(rng, leading, dim, padded, dtype, 0.0, base)
    w, b = rounded(rng.uniform(0.5, 1.5, dim), dtype), rounded(rng.normal(0.0, 0.5, dim), dtype)

    y, mean, rstd = call_on(device, infiniop_py.layer_norm, x, w, b, eps=LAYER_NORM_EPS, need_stats=True,
                            out=(_padded_empty(leading, dim, padded, dtype, base), np.empty(leading, F32),
                                 np.empty(leading, F32)))
    expected_y, expected_mean, expected_rstd, _, _ = layer_norm_forward_reference(x, w, b, 1, LAYER_NORM_EPS)
    assert_close(y, expected_y, dtype, "y")
    assert_close(mean, expected_mean, F32, "mean")
    assert_close(rstd, expected_rstd, F32, "rstd")

    outputs = call_on(device, infiniop_py.layer_norm_backward, grad_output, w, input=x, mean=mean, rstd=rstd,
                      out=(_padded_empty(leading, dim, padded, dtype, base), np.empty(dim, dtype),
                           np.empty(dim, dtype)))
    xhat_exact = (f64(x) - f64(mean)[..., None]) * f64(rstd)[..., None]
    expected = layer_norm_reference(grad_output, w, xhat_exact, 1.0 / f64(rstd))
    for got, want, what in zip(outputs, expected, ("grad_input", "grad_weight", "grad_bias")):
        assert_close(got, want, dtype, what)


# A device that gives a CTA less shared memory than the two-vector packed kernels keep w (and b, or the partials)
# in: 64 KiB, the LayerNorm forward's 128, its backward's 192. An A100 gives 163 KiB, so there LayerNorm's
# backward, on an RTX 30xx/40xx's 99 KiB its forward too, and on a device of 48 KiB every two-vector plan, must
# take other kernels, with the same results. The CPU emulation of CUDA takes the limit
# from INFINIOP_EMULATED_CUDA_SHARED_BYTES and fails a launch past it, as a GPU does.
@pytest.mark.nvidia
@pytest.mark.parametrize("shared_bytes", (166912, 101376, 49152))
def test_two_vector_rows_on_a_device_with_less_shared_memory(monkeypatch, shared_bytes):
    if not EMULATED_CUDA:
        pytest.skip("sets the emulated device's shared memory per CTA; a GPU has its own")
    monkeypatch.setenv("INFINIOP_EMULATED_CUDA_SHARED_BYTES", str(shared_bytes))
    # The functional API's operators, planned for the device's limit at their creation: new ones for this limit.
    monkeypatch.setattr(infiniop_py._functional, "_operators", collections.OrderedDict())
    test_rms_norm_padded_rows("nvidia", (20,), 12004, 12008, BF16, "aligned")
    test_layer_norm_padded_rows("nvidia", (20,), 12004, 12008, BF16, "aligned")
