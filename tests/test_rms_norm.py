"""RMSNorm forward (functional API and operator objects; the values on every device) against float64 references
from the exact rounded inputs and against torch.nn.functional.rms_norm; its rstd against what the backward takes."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import infiniop_py
from infiniop_py import errors
from _devices import DEVICES, call_on
from _helpers import (
    BF16, F16, F32, F64, FREE_LAYOUTS, INPUT_ROW_LAYOUTS, ROW_LAYOUTS, GuardedOutput, f16_sequential_sum, f64,
    PACKED_DTYPES, PACKED_ROWS, empty_padded_rows, rounded, with_free_layout, with_row_layout,
)
from _helpers import rms_norm_forward_reference as reference

# Per element, |y - ref| <= bound * |ref| + the dtype's smallest subnormal: the output's own rounding (half an
# ulp: 2^-11 for F16, 2^-8 for BF16) plus 1e-5 for F32 arithmetic. rstd (F32 for F32/F16/BF16 data) within 1e-5
# of its reference. An F16 sum of squares misses both on long rows (test_f16_accumulation_misses_the_bounds).
Y_BOUND = {F32: 1e-5, F16: 2.0**-11 + 1e-5, BF16: 2.0**-8 + 1e-5, F64: 1e-13}
RSTD_BOUND = {F32: 1e-5, F16: 1e-5, BF16: 1e-5, F64: 1e-13}
TINY = {F32: 0.0, F16: 2.0**-24, BF16: 0.0, F64: 0.0}
DTYPES = (F16, BF16, F32, F64)
EPS = 1e-6


def y_error_ratio(actual, expected, dtype):
    """max over elements of |actual - expected| / (bound * |expected| + tiny): <= 1 passes."""
    actual, expected = f64(actual), f64(expected)
    allowed = Y_BOUND[np.dtype(dtype)] * np.abs(expected) + TINY[np.dtype(dtype)]
    return float(np.max(np.abs(actual - expected) / np.maximum(allowed, 1e-300), initial=0.0))


def assert_y_close(actual, expected, dtype):
    ratio = y_error_ratio(actual, expected, dtype)
    assert ratio <= 1.0, f"y ({np.dtype(dtype).name}): error {ratio:.3g} x the bound {Y_BOUND[np.dtype(dtype)]:g}"


def assert_rstd_close(actual, expected, dtype):
    actual, expected = f64(actual), f64(expected)
    err = float(np.max(np.abs(actual - expected) / np.abs(expected), initial=0.0))
    assert err <= RSTD_BOUND[np.dtype(dtype)], f"rstd ({np.dtype(dtype).name}): relative error {err:.3g}"


def inputs(rng, shape, normalized, dtype, weight_dtype=None):
    x = rounded(rng.standard_normal(shape) * rng.uniform(0.2, 5.0), dtype)
    w = rounded(rng.normal(1.0, 0.5, shape[len(shape) - normalized:]), weight_dtype or dtype)
    return x, w


def forward_on(device, x, w, eps=EPS, out=None):
    """(y, rstd) of infiniop_py.rms_norm on ``device`` (out=: the arrays written back; rstd None: not wanted)."""
    if out is not None and out[1] is None:
        return call_on(device, lambda *a, **k: (infiniop_py.rms_norm(*a, **k), None), x, w, eps=eps, out=out)
    return call_on(device, infiniop_py.rms_norm, x, w, eps=eps, need_rstd=True, out=out)


def weight_dtypes_for(dtype):
    return (dtype, F32) if dtype in (F16, BF16) else (dtype,)


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)
row_lengths = st.sampled_from([1, 2, 7, 16, 31, 33, 64, 100, 129, 1000, 4099])  # 4099: a 16-bit weight read as stored
dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**32 - 1)


@given(lead=shapes, d=row_lengths, dtype=dtypes, f32_weight=st.booleans(), seed=seeds,
       x_layout=st.sampled_from(INPUT_ROW_LAYOUTS), w_layout=st.sampled_from(FREE_LAYOUTS),
       need_rstd=st.booleans())
@example(lead=(1,), d=7, dtype=F16, f32_weight=False, seed=0, x_layout="reversed", w_layout="stride2",
         need_rstd=True)
@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs_match_reference(device, lead, d, dtype, f32_weight, seed, x_layout, w_layout, need_rstd):
    weight_dtype = F32 if f32_weight and dtype in (F16, BF16) else dtype
    x, w = inputs(np.random.default_rng(seed), lead + (d,), 1, dtype, weight_dtype)
    x, w = with_row_layout(x, x_layout), with_free_layout(w, w_layout)

    if device == "cpu":
        result = infiniop_py.rms_norm(x, w, eps=EPS, need_rstd=need_rstd)
        y, rstd = result if need_rstd else (result, None)
    else:
        y, rstd = forward_on(device, x, w)

    expected_y, expected_rstd = reference(x, w, EPS)
    assert y.shape == x.shape and y.dtype == dtype and (device != "cpu" or y.flags.c_contiguous)
    assert_y_close(y, expected_y, dtype)
    if need_rstd:
        assert rstd.shape == lead and rstd.dtype == (F64 if dtype == F64 else F32)
        assert_rstd_close(rstd, expected_rstd, dtype)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=5).map(tuple), data=st.data(), dtype=dtypes,
       seed=seeds)
@pytest.mark.parametrize("device", DEVICES)
def test_several_normalized_dims(device, shape, data, dtype, seed):
    """w's rank k normalizes the last k dims together, from one leading dim to none (a single row)."""
    normalized = data.draw(st.integers(1, len(shape)))
    x, w = inputs(np.random.default_rng(seed), shape, normalized, dtype)

    y, rstd = forward_on(device, x, w)

    expected_y, expected_rstd = reference(x, w, EPS)
    assert rstd.shape == shape[:len(shape) - normalized]
    assert_y_close(y, expected_y, dtype)
    assert_rstd_close(rstd, expected_rstd, dtype)


