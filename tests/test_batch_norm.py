"""BatchNorm forward (functional API and operator objects; the values on every device) against float64 references
from the exact rounded inputs and against torch.nn.functional.batch_norm; its saved statistics against what the
backward takes."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import infiniop_py
from infiniop_py import errors
from _devices import DEVICES, DeviceData
from _helpers import BF16, F16, F32, F64, f16_sequential_sum, f64, rounded
from _helpers import batch_norm_forward_reference as reference

# Per element, |y - ref| <= bound * (|ref| + |weight| + |bias|) + tiny: the output's own rounding (half an ulp: 2^-11
# for F16, 2^-8 for BF16) plus F32 arithmetic on (x - r) * scale + shift (y's scale is that of the weight and bias,
# as (x - mean) * invstd is O(1)). Statistics within STAT_BOUND (relative; mean: of the channel's spread).
# An F16 accumulation of the sums misses them (test_f16_accumulation_misses_the_bounds).
Y_BOUND = {F32: 2e-6, F16: 2.0**-11 + 2e-6, BF16: 2.0**-8 + 2e-6, F64: 1e-13}
STAT_BOUND = {F32: 1e-5, F16: 1e-5, BF16: 1e-5, F64: 1e-12}
TINY = {F32: 0.0, F16: 2.0**-24, BF16: 0.0, F64: 0.0}
DTYPES = (F16, BF16, F32, F64)


def y_error_ratio(actual, expected, dtype, weight, bias):
    channels = expected.shape[1]
    per_channel = (1, channels) + (1,) * (expected.ndim - 2)
    scale = np.abs(f64(expected))
    for vector in (weight, bias):
        if vector is not None:
            scale = scale + np.abs(f64(vector)).reshape(per_channel)
    allowed = Y_BOUND[np.dtype(dtype)] * np.maximum(scale, 1.0 if weight is None else 0.0) + TINY[np.dtype(dtype)]
    return float(np.max(np.abs(f64(actual) - f64(expected)) / np.maximum(allowed, 1e-300), initial=0.0))


def assert_y_close(actual, expected, dtype, weight=None, bias=None):
    ratio = y_error_ratio(actual, expected, dtype, weight, bias)
    assert ratio <= 1.0, f"y ({np.dtype(dtype).name}): error {ratio:.3g} x the bound"


def assert_relative(actual, expected, bound, what):
    err = float(np.max(np.abs(f64(actual) - f64(expected)) / np.maximum(np.abs(f64(expected)), 1e-300), initial=0))
    assert err <= bound, f"{what}: relative error {err:.3g} > {bound:g}"


def channels_last(array):
    """The same values laid out channels-last (C innermost, then the spatial dims, then N)."""
    order = (0,) + tuple(range(2, array.ndim)) + (1,)
    inverse = np.argsort(order)
    return np.ascontiguousarray(array.transpose(order)).transpose(inverse)


def make_inputs(rng, shape, dtype, parameter_dtype, offset=2.0):
    channels = shape[1]
    per_channel = (1, channels) + (1,) * (len(shape) - 2)
    x = rng.standard_normal(shape) * rng.uniform(0.5, 3.0, per_channel) + rng.uniform(-offset, offset, per_channel)
    vectors = [rounded(values, parameter_dtype) for values in (
        rng.normal(1.0, 0.5, channels), rng.normal(0.0, 0.5, channels), rng.normal(0.0, 1.0, channels),
        rng.uniform(0.5, 2.0, channels))]
    return (rounded(x, dtype), *vectors)


def forward_on(device, x, weight=None, bias=None, running_mean=None, running_var=None, **keywords):
    """(y, save_mean, save_invstd) of infiniop_py.batch_norm on ``device`` as numpy arrays (the statistics None
    unless need_stats, which defaults to training); the running statistics, updated in place there, are written back
    into the arrays given."""
    need_stats = keywords.pop("need_stats", keywords.get("training", True))
    data = DeviceData(device)
    put = lambda array, output=False: None if array is None else data.put(array, output)  # noqa: E731
    result = infiniop_py.batch_norm(put(x), put(weight), put(bias), put(running_mean, True), put(running_var, True),
                                    need_stats=need_stats, **keywords)
    fetched = tuple(data.fetch(array) for array in (result if need_stats else (result, None, None)))
    data.write_back()
    return fetched


def parameter_dtypes_for(dtype):
    return (dtype, F32) if dtype in (F16, BF16) else (dtype,)


ranked_shapes = st.integers(2, 5).flatmap(
    lambda rank: st.tuples(st.integers(1, 5), st.integers(1, 9), *([st.integers(1, 7)] * (rank - 2))))


@settings(deadline=None, max_examples=60)
@given(shape=ranked_shapes, dtype=st.sampled_from(DTYPES), f32_parameters=st.booleans(),
       layout=st.sampled_from(["channels_first", "channels_last"]), training=st.booleans(),
       running=st.booleans(), affine=st.booleans(), need_stats=st.booleans(), seed=st.integers(0, 2**32 - 1))
@example(shape=(2, 3, 5, 4), dtype=BF16, f32_parameters=True, layout="channels_last", training=True, running=True,
         affine=True, need_stats=True, seed=0)
@pytest.mark.parametrize("device", DEVICES)
def test_matches_reference(device, shape, dtype, f32_parameters, layout, training, running, affine, need_stats, seed):
    parameter_dtype = F32 if f32_parameters and dtype in (F16, BF16) else dtype
    x, weight, bias, running_mean, running_var = make_inputs(np.random.default_rng(seed), shape, dtype,
                                                             parameter_dtype)
    if layout == "channels_last":
        x = channels_last(x)
    count = x.size // shape[1]
    running = running or not training
    if training and running and count == 1:
        running = False  # refused, see test_one_value_per_channel_with_running_statistics
    need_stats = need_stats and training
    weight, bias = (weight, bias) if affine else (None, None)
    before = (running_mean.copy(), running_var.copy())
    args = (running_mean, running_var) if running else (None, None)
    if device == "cpu":
        result = infiniop_py.batch_norm(x, weight, bias, *args, training=training, momentum=0.3, eps=1e-5,
                                        need_stats=need_stats)
    else:
        result = forward_on(device, x, weight, bias, *args, training=training, momentum=0.3, eps=1e-5,
                            need_stats=need_stats)
        result = result if need_stats else result[0]
    y_ref, mean_ref, invstd_ref, new_mean, new_var = reference(x, weight, bias, *before if running else (None, None),
                                                               training, 0.3, 1e-5)
    y = result[0] if need_stats else result
    assert y.dtype == x.dtype and y.shape == x.shape
    if layout == "channels_last" and len(shape) > 2:
        assert np.moveaxis(y, 1, -1).flags.c_contiguous  # fresh y takes x's layout
    assert_y_close(y, y_ref, dtype, weight, bias)
    if need_stats:
        statistics = F64 if dtype == F64 else F32
        assert result[1].dtype == statistics and result[2].dtype == statistics
        # The mean: within STAT_BOUND of the channel's spread, beyond its own rounding to the statistics dtype (a
        # channel of two close values far from 0 has a spread below that rounding's).
        allowed = STAT_BOUND[np.dtype(dtype)] / invstd_ref + np.spacing(np.abs(mean_ref).astype(statistics)) / 2
        assert np.all(np.abs(f64(result[1]) - mean_ref) <= allowed), "save_mean"
        assert_relative(result[2], invstd_ref, STAT_BOUND[np.dtype(dtype)], "save_invstd")
    if training and running:
        tolerance = {F64: 1e-12, F32: 1e-5, F16: 2.0**-10, BF16: 2.0**-7}[np.dtype(parameter_dtype)]
        np.testing.assert_allclose(f64(running_mean), new_mean, rtol=tolerance, atol=tolerance * 1e-2)
        np.testing.assert_allclose(f64(running_var), new_var, rtol=tolerance)
    else:
        np.testing.assert_array_equal(running_mean, before[0])  # not given, or only read in eval
        np.testing.assert_array_equal(running_var, before[1])


@pytest.mark.parametrize("device", DEVICES)
def test_large_mean_channels_keep_their_precision(device):
    # Channels whose mean is 10^4 times their spread: sums of x and x^2 would cancel away every digit of the
    # variance in F32 (and lose most in F64); the shifted sums keep it.
    rng = np.random.default_rng(1)
    x = rounded(rng.standard_normal((16, 4, 33, 17)) + np.array([1e4, -3e4, 5e3, 0.0]).reshape(1, 4, 1, 1), F32)
    for array in (x, channels_last(x)):
        y, mean, invstd = forward_on(device, array)
        y_ref, mean_ref, invstd_ref, _, _ = reference(array, None, None, None, None, True, 0.1, 1e-5)
        assert_relative(invstd, invstd_ref, 1e-5, "save_invstd")
        # y's error: F32's rounding of the large x itself is exact in the reference, so only the arithmetic counts.
        assert float(np.max(np.abs(f64(y) - y_ref))) < 1e-5
        # The saved mean is F32: half its ulp, plus F32 arithmetic on the channel's spread.
        allowed = np.spacing(np.abs(mean_ref).astype(np.float32)).astype(np.float64) / 2 + 1e-5 / invstd_ref
        assert np.all(np.abs(f64(mean) - mean_ref) <= allowed)


def test_f16_accumulation_misses_the_bounds():
    # The same sums taken with an F16 accumulator (one element after the other) miss the statistics bound: the
    # tolerances above can tell such a kernel apart.
    rng = np.random.default_rng(2)
    x = rounded(rng.standard_normal((64, 2, 128)) + 3.0, F16)
    reduced = np.moveaxis(x, 1, 0).reshape(2, -1)
    f16_mean = f64(f16_sequential_sum(reduced, axis=1)) / reduced.shape[1]
    _, mean_ref, invstd_ref, _, _ = reference(x, None, None, None, None, True, 0.1, 1e-5)
    assert float(np.max(np.abs(f16_mean - mean_ref) * invstd_ref)) > STAT_BOUND[np.dtype(F16)]
    _, mean, _ = infiniop_py.batch_norm(x, need_stats=True)
    assert float(np.max(np.abs(f64(mean) - mean_ref) * invstd_ref)) <= STAT_BOUND[np.dtype(F16)]


@pytest.mark.parametrize("shape", [(4096, 3), (2, 5, 70000), (1, 70, 3, 3), (300, 17, 16), (64, 20, 5), (8, 4100),
                                   (40, 2049, 8), (64, 64, 56), (16, 2048, 49), (2, 8, 140000)])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("device", DEVICES)
def test_every_tiling_matches_reference(device, shape, layout):
    # Long channels (several length chunks and batch blocks), many rows of few channels, short runs (periodic rows),
    # and wide rows: channels finished by blocks of 256 (the last one partial), on several threads from 1024 on.
    # On CUDA, 16-byte vectors where C (rows of channels) or L (channels-first) is a multiple of 8: a ResNet's early
    # and late layers (one channel block; eight blocks of 32 groups), and 2 x 8 x 140000, where a thread's sums
    # outlast kFlushRows steps in both tilings; the other shapes take one element at a time.
    x, weight, bias, running_mean, running_var = make_inputs(np.random.default_rng(3), shape, BF16, F32)
    x = channels_last(x) if layout == "channels_last" else x
    expected = reference(x, weight, bias, running_mean.copy(), running_var.copy(), True, 0.1, 1e-5)
    y, mean, invstd = forward_on(device, x, weight, bias, running_mean, running_var)
    assert_y_close(y, expected[0], BF16, weight, bias)
    assert_relative(invstd, expected[2], 1e-5, "save_invstd")
    np.testing.assert_allclose(running_var, expected[4], rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_bitwise_reproducible(device):
    x = rounded(np.random.default_rng(4).standard_normal((8, 16, 999)), F32)
    first = forward_on(device, x)
    for _ in range(3):
        for a, b in zip(first, forward_on(device, x)):
            np.testing.assert_array_equal(a, b)


def test_in_place_and_out():
    x, weight, bias, _, _ = make_inputs(np.random.default_rng(5), (3, 4, 20), F32, F32)
    expected = infiniop_py.batch_norm(x, weight, bias)
    y = x.copy()
    infiniop_py.batch_norm(y, weight, bias, out=(y, None, None))
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_eval_reads_the_running_statistics_only(device):
    x, weight, bias, running_mean, running_var = make_inputs(np.random.default_rng(6), (3, 4, 5, 6), F32, F32)
    before = running_mean.copy(), running_var.copy()
    y, _, _ = forward_on(device, x, weight, bias, running_mean, running_var, training=False)
    assert_y_close(y, reference(x, weight, bias, *before, False, 0.1, 1e-5)[0], F32, weight, bias)
    np.testing.assert_array_equal(running_mean, before[0])
    np.testing.assert_array_equal(running_var, before[1])


@pytest.mark.parametrize("shape", [(0, 3, 4), (2, 3, 0), (0, 3), (2, 0, 5)])
@pytest.mark.parametrize("device", DEVICES)
def test_empty_batches(device, shape):
    x = np.zeros(shape, np.float32)
    running_mean, running_var = np.full(shape[1], 0.5, np.float32), np.full(shape[1], 2.0, np.float32)
    y, mean, invstd = forward_on(device, x, None, None, running_mean, running_var)
    assert y.shape == shape
    np.testing.assert_array_equal(mean, np.zeros(shape[1]))
    np.testing.assert_array_equal(running_mean, np.full(shape[1], 0.5))  # as torch leaves them
    np.testing.assert_array_equal(running_var, np.full(shape[1], 2.0))


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_channels_give_nan_statistics(device):
    """A channel holding an infinity or a NaN gets a NaN invstd and NaN outputs, as torch's does (its NaN variance
    is not clamped to 0, which would give 1/sqrt(eps)); the other channels are untouched."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    x[1, 0, 2] = np.inf
    x[2, 1, 1] = np.nan
    y, mean, invstd = forward_on(device, x)
    assert np.isnan(invstd[:2]).all() and np.isnan(y[:, :2]).all()
    expected_y, expected_mean, expected_invstd, _, _ = reference(x[:, 2:], None, None, None, None, True, 0.1, 1e-5)
    assert_relative(invstd[2:], expected_invstd, 1e-6, "invstd")
    assert_y_close(y[:, 2:], expected_y, np.dtype(np.float32))