@given(lead=shapes, d=row_lengths, dtype=dtypes, seed=seeds, y_layout=st.sampled_from(ROW_LAYOUTS),
       rstd_layout=st.sampled_from(("contiguous", "stride2", "reversed")))
@pytest.mark.parametrize("device", DEVICES)
def test_writes_strided_preallocated_outputs(device, lead, d, dtype, seed, y_layout, rstd_layout):
    x, w = inputs(np.random.default_rng(seed), lead + (d,), 1, dtype)
    statistics = F64 if dtype == F64 else F32
    y_out = GuardedOutput(lead + (d,), dtype, y_layout)
    # rstd takes its layout on one leading dim; other leading shapes take it packed.
    rstd_out = GuardedOutput(lead, statistics, rstd_layout if len(lead) == 1 else "contiguous")

    returned = forward_on(device, x, w, out=(y_out.view, rstd_out.view))

    assert returned[0] is y_out.view and returned[1] is rstd_out.view
    expected_y, expected_rstd = reference(x, w, EPS)
    assert_y_close(y_out.view, expected_y, dtype)
    assert_rstd_close(rstd_out.view, expected_rstd, dtype)
    y_out.assert_only_view_written()
    rstd_out.assert_only_view_written()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 1 << 20), (1, 3 << 20), (2048, 4096), (40, 64, 96), (5, 16385),
                                   (300, 8192), (70, 24), (4096, 16)], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_every_schedule_matches_reference(device, dtype, shape):
    """CPU: few huge rows (split across threads at chunk boundaries), many long rows (the next row reduced alongside,
    streamed output), cached rows (column slices) and short ones (a row block per call): every schedule of the row
    driver. CUDA: rows in registers from a warp (several rows per CTA) to a CTA of 1024 threads, and rows longer
    than that re-read from L2."""
    x, w = inputs(np.random.default_rng(7), shape, 1, dtype)

    y, rstd = forward_on(device, x, w)

    expected_y, expected_rstd = reference(x, w, EPS)
    assert_y_close(y, expected_y, dtype)
    assert_rstd_close(rstd, expected_rstd, dtype)


def packed_rows_inputs(rng, leading, dim, padded, dtype, weight_dtype):
    full = rounded(rng.standard_normal(leading + (padded,)) * rng.uniform(0.2, 5.0, leading + (1,)), dtype)
    w = rounded(rng.normal(1.0, 0.5, dim), weight_dtype)
    return full[..., :dim], w


@pytest.mark.parametrize("dtype, weight_dtype", PACKED_DTYPES, ids=str)
@pytest.mark.parametrize("leading, dim, padded", PACKED_ROWS, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_packed_rows_match_reference(device, leading, dim, padded, dtype, weight_dtype):
    x, w = packed_rows_inputs(np.random.default_rng(dim), leading, dim, padded, dtype,
                              dtype if weight_dtype == "data" else weight_dtype)
    y, rstd = forward_on(device, x, w, out=(empty_padded_rows(leading, dim, padded, dtype), np.empty(leading, F32)))
    expected_y, expected_rstd = reference(x, w, EPS)
    assert_y_close(y, expected_y, dtype)
    assert_rstd_close(rstd, expected_rstd, dtype)
    y_only, _ = forward_on(device, x, w, out=(empty_padded_rows(leading, dim, padded, dtype), None))
    assert np.array_equal(y_only.view(np.uint8), y.view(np.uint8))  # the same y with or without rstd


@pytest.mark.parametrize("isa", ("generic", "avx2", "avx512", "avx512bf16"))
def test_every_isa_passes_the_bounds(tmp_path, isa):
    """Each ISA's kernels (a process picks one; asking for more than the CPU has gives what it has), on rows with
    partial vectors at both ends, 16-bit weights read as stored and widened, and a streamed output."""
    from _helpers import run_python_with_isa

    code = f"""
import ml_dtypes, numpy as np, infiniop_py
results = {{}}
for name, dtype in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("f32", np.float32)):
    for shape in ((37, 1029), (3, 8195), (520, 4099)):
        rng = np.random.default_rng(3)
        x = rng.standard_normal(shape).astype(dtype)[:, 3:]
        w = rng.normal(1.0, 0.5, shape[1] - 3).astype(dtype)
        y, rstd = infiniop_py.rms_norm(x, w, eps=1e-6, need_rstd=True)
        results[f"{{name}} {{shape}} x"], results[f"{{name}} {{shape}} w"] = x.astype(np.float64), w.astype(np.float64)
        results[f"{{name}} {{shape}} y"], results[f"{{name}} {{shape}} rstd"] = y.astype(np.float64), rstd
np.savez({str(tmp_path / "out.npz")!r}, **results)
"""
    run_python_with_isa(code, isa)
    results = np.load(tmp_path / "out.npz")
    for name, dtype in (("f16", F16), ("bf16", BF16), ("f32", F32)):
        for shape in ((37, 1029), (3, 8195), (520, 4099)):
            key = f"{name} {shape}"
            expected_y, expected_rstd = reference(results[f"{key} x"], results[f"{key} w"], EPS)
            assert_y_close(results[f"{key} y"], expected_y, dtype)
            assert_rstd_close(results[f"{key} rstd"], expected_rstd, dtype)


@pytest.mark.parametrize("dtype", (BF16, F32), ids=str)
@pytest.mark.parametrize("shape", [(6, 40), (96, 4096)], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_rows_of_tiny_values(device, dtype, shape):
    """Rows of values near 1e-20 (eps 0: their sum of squares alone sets rstd, near 1e20) among ordinary ones, the
    first row included: their squares are subnormal F32 numbers, which a sum that flushes them (FTZ arithmetic,
    or AVX512-BF16's vdpbf16ps) turns into rstd = inf. (96, 4096): rows reduced alongside the previous one's
    output."""
    rng = np.random.default_rng(17)
    scale = np.where(np.arange(shape[0]) % 3 == 0, 1e-20, 1.0)[:, None]
    x = rounded(rng.uniform(-2.0, 2.0, shape) * scale, dtype)
    w = rounded(rng.normal(1.0, 0.5, shape[1]), dtype)

    y, rstd = forward_on(device, x, w, eps=0.0)

    expected_y, expected_rstd = reference(x, w, 0.0)
    assert_y_close(y, expected_y, dtype)
    assert_rstd_close(rstd, expected_rstd, dtype)


def test_f16_accumulation_misses_the_bounds():
    """sum(x^2) over 8192 positive terms: an F16 accumulator's rstd, hence y, misses both bounds, so the bounds
    prove F32 accumulation."""
    rng = np.random.default_rng(6)
    x = rounded(rng.uniform(0.5, 1.5, (4, 8192)), F16)
    w = rounded(rng.uniform(0.5, 1.5, 8192), F16)
    expected_y, expected_rstd = reference(x, w, EPS)
    f16_rstd = 1.0 / np.sqrt(f64(f16_sequential_sum(f64(x) ** 2, axis=-1)) / x.shape[-1] + EPS)
    assert y_error_ratio(rounded(f64(x) * f16_rstd[:, None] * f64(w), F16), expected_y, F16) > 1.0
    assert float(np.max(np.abs(f16_rstd - expected_rstd) / expected_rstd)) > RSTD_BOUND[F16]

    y, rstd = infiniop_py.rms_norm(x, w, eps=EPS, need_rstd=True)

    assert_y_close(y, expected_y, F16)
    assert_rstd_close(rstd, expected_rstd, F16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 300), (40, 64)], ids=str)  # (40, 64): the block kernel's F32 rows in place