def test_one_value_per_channel_with_running_statistics():
    x = np.ones((1, 3), np.float32)
    running = np.zeros(3, np.float32), np.ones(3, np.float32)
    with pytest.raises(errors.BadTensorShapeError, match="one value per channel"):
        infiniop_py.batch_norm(x, None, None, *running)
    np.testing.assert_array_equal(running[1], np.ones(3))
    y = infiniop_py.batch_norm(x)  # nothing to update: a variance of 0
    np.testing.assert_array_equal(y, np.zeros((1, 3)))


@pytest.mark.parametrize("call, error, message", [
    (lambda x, v: infiniop_py.batch_norm(x, None, None, v, None), errors.NullPointerError, "give both"),
    (lambda x, v: infiniop_py.batch_norm(x, training=False), errors.NullPointerError, "eval mode"),
    (lambda x, v: infiniop_py.batch_norm(x, v[:2]), errors.BadTensorShapeError, "weight"),
    (lambda x, v: infiniop_py.batch_norm(x, v.astype(np.float64)), errors.BadTensorDtypeError, "weight"),
    (lambda x, v: infiniop_py.batch_norm(x, eps=-1.0), errors.BadParamError, "epsilon"),
    (lambda x, v: infiniop_py.batch_norm(x, momentum=float("nan")), errors.BadParamError, "momentum"),
    (lambda x, v: infiniop_py.batch_norm(x[:, :, 0]), None, None),
    (lambda x, v: infiniop_py.batch_norm(x.reshape(2, 3, 1, 1, 1, 4)), errors.BadTensorShapeError, "^x: shape"),
    (lambda x, v: infiniop_py.batch_norm(x.astype(np.int32)), errors.BadTensorDtypeError, "x"),
])
def test_bad_input_gets_named_errors(call, error, message):
    x, v = np.ones((2, 3, 4), np.float32), np.ones(3, np.float32)
    if error is None:
        call(x, v)
        return
    with pytest.raises(error, match=message):
        call(x, v)