@pytest.mark.parametrize("device", DEVICES)
def test_in_place(device, shape, dtype):
    x, w = inputs(np.random.default_rng(2), shape, 1, dtype)
    expected_y, _ = reference(x, w, EPS)
    forward_on(device, x, w, out=(x, None))
    assert_y_close(x, expected_y, dtype)


def test_in_place_operator_object():
    x, w = inputs(np.random.default_rng(2), (5, 300), 1, F32)
    expected_y, _ = reference(x, w, EPS)
    with infiniop_py.Handle("cpu") as handle, infiniop_py.RMSNorm(handle, x, None, x, w, eps=EPS) as operator:
        operator(x, None, x, w)
    assert_y_close(x, expected_y, F32)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_sizes_and_zero_rows(device):
    w = np.ones(4, F32)
    y, rstd = forward_on(device, np.zeros((0, 4), F32), w)
    assert y.shape == (0, 4) and rstd.shape == (0,)
    y, rstd = forward_on(device, np.zeros((3, 0), F32), np.ones(0, F32), eps=0.0)
    assert y.shape == (3, 0) and np.isnan(rstd).all()  # the mean of no elements is 0/0
    y, rstd = forward_on(device, np.zeros((2, 4), F32), w, eps=0.0)  # r = inf: nothing traps
    assert np.isinf(rstd).all() and np.isnan(y).all()


# ---------------------------------------------------------------- against torch

@pytest.mark.parametrize("dtype", ("float16", "bfloat16", "float32", "float64"))
@pytest.mark.parametrize("normalized_shape", [(64,), (6, 32), (4099,)], ids=str)
def test_matches_torch_rms_norm(dtype, normalized_shape):
    """On torch tensors (outputs come back as torch tensors): within the bound of the exact value, and within two
    roundings of torch.nn.functional.rms_norm, which may round an intermediate to the dtype."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(4)
    x = torch.randn((3, 5) + normalized_shape, generator=generator).to(getattr(torch, dtype))
    w = torch.randn(normalized_shape, generator=generator).to(getattr(torch, dtype))

    y = infiniop_py.rms_norm(x, w, eps=EPS)

    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and y.shape == x.shape
    numpy_dtype = {"float16": F16, "bfloat16": BF16, "float32": F32, "float64": F64}[dtype]
    exact, _ = reference(x.double().numpy(), w.double().numpy(), EPS)
    assert_y_close(y.double().numpy(), exact, numpy_dtype)
    expected = torch.nn.functional.rms_norm(x, list(normalized_shape), w, eps=EPS).double().numpy()
    mine = y.double().numpy()
    allowed = 2 * (2 * Y_BOUND[numpy_dtype] * np.abs(exact) + TINY[numpy_dtype])
    assert np.all(np.abs(mine - expected) <= allowed), float(np.max(np.abs(mine - expected) / allowed))


# ---------------------------------------------------------------- the rstd the backward takes

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, normalized", [((4, 7, 96), 1), ((3, 5, 8, 16), 2), ((2, 4099), 1)], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_rstd_feeds_the_backward(device, dtype, shape, normalized):
    """The forward's rstd, passed to rms_norm_backward(rstd=...), gives the grads that recomputing it gives."""
    rng = np.random.default_rng(9)
    x, w = inputs(rng, shape, normalized, dtype)
    grad_y = rounded(rng.standard_normal(shape), dtype)
    eps = 1e-5

    _, rstd = forward_on(device, x, w, eps=eps)
    saved = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, rstd=rstd)
    recomputed = call_on(device, infiniop_py.rms_norm_backward, grad_y, x, w, eps=eps)

    for name, from_saved, from_recomputed in zip(("grad_x", "grad_w"), saved, recomputed):
        scale = float(np.max(np.abs(f64(from_recomputed))))
        err = float(np.max(np.abs(f64(from_saved) - f64(from_recomputed))))
        # The same F32 rstd either way up to its own rounding: the grads agree to their dtype's rounding.
        bound = {F16: 2e-3, BF16: 1.6e-2, F32: 1e-5, F64: 1e-12}[np.dtype(dtype)]
        assert err <= bound * scale, f"{name}: {err:.3g} > {bound} * {scale:.3g}"


# ---------------------------------------------------------------- operator objects and bad input

def test_operator_object_runs_repeatedly_and_closes():
    rng = np.random.default_rng(1)
    x, w = inputs(rng, (8, 64), 1, F32)
    y, rstd = np.empty_like(x), np.empty(8, F32)
    with infiniop_py.Handle("cpu") as handle:
        operator = infiniop_py.RMSNorm(handle, y, rstd, x, w, eps=EPS)
        for seed in (2, 3):
            x, w = inputs(np.random.default_rng(seed), (8, 64), 1, F32)
            operator(y, rstd, x, w)
            expected_y, expected_rstd = reference(x, w, EPS)
            assert_y_close(y, expected_y, F32)
            assert_rstd_close(rstd, expected_rstd, F32)
        operator.close()
        operator.close()
        with pytest.raises(errors.ClosedError):
            operator(y, rstd, x, w)


def test_tensor_descriptors_may_go_right_after_create():
    x, w = inputs(np.random.default_rng(1), (4, 32), 1, F16)
    y = np.empty_like(x)
    with infiniop_py.Handle("cpu") as handle:
        descs = [infiniop_py.TensorDesc(a.shape, a.dtype) for a in (y, x, w)]
        operator = infiniop_py.RMSNorm(handle, descs[0], None, descs[1], descs[2], eps=EPS)
        for desc in descs:
            desc.close()
        operator(y, None, x, w)
        operator.close()
    assert_y_close(y, reference(x, w, EPS)[0], F16)