def test_operator_object_and_seed_form():
    x, weight, bias, running_mean, running_var = make_inputs(np.random.default_rng(7), (3, 4, 10), F32, F32)
    expected = reference(x, weight, bias, running_mean.copy(), running_var.copy(), True, 0.2, 1e-3)
    handle = infiniop_py.Handle("cpu")
    y = np.empty_like(x)
    save_mean, save_invstd = np.empty(4, np.float32), np.empty(4, np.float32)
    op = infiniop_py.BatchNorm(handle, y, save_mean, save_invstd, running_mean, running_var, x, weight, bias,
                               momentum=0.2, eps=1e-3)
    op(y, save_mean, save_invstd, running_mean, running_var, x, weight, bias)
    assert_y_close(y, expected[0], F32, weight, bias)
    assert_relative(save_invstd, expected[2], 1e-5, "save_invstd")
    np.testing.assert_allclose(running_var, expected[4], rtol=1e-5)


def test_seed_functions_through_c():
    from infiniop_py._ffi import ffi, libraries
    from _helpers import data_pointer
    lib = libraries().op
    x, weight, bias, running_mean, running_var = make_inputs(np.random.default_rng(8), (3, 4, 10), F32, F32)
    expected = reference(x, weight, bias, running_mean.copy(), running_var.copy(), True, 0.25, 1e-4)
    y = np.empty_like(x)
    handle = infiniop_py.Handle("cpu")
    descs = [infiniop_py.TensorDesc(a.shape, 13, tuple(s // 4 for s in a.strides))
             for a in (y, running_mean, running_var, x, weight, bias)]
    desc = ffi.new("infiniopBatchNormDescriptor_t *")
    assert lib.infiniopCreateBatchNormDescriptor(handle._begin_call(), desc, *[d.native for d in descs], 0.25,
                                                 1e-4) == 0
    handle._end_call()
    size = ffi.new("size_t *")
    assert lib.infiniopGetBatchNormWorkspaceSize(desc[0], size) == 0
    workspace = np.empty(max(size[0], 1), np.uint8)
    pointers = [ffi.cast("void *", data_pointer(a)) for a in (y, running_mean, running_var, x, weight, bias)]
    assert lib.infiniopBatchNorm(desc[0], ffi.cast("void *", data_pointer(workspace)), size[0], *pointers,
                                 ffi.NULL) == 0
    assert lib.infiniopDestroyBatchNormDescriptor(desc[0]) == 0
    assert_y_close(y, expected[0], F32, weight, bias)
    np.testing.assert_allclose(running_mean, expected[3], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(running_var, expected[4], rtol=1e-5)


def test_saved_statistics_feed_the_backward():
    x, weight, bias, _, _ = make_inputs(np.random.default_rng(9), (4, 3, 7, 5), F32, F32)
    grad_output = rounded(np.random.default_rng(10).standard_normal(x.shape), F32)
    _, save_mean, save_invstd = infiniop_py.batch_norm(x, weight, bias, eps=1e-5, need_stats=True)
    saved = infiniop_py.batch_norm_backward(x, grad_output, weight, None, None, eps=1e-5, save_mean=save_mean,
                                            save_invstd=save_invstd)
    mean, var = f64(x).mean(axis=(0, 2, 3)), f64(x).var(axis=(0, 2, 3))
    recomputed = infiniop_py.batch_norm_backward(x, grad_output, weight, rounded(mean, F32), rounded(var, F32),
                                                 eps=1e-5)
    for a, b in zip(saved, recomputed):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


ISA_SHAPES = ((8, 5, 3001), (300, 7, 9), (6, 33, 4, 4), (70, 3))  # channels-first long and short runs, rank 2


@pytest.mark.parametrize("isa", ("generic", "avx2", "avx512", "avx512bf16"))
def test_every_isa_passes_the_bounds(tmp_path, isa):
    """Each ISA's kernels (a process picks one; asking for more than the CPU has gives what it has), channels-first
    and channels-last, on channels with partial vectors and a large mean."""
    from _helpers import run_python_with_isa

    code = f"""
import ml_dtypes, numpy as np, infiniop_py
results = {{}}
for name, dtype in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("f32", np.float32)):
    for shape in {ISA_SHAPES!r}:
        for layout in ("first", "last"):
            rng = np.random.default_rng(3)
            x = (rng.standard_normal(shape) + 40.0).astype(dtype)
            if layout == "last":
                x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)
            w, b = rng.normal(1.0, 0.5, shape[1]).astype(np.float32), rng.normal(0, 1, shape[1]).astype(np.float32)
            y, mean, invstd = infiniop_py.batch_norm(x, w, b, need_stats=True)
            key = f"{{name}} {{shape}} {{layout}}"
            results[key + " x"], results[key + " y"] = x.astype(np.float64), y.astype(np.float64)
            results[key + " w"], results[key + " b"], results[key + " invstd"] = w, b, invstd
np.savez({str(tmp_path / "out.npz")!r}, **results)
"""
    run_python_with_isa(code, isa)
    results = np.load(tmp_path / "out.npz")
    for name, dtype in (("f16", F16), ("bf16", BF16), ("f32", F32)):
        for shape in ISA_SHAPES:
            for layout in ("first", "last"):
                key = f"{name} {shape} {layout}"
                w, b = results[key + " w"], results[key + " b"]
                y_ref, _, invstd_ref, _, _ = reference(results[key + " x"], w, b, None, None, True, 0.1, 1e-5)
                assert_y_close(results[key + " y"], y_ref, dtype, w, b)
                assert_relative(results[key + " invstd"], invstd_ref, STAT_BOUND[np.dtype(dtype)], key)


# ---------------------------------------------------------------- against PyTorch (skipped without it)

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_matches_torch_over_several_calls(dtype, layout):
    torch = pytest.importorskip("torch")
    torch_dtype = getattr(torch, dtype)
    parameter_dtype = torch.float32 if dtype == "bfloat16" else torch_dtype
    generator = torch.Generator().manual_seed(11)
    channels = 6
    weight = torch.randn(channels, generator=generator, dtype=parameter_dtype)
    bias = torch.randn(channels, generator=generator, dtype=parameter_dtype)
    ours = [torch.zeros(channels, dtype=parameter_dtype), torch.ones(channels, dtype=parameter_dtype)]
    theirs = [t.clone() for t in ours]
    tolerance = {"float32": 1e-5, "bfloat16": 2.0**-7, "float64": 1e-12}[dtype]
    for step in range(4):
        x = (torch.randn(5, channels, 7, 3, generator=generator) * 2 + step).to(torch_dtype)
        if layout == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        y, save_mean, save_invstd = infiniop_py.batch_norm(x, weight, bias, *ours, momentum=0.2, eps=1e-4,
                                                           need_stats=True)
        expected, mean, invstd = torch.native_batch_norm(x, weight, bias, *theirs, True, 0.2, 1e-4)
        torch.testing.assert_close(y.double(), expected.double(), rtol=tolerance, atol=tolerance * 4)
        torch.testing.assert_close(save_mean.double(), mean.double(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(save_invstd.double(), invstd.double(), rtol=1e-5, atol=0)
        for a, b in zip(ours, theirs):  # the running statistics after each call
            torch.testing.assert_close(a, b, rtol=1e-5 if dtype != "float64" else 1e-12, atol=1e-6)


def test_eval_matches_torch_and_leaves_running_statistics():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 3, 10)
    running = [torch.randn(3), torch.rand(3) + 0.5]
    before = [t.clone() for t in running]
    y = infiniop_py.batch_norm(x, None, None, *running, training=False, eps=1e-3)
    torch.testing.assert_close(y, torch.nn.functional.batch_norm(x, *before, training=False, eps=1e-3))
    for a, b in zip(running, before):
        assert torch.equal(a, b)


def test_saved_statistics_give_torchs_gradients():
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(12)
    x = torch.randn(6, 4, 5, 5, generator=generator, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    grad_output = torch.randn(x.shape, generator=generator, dtype=torch.float64)
    _, save_mean, save_invstd = infiniop_py.batch_norm(x, weight, bias, eps=1e-5, need_stats=True)
    grads = infiniop_py.batch_norm_backward(x, grad_output.contiguous(memory_format=torch.channels_last), weight,
                                            None, None, eps=1e-5, save_mean=save_mean, save_invstd=save_invstd)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    torch.nn.functional.batch_norm(leaves[0], None, None, leaves[1], leaves[2], training=True,
                                   eps=1e-5).backward(grad_output)
    for ours, leaf in zip(grads, leaves):
        torch.testing.assert_close(ours, leaf.grad, rtol=1e-10, atol=1e-12)


def test_same_bits_for_any_thread_count(tmp_path):
    """The tiles depend on the shape only (docs/guarantees.md): OMP_NUM_THREADS=1, 2 and 3 give the same bits,
    channels-first (several batch blocks and length chunks) and channels-last (several row blocks)."""
    import os
    import subprocess
    import sys

    code = """
import sys, numpy as np, infiniop_py
rng = np.random.default_rng(5)
x = (rng.standard_normal((48, 6, 7000)) + 3).astype(np.float32)
last = np.moveaxis(np.ascontiguousarray(np.moveaxis(x[:, :, :4096], 1, -1)), -1, 1)
arrays = [a for v in (x, last) for a in infiniop_py.batch_norm(v, need_stats=True)]
np.savez(sys.argv[1], *arrays)
"""
    results = []
    for threads in (1, 2, 3):
        path = tmp_path / f"{threads}.npz"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run([sys.executable, "-c", code, str(path)], env=env, check=True, timeout=300)
        results.append(np.load(path))
    for other in results[1:]:
        for name in results[0].files:
            np.testing.assert_array_equal(results[0][name], other[name], err_msg=name)