@pytest.mark.parametrize("call, error, message", [
    (lambda x, w: infiniop_py.rms_norm(x.astype(np.int32), w), errors.BadTensorDtypeError, r"^x: dtype I32"),
    (lambda x, w: infiniop_py.rms_norm(x, w.astype(np.float64)), errors.BadTensorDtypeError, r"^w: dtype F64"),
    (lambda x, w: infiniop_py.rms_norm(x.astype(BF16), w.astype(F16)), errors.BadTensorDtypeError, r"^w: dtype F16"),
    (lambda x, w: infiniop_py.rms_norm(x, w[:-1]), errors.BadTensorShapeError, r"^w: shape \(15,\)"),
    (lambda x, w: infiniop_py.rms_norm(x, np.ones((2, 3, 16), F32)), errors.BadTensorShapeError, r"rank 2.*3 normalized"),
    (lambda x, w: infiniop_py.rms_norm(x, w, eps=-1.0), errors.BadParamError, r"^epsilon: -1.0"),
    (lambda x, w: infiniop_py.rms_norm(x, w, eps=float("nan")), errors.BadParamError, r"^epsilon: nan"),
    (lambda x, w: infiniop_py.rms_norm(x, w, need_rstd=True, out=(np.empty_like(x), np.empty(4, F32))),
     errors.BadTensorShapeError, r"^out\[1\], rstd: shape \(4,\) must be \(3,\)"),
    (lambda x, w: infiniop_py.rms_norm(x, w, need_rstd=True, out=(np.empty_like(x), np.empty(3, F16))),
     errors.BadTensorDtypeError, r"^rstd: dtype F16 must be F32"),
    (lambda x, w: infiniop_py.rms_norm(x, w, out=(np.empty_like(x), np.empty(3, F32))), ValueError,
     r"rstd is not wanted"),
    (lambda x, w: infiniop_py.rms_norm(x, None), TypeError, r"^w: expected an array"),
])
def test_bad_input_raises_a_named_error(call, error, message):
    x, w = inputs(np.random.default_rng(0), (3, 16), 1, F32)
    with pytest.raises(error, match=message):
        call(x, w)


def test_operator_refuses_overlapping_outputs_by_name():
    x, w = inputs(np.random.default_rng(0), (3, 16), 1, F32)
    with infiniop_py.Handle("cpu") as handle:
        with pytest.raises(errors.BadTensorStridesError, match=r"^y: strides"):
            infiniop_py.RMSNorm(handle, ((3, 16), F32, (0, 1)), None, x, w)
        with pytest.raises(errors.BadTensorStridesError, match=r"^rstd: strides"):
            infiniop_py.RMSNorm(handle, np.empty_like(x), ((3,), F32, (0,)), x, w)
        with pytest.raises(errors.BadTensorStridesError, match=r"^x: strides .* last 1 \(normalized\) dims packed"):
            infiniop_py.RMSNorm(handle, np.empty_like(x), None, ((3, 16), F32, (32, 2)), w)
        y = np.empty_like(x)
        with infiniop_py.RMSNorm(handle, y, np.empty(3, F32), x, w) as operator:
            with pytest.raises(errors.BadParamError, match="rstd"):
                operator(y, y.reshape(-1)[:3], x, w)  # rstd inside y


def test_without_ex_entry_points_the_seed_runs(monkeypatch):
    """Against an InfiniCore install (no ...Ex), the seed create takes epsilon and the seed run y, x, w; asking
    for rstd names the missing function."""
    from infiniop_py import _operator

    real = _operator._native_function
    monkeypatch.setattr(_operator, "_native_function",
                        lambda library, name: None if name.endswith("Ex") else real(library, name))
    x, w = inputs(np.random.default_rng(5), (6, 48), 1, F16)
    y = np.empty_like(x)
    with infiniop_py.Handle("cpu") as handle:
        with infiniop_py.RMSNorm(handle, y, None, x, w, eps=1e-3) as operator:
            operator(y, None, x, w)
            with pytest.raises(ValueError, match="rstd: the operator was created without it"):
                operator(y, np.empty(6, F32), x, w)
        with pytest.raises(errors.NotImplementedStatusError, match="rstd.*RMSNormDescriptorEx"):
            infiniop_py.RMSNorm(handle, y, np.empty(6, F32), x, w)
    assert_y_close(y, reference(x, w, float(np.float32(1e-3)))[0], F16)
