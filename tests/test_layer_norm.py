"""LayerNorm forward (functional API and operator objects; the values on every device) against float64 references
from the exact rounded inputs and against torch.nn.functional.layer_norm; its statistics against what the two
backward forms take."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import infiniop_py
from infiniop_py import errors
from _devices import DEVICES, DeviceData, call_on
from _helpers import (
    BF16, F16, F32, F64, FREE_LAYOUTS, INPUT_ROW_LAYOUTS, ROW_LAYOUTS, GuardedOutput, f16_sequential_sum, f64,
    PACKED_DTYPES, PACKED_ROWS, empty_padded_rows, rounded, with_free_layout, with_row_layout,
)
from _helpers import layer_norm_forward_reference as reference

# Per element, |y - ref| <= ROUND * |ref| + ARITH * ((|xhat| + 1) * |w| + |b|) + TINY: the output's own rounding
# (half an ulp: 2^-11 for F16, 2^-8 for BF16), F32 arithmetic on xhat (relative to it, and to the row's spread
# through the mean) and on its terms (1e-5), and the dtype's smallest subnormal. xhat (the seed form's) the same with w = 1, b = 0. mean within MEAN_BOUND * (|mean| + std), rstd and
# std within STAT_BOUND relative. An F16 sum (test_f16_accumulation_misses_the_bounds) and an F32 one-pass variance
# (test_large_mean_rows) miss them.
ROUND = {F32: 0.0, F16: 2.0**-11, BF16: 2.0**-8, F64: 0.0}
ARITH = {F32: 1e-5, F16: 1e-5, BF16: 1e-5, F64: 1e-13}
TINY = {F32: 0.0, F16: 2.0**-24, BF16: 0.0, F64: 0.0}
# The mean's bound is F32 summation's: a chunk's 4096 terms go to 32 F32 lanes of 128, summed about a shift within
# one standard deviation of the mean (|x - shift| under about 5 std), so the rounding of the 32 lane sums, divided by
# 4096, stays under 32 * (128^2 / 2) * 2^-24 * 5 std / 4096 = 64 * 2^-24 * 5 std, about 2e-5 std. Hypothesis found
# 1.4e-6 (F16, d = 4099, the first 16 elements 0.95 std from the mean); an F16 sum's error there is 0.39.
MEAN_BOUND = {F32: 2e-5, F16: 2e-5, BF16: 2e-5, F64: 1e-14}
STAT_BOUND = {F32: 1e-5, F16: 1e-5, BF16: 1e-5, F64: 1e-13}
DTYPES = (F16, BF16, F32, F64)
EPS = 1e-5


def error_ratio(actual, expected, terms, dtype):
    """max over elements of |actual - expected| / allowed (see the bounds above): <= 1 passes. terms: (|xhat| + 1)
    * |w| + |b| of each element."""
    dtype = np.dtype(dtype)
    actual, expected = f64(actual), f64(expected)
    allowed = ROUND[dtype] * np.abs(expected) + ARITH[dtype] * terms + TINY[dtype]
    return float(np.max(np.abs(actual - expected) / np.maximum(allowed, 1e-300), initial=0.0))


def assert_y_close(y, x, w, b, normalized, dtype, eps=EPS):
    expected, _, _, xhat, _ = reference(x, w, b, normalized, eps)
    terms = (np.abs(xhat) + 1.0) * np.abs(1.0 if w is None else f64(w)) + (0.0 if b is None else np.abs(f64(b)))
    ratio = error_ratio(y, expected, terms, dtype)
    assert ratio <= 1.0, f"y ({np.dtype(dtype).name}): error {ratio:.3g} x the bound"


def assert_statistics_close(mean, rstd, x, normalized, dtype, eps=EPS):
    _, expected_mean, expected_rstd, _, std = reference(x, None, None, normalized, eps)
    dtype = np.dtype(dtype)
    if mean is not None:
        err = np.abs(f64(mean) - expected_mean) / (np.abs(expected_mean) + std)
        assert float(np.max(err, initial=0.0)) <= MEAN_BOUND[dtype], f"mean: error {float(np.max(err)):.3g}"
    if rstd is not None:
        err = np.abs(f64(rstd) - expected_rstd) / expected_rstd
        assert float(np.max(err, initial=0.0)) <= STAT_BOUND[dtype], f"rstd: relative error {float(np.max(err)):.3g}"


def inputs(rng, shape, normalized, dtype, parameter_dtype=None):
    """(x, w, b): rows of their own offset and scale, w around 1, b around 0."""
    lead = shape[:len(shape) - normalized]
    row = lead + (1,) * normalized
    x = rng.standard_normal(shape) * rng.uniform(0.2, 5.0, row) + rng.uniform(-3.0, 3.0, row)
    parameter_shape = shape[len(shape) - normalized:]
    w = rng.normal(1.0, 0.5, parameter_shape)
    b = rng.normal(0.0, 0.5, parameter_shape)
    parameter_dtype = parameter_dtype or dtype
    return rounded(x, dtype), rounded(w, parameter_dtype), rounded(b, parameter_dtype)


def forward_on(device, x, w, b, eps=EPS, out=None):
    """(y, mean, rstd) of infiniop_py.layer_norm on ``device`` (out=: the arrays written back; mean and rstd None:
    not wanted)."""
    if out is not None and out[1] is None:
        return call_on(device, lambda *a, **k: (infiniop_py.layer_norm(*a, **k), None, None), x, w, b, eps=eps,
                       out=out)
    return call_on(device, infiniop_py.layer_norm, x, w, b, eps=eps, need_stats=True, out=out)


def seed_form_on(device, x, w, b, std_dtype, eps, with_statistics=True, empty_like=np.empty_like):
    """(output, xhat, std) of the seed form (LayerNormXhat) on ``device``; xhat and std None unless wanted;
    empty_like(x): where output and xhat go."""
    output = empty_like(x)
    xhat, std = (empty_like(x), np.empty(x.shape[:-1], std_dtype)) if with_statistics else (None, None)
    data = DeviceData(device)
    put = lambda array, output=False: None if array is None else data.put(array, output)  # noqa: E731
    arrays = (put(output, True), put(xhat, True), put(std, True), put(x), put(w), put(b))
    with infiniop_py.Handle(device) as handle:
        with infiniop_py.LayerNormXhat(handle, *arrays, eps=eps) as operator:
            operator(*arrays)
    data.write_back()
    return output, xhat, std


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)
row_lengths = st.sampled_from([1, 2, 7, 16, 31, 33, 64, 100, 129, 1000, 4099])  # 4099: a 16-bit weight read as stored
dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**32 - 1)


@given(lead=shapes, d=row_lengths, dtype=dtypes, f32_parameters=st.booleans(), seed=seeds,
       x_layout=st.sampled_from(INPUT_ROW_LAYOUTS), w_layout=st.sampled_from(FREE_LAYOUTS + ("absent",)),
       b_layout=st.sampled_from(FREE_LAYOUTS + ("absent",)), need_stats=st.booleans())
@example(lead=(1,), d=7, dtype=F16, f32_parameters=False, seed=0, x_layout="reversed", w_layout="stride2",
         b_layout="absent", need_stats=True)
@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs_match_reference(device, lead, d, dtype, f32_parameters, seed, x_layout, w_layout, b_layout,
                                        need_stats):
    parameter_dtype = F32 if f32_parameters and dtype in (F16, BF16) else dtype
    x, w, b = inputs(np.random.default_rng(seed), lead + (d,), 1, dtype, parameter_dtype)
    x = with_row_layout(x, x_layout)
    w = None if w_layout == "absent" else with_free_layout(w, w_layout)
    b = None if b_layout == "absent" else with_free_layout(b, b_layout)

    if device == "cpu":
        result = infiniop_py.layer_norm(x, w, b, eps=EPS, need_stats=need_stats)
        y, mean, rstd = result if need_stats else (result, None, None)
    else:
        y, mean, rstd = forward_on(device, x, w, b)
    assert y.shape == x.shape and y.dtype == dtype and (device != "cpu" or y.flags.c_contiguous)
    assert_y_close(y, x, w, b, 1, dtype)
    if mean is not None:
        statistics = F64 if dtype == F64 else F32
        assert mean.shape == lead and rstd.shape == lead and mean.dtype == rstd.dtype == statistics
        assert_statistics_close(mean, rstd, x, 1, dtype)


@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=5).map(tuple), data=st.data(), dtype=dtypes,
       seed=seeds, parameters=st.sampled_from(("w", "b", "both")))
@pytest.mark.parametrize("device", DEVICES)
def test_several_normalized_dims(device, shape, data, dtype, seed, parameters):
    """w's (or b's) rank k normalizes the last k dims together, from one leading dim to none (a single row)."""
    normalized = data.draw(st.integers(1, len(shape)))
    x, w, b = inputs(np.random.default_rng(seed), shape, normalized, dtype)
    w = w if parameters in ("w", "both") else None
    b = b if parameters in ("b", "both") else None

    y, mean, rstd = forward_on(device, x, w, b)

    assert mean.shape == rstd.shape == shape[:len(shape) - normalized]
    assert_y_close(y, x, w, b, normalized, dtype)
    assert_statistics_close(mean, rstd, x, normalized, dtype)


@given(lead=shapes, d=row_lengths, dtype=dtypes, seed=seeds, y_layout=st.sampled_from(ROW_LAYOUTS),
       statistics_layout=st.sampled_from(("contiguous", "stride2", "reversed")))
@example(lead=(4, 5), d=4099, dtype=F16, seed=701719, y_layout="contiguous", statistics_layout="contiguous")
@pytest.mark.parametrize("device", DEVICES)
def test_writes_strided_preallocated_outputs(device, lead, d, dtype, seed, y_layout, statistics_layout):
    x, w, b = inputs(np.random.default_rng(seed), lead + (d,), 1, dtype)
    statistics = F64 if dtype == F64 else F32
    y_out = GuardedOutput(lead + (d,), dtype, y_layout)
    # The statistics take their layout on one leading dim; other leading shapes take it packed.
    layout = statistics_layout if len(lead) == 1 else "contiguous"
    mean_out, rstd_out = GuardedOutput(lead, statistics, layout), GuardedOutput(lead, statistics, layout)

    returned = forward_on(device, x, w, b, out=(y_out.view, mean_out.view, rstd_out.view))

    assert returned[0] is y_out.view and returned[1] is mean_out.view and returned[2] is rstd_out.view
    assert_y_close(y_out.view, x, w, b, 1, dtype)
    assert_statistics_close(mean_out.view, rstd_out.view, x, 1, dtype)
    for out in (y_out, mean_out, rstd_out):
        out.assert_only_view_written()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(3, 1 << 20), (1, 3 << 20), (2048, 4096), (40, 64, 96), (5, 16385), (300, 8192),
                                   (70, 24), (4096, 16), (130, 200)], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_every_schedule_matches_reference(device, dtype, shape):
    """CPU: few huge rows (split across threads at chunk boundaries), many long rows (streamed output), cached
    rows (column slices) and short ones (a row block per call: rows of 16-96 whole, rows of 200 by the blocks' sums,
    then their outputs): every schedule of the row driver. CUDA: rows in
    registers from a warp (several rows per CTA) to a CTA of 1024 threads, and rows longer than that re-read from
    L2."""
    x, w, b = inputs(np.random.default_rng(7), shape, 1, dtype)

    y, mean, rstd = forward_on(device, x, w, b)

    assert_y_close(y, x, w, b, 1, dtype)
    assert_statistics_close(mean, rstd, x, 1, dtype)


@pytest.mark.parametrize("dtype, parameter_dtype", PACKED_DTYPES, ids=str)
@pytest.mark.parametrize("leading, dim, padded", PACKED_ROWS, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_packed_rows_match_reference(device, leading, dim, padded, dtype, parameter_dtype):
    """Both forms: the statistics form (mean and rstd, F32) and the seed form (xhat and std). Rows sit up to 200
    spreads from zero, so an F32 one-pass variance would miss the bounds."""
    rng = np.random.default_rng(dim)
    per_row = leading + (1,)
    full = rng.standard_normal(leading + (padded,)) * rng.uniform(0.2, 5.0, per_row) + rng.uniform(-200, 200, per_row)
    x = rounded(full, dtype)[..., :dim]
    parameters = dtype if parameter_dtype == "data" else parameter_dtype
    w, b = rounded(rng.normal(1.0, 0.5, dim), parameters), rounded(rng.normal(0.0, 0.5, dim), parameters)

    rows_like_x = lambda _: empty_padded_rows(leading, dim, padded, dtype)  # noqa: E731  so D = 1001 stays packed
    y, mean, rstd = forward_on(device, x, w, b, out=(rows_like_x(x), np.empty(leading, F32), np.empty(leading, F32)))
    assert_y_close(y, x, w, b, 1, dtype)
    assert_statistics_close(mean, rstd, x, 1, dtype)

    output, xhat, std = seed_form_on(device, x, w, b, parameters, EPS, empty_like=rows_like_x)
    assert np.array_equal(output.view(np.uint8), y.view(np.uint8))  # the same kernel and y in both forms
    assert_y_close(xhat, x, None, None, 1, dtype)
    _, _, _, _, expected_std = reference(x, None, None, 1, EPS)
    bound = STAT_BOUND[np.dtype(dtype)] + ROUND[np.dtype(parameters)]
    assert float(np.max(np.abs(f64(std) - expected_std) / expected_std)) <= bound


@pytest.mark.parametrize("isa", ("generic", "avx2", "avx512", "avx512bf16"))
def test_every_isa_passes_the_bounds(tmp_path, isa):
    """Each ISA's kernels (a process picks one; asking for more than the CPU has gives what it has), on rows with
    partial vectors at both ends, 16-bit parameters read as stored and widened, a streamed output, with and
    without bias and xhat."""
    from _helpers import run_python_with_isa

    code = f"""
import ml_dtypes, numpy as np, infiniop_py
results = {{}}
with infiniop_py.Handle("cpu") as handle:
    for name, dtype in (("f16", np.float16), ("bf16", ml_dtypes.bfloat16), ("f32", np.float32)):
        for shape in ((37, 1029), (3, 8195), (520, 4099)):
            rng = np.random.default_rng(3)
            x = (rng.standard_normal(shape) * 2 + 3).astype(dtype)[:, 3:]
            w = rng.normal(1.0, 0.5, shape[1] - 3).astype(dtype)
            b = rng.normal(0.0, 0.5, shape[1] - 3).astype(dtype)
            y, mean, rstd = infiniop_py.layer_norm(x, w, b, eps=1e-5, need_stats=True)
            key = f"{{name}} {{shape}}"
            results[key + " x"], results[key + " w"] = x.astype(np.float64), w.astype(np.float64)
            results[key + " b"], results[key + " y"] = b.astype(np.float64), y.astype(np.float64)
            results[key + " mean"], results[key + " rstd"] = mean, rstd
            x = np.ascontiguousarray(x)
            out, xhat, std = np.empty_like(x), np.empty_like(x), np.empty(x.shape[0], dtype)
            with infiniop_py.LayerNormXhat(handle, out, xhat, std, x, w, None) as op:
                op(out, xhat, std, x, w, None)
            results[key + " seed y"], results[key + " xhat"] = out.astype(np.float64), xhat.astype(np.float64)
np.savez({str(tmp_path / "out.npz")!r}, **results)
"""
    run_python_with_isa(code, isa)
    results = np.load(tmp_path / "out.npz")
    for name, dtype in (("f16", F16), ("bf16", BF16), ("f32", F32)):
        for shape in ((37, 1029), (3, 8195), (520, 4099)):
            key = f"{name} {shape}"
            x, w, b = results[f"{key} x"], results[f"{key} w"], results[f"{key} b"]
            assert_y_close(results[f"{key} y"], x, w, b, 1, dtype)
            assert_statistics_close(results[f"{key} mean"], results[f"{key} rstd"], x, 1, dtype)
            assert_y_close(results[f"{key} seed y"], x, w, None, 1, dtype)
            assert_y_close(results[f"{key} xhat"], x, None, None, 1, dtype)


def test_f16_accumulation_misses_the_bounds():
    """sum(x) over 8192 positive terms: an F16 accumulator's mean, hence y, misses both bounds, so the bounds prove
    F32 accumulation."""
    rng = np.random.default_rng(6)
    x, w, b = inputs(rng, (4, 8192), 1, F16)
    x = rounded(rng.uniform(0.5, 1.5, (4, 8192)), F16)
    _, expected_mean, _, _, std = reference(x, None, None, 1, EPS)
    f16_mean = f64(f16_sequential_sum(f64(x), axis=-1)) / x.shape[-1]
    assert float(np.max(np.abs(f16_mean - expected_mean) / (np.abs(expected_mean) + std))) > MEAN_BOUND[F16]
    f16_xhat = (f64(x) - f16_mean[:, None]) / std[:, None]
    expected_y, _, _, xhat, _ = reference(x, w, b, 1, EPS)
    terms = (np.abs(xhat) + 1.0) * np.abs(f64(w)) + np.abs(f64(b))
    assert error_ratio(rounded(f16_xhat * f64(w) + f64(b), F16), expected_y, terms, F16) > 1.0

    y, mean, rstd = infiniop_py.layer_norm(x, w, b, eps=EPS, need_stats=True)

    assert_y_close(y, x, w, b, 1, F16)
    assert_statistics_close(mean, rstd, x, 1, F16)


@pytest.mark.parametrize("dtype", (F16, BF16, F32), ids=str)
@pytest.mark.parametrize("d", (64, 4096, 10000), ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_large_mean_rows(device, dtype, d):
    """Rows far from zero against their spread (mean/std up to 1e4 in F32): no cancellation in the variance, and
    x - mean keeps its bits. An F32 one-pass E[x^2] - E[x]^2 misses the rstd bound here."""
    rng = np.random.default_rng(11)
    offsets = {F32: 1e4, F16: 200.0, BF16: 200.0}[np.dtype(dtype)]
    x = rounded(offsets * np.array([[1.0], [-1.0], [0.5]]) + rng.standard_normal((3, d)), dtype)
    w, b = rounded(rng.normal(1.0, 0.5, d), dtype), rounded(rng.normal(0.0, 0.5, d), dtype)

    y, mean, rstd = forward_on(device, x, w, b)

    assert_y_close(y, x, w, b, 1, dtype)
    assert_statistics_close(mean, rstd, x, 1, dtype)
    if np.dtype(dtype) == F32:  # the bound would catch the naive formula
        x32 = x.astype(np.float32)
        naive_mean = np.mean(x32, axis=-1, dtype=np.float32)
        naive_var = np.mean(x32 * x32, axis=-1, dtype=np.float32) - naive_mean * naive_mean
        naive_rstd = 1.0 / np.sqrt(np.maximum(f64(naive_var), 0.0) + EPS)
        _, _, expected_rstd, _, _ = reference(x, None, None, 1, EPS)
        assert float(np.max(np.abs(naive_rstd - expected_rstd) / expected_rstd)) > STAT_BOUND[F32]


@pytest.mark.parametrize("dtype", (F16, BF16, F32), ids=str)
@pytest.mark.parametrize("d", (12, 16, 40, 100, 512, 5000), ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_rows_starting_far_from_their_mean(device, dtype, d):
    """The CPU kernel sums each chunk about its first vector's mean: where that lies far from the chunk's mean
    (here the first 16 elements sit 1e3 spreads away, or a single element does), it sums again about the mean. The
    rows that do lie in different lanes of the short-row kernel's groups of statistics (4 rows on AVX2, 8 on AVX-512)
    and in a second block of 16 rows."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((22, d))
    far = 1e3 if np.dtype(dtype) == F32 else 30.0
    for row in (0, 9, 21):
        x[row, :16] += far
    x[5, :16] -= 50.0
    x[14, 0] += far
    x[15, 4096:4112] += 100.0  # the second chunk's first vector
    x = rounded(x + 100.0, dtype)
    w, b = rounded(rng.normal(1.0, 0.5, d), dtype), rounded(rng.normal(0.0, 0.5, d), dtype)

    y, mean, rstd = forward_on(device, x, w, b)

    assert_y_close(y, x, w, b, 1, dtype)
    assert_statistics_close(mean, rstd, x, 1, dtype)


@pytest.mark.parametrize("dtype", (F16, BF16, F32), ids=str)
@pytest.mark.parametrize("d", (77, 512, 5000), ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_tiny_and_non_finite_rows(device, dtype, d):
    """A row of tiny values (eps 0: its variance alone sets rstd) beside ordinary ones, and rows holding an infinity
    or a NaN: their outputs and rstd are NaN, as torch's are (a NaN variance is not clamped to 0, which would give
    rstd = 1/sqrt(eps)), and the other rows are untouched."""
    rng = np.random.default_rng(13)
    tiny = {F32: 1e-18, F16: 1e-3, BF16: 1e-18}[np.dtype(dtype)]  # squares still normal F32 (F16) numbers
    x = rng.uniform(-2.0, 2.0, (4, d)) * np.array([[tiny], [1.0], [1.0], [1.0]])
    x[2, d // 2] = np.inf
    x[3, 1] = np.nan
    x = rounded(x, dtype)
    w, b = rounded(rng.normal(1.0, 0.5, d), dtype), rounded(rng.normal(0.0, 0.5, d), dtype)

    y, mean, rstd = forward_on(device, x, w, b, eps=0.0)

    assert_y_close(y[:2], x[:2], w, b, 1, dtype, eps=0.0)
    assert_statistics_close(mean[:2], rstd[:2], x[:2], 1, dtype, eps=0.0)
    assert np.isnan(f64(y[2:])).all() and np.isnan(f64(rstd[2:])).all()


@pytest.mark.parametrize("d", (256, 5000), ids=str)
def test_rows_whose_chunk_squares_pass_f32s_range(d):
    """CPU, F32 rows of +-1e18 and +-5e17: a 4096-element chunk's sum of squares (up to 4e39) passes F32's range
    though each lane's does not. The sums across lanes are F32 trees, and go to F64 where those overflow: rstd stays
    about 1e-18 (torch 2.13's CPU kernel gives 0 at D = 5000), not 0."""
    x = rounded(np.where(np.arange(d) % 2 == 1, 1e18, -1e18) * np.array([[1.0], [0.5]]), F32)
    w, b = np.ones(d, F32), np.zeros(d, F32)

    y, mean, rstd = forward_on("cpu", x, w, b)

    assert_y_close(y, x, w, b, 1, F32)
    assert_statistics_close(mean, rstd, x, 1, F32)


# Long rows, and short rows that the CPU's block kernel reads where they lie (F32 in whole vectors, simd::RowView), y
# overwriting each element after it is read.
IN_PLACE_SHAPES = [(5, 300), (40, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", IN_PLACE_SHAPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_in_place_functional(device, shape, dtype):
    x, w, b = inputs(np.random.default_rng(2), shape, 1, dtype)
    original = x.copy()
    forward_on(device, x, w, b, out=(x, None, None))
    assert_y_close(x, original, w, b, 1, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", IN_PLACE_SHAPES, ids=str)
def test_in_place(shape, dtype):
    x, w, b = inputs(np.random.default_rng(2), shape, 1, dtype)
    original = x.copy()
    with infiniop_py.Handle("cpu") as handle, infiniop_py.LayerNorm(handle, x, None, None, x, w, b) as operator:
        operator(x, None, None, x, w, b)
    assert_y_close(x, original, w, b, 1, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_constant_rows_zero_sizes_and_zero_rows(device):
    w = np.ones(4, F32)
    y, mean, rstd = forward_on(device, np.zeros((0, 4), F32), w, None)
    assert y.shape == (0, 4) and mean.shape == rstd.shape == (0,)
    y, mean, rstd = forward_on(device, np.zeros((3, 0), F32), np.ones(0, F32), None)
    assert y.shape == (3, 0) and np.isnan(mean).all() and np.isnan(rstd).all()  # the mean of no elements is 0/0
    x = np.full((2, 4), 3.5, F32)
    y, mean, rstd = forward_on(device, x, w, np.full(4, 0.25, F32), eps=0.0)
    assert (mean == 3.5).all() and np.isinf(rstd).all() and np.isnan(y).all()  # var 0, eps 0: nothing traps
    y, mean, rstd = forward_on(device, x, w, np.full(4, 0.25, F32), eps=1e-5)
    assert (y == 0.25).all() and np.allclose(rstd, 1 / np.sqrt(1e-5), rtol=1e-6)


# ---------------------------------------------------------------- the seed form (upstream InfiniCore's)

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(6, 48), (2, 3, 4099)], ids=str)
@pytest.mark.parametrize("bias", (True, False), ids=("bias", "no_bias"))
@pytest.mark.parametrize("device", DEVICES)
def test_seed_form_writes_xhat_and_std(device, dtype, shape, bias):
    x, w, b = inputs(np.random.default_rng(4), shape, 1, dtype)
    b = b if bias else None
    output, xhat, std = seed_form_on(device, x, w, b, dtype, 1e-3)
    y_only, _, _ = seed_form_on(device, x, w, b, dtype, 1e-3, with_statistics=False)
    eps = float(np.float32(1e-3))  # the seed create takes a float
    assert_y_close(output, x, w, b, 1, dtype, eps)
    assert np.array_equal(output.view(np.uint8), y_only.view(np.uint8))  # the same y with or without the rest
    assert_y_close(xhat, x, None, None, 1, dtype, eps)
    _, _, _, _, expected_std = reference(x, None, None, 1, eps)
    bound = STAT_BOUND[np.dtype(dtype)] + ROUND[np.dtype(dtype)]
    assert float(np.max(np.abs(f64(std) - expected_std) / expected_std)) <= bound


@pytest.mark.parametrize("device", DEVICES)
def test_seed_form_with_f32_parameters_writes_an_f32_std(device):
    x, w, b = inputs(np.random.default_rng(4), (5, 40), 1, BF16, F32)
    _, _, std = seed_form_on(device, x, w, b, F32, EPS)
    with infiniop_py.Handle("cpu") as handle:
        output, xhat = np.empty_like(x), np.empty_like(x)
        with pytest.raises(errors.BadTensorDtypeError, match=r"^input_std_deviation: dtype BF16 must equal weight"):
            infiniop_py.LayerNormXhat(handle, output, xhat, np.empty(5, BF16), x, w, b)
    _, _, _, _, expected_std = reference(x, None, None, 1, EPS)
    assert float(np.max(np.abs(f64(std) - expected_std) / expected_std)) <= STAT_BOUND[F32]


# ---------------------------------------------------------------- against torch, and into the backwards

TORCH_DTYPES = {"float16": F16, "bfloat16": BF16, "float32": F32, "float64": F64}


@pytest.mark.parametrize("dtype", tuple(TORCH_DTYPES))
@pytest.mark.parametrize("normalized_shape", [(64,), (6, 32), (4099,)], ids=str)
def test_matches_torch_layer_norm(dtype, normalized_shape):
    """On torch tensors (outputs come back as torch tensors): within the bound of the exact value, within two
    roundings of torch.nn.functional.layer_norm, and the statistics of torch's native_layer_norm."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(4)
    torch_dtype = getattr(torch, dtype)
    x = (torch.randn((3, 5) + normalized_shape, generator=generator) * 2 + 1).to(torch_dtype)
    w = torch.randn(normalized_shape, generator=generator).to(torch_dtype)
    b = torch.randn(normalized_shape, generator=generator).to(torch_dtype)

    y, mean, rstd = infiniop_py.layer_norm(x, w, b, eps=EPS, need_stats=True)

    numpy_dtype = TORCH_DTYPES[dtype]
    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and y.shape == x.shape
    normalized = len(normalized_shape)
    assert_y_close(y.double().numpy(), x.double().numpy(), w.double().numpy(), b.double().numpy(), normalized,
                   numpy_dtype)
    expected, _, _, xhat, _ = reference(x.double().numpy(), w.double().numpy(), b.double().numpy(), normalized, EPS)
    torch_y = torch.nn.functional.layer_norm(x, normalized_shape, w, b, eps=EPS).double().numpy()
    terms = (np.abs(xhat) + 1.0) * np.abs(w.double().numpy()) + np.abs(b.double().numpy())
    assert error_ratio(y.double().numpy(), torch_y, 4 * terms, numpy_dtype) <= 2.0
    _, torch_mean, torch_rstd = torch.native_layer_norm(x, normalized_shape, w, b, EPS)
    # torch's CPU kernel rounds 16-bit data's statistics to the data's dtype; ours stay F32 (what the backward takes).
    tolerance = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 1e-5, "float64": 1e-12}[dtype]
    for ours, theirs in ((mean, torch_mean), (rstd, torch_rstd)):
        assert torch.allclose(ours.double().reshape(theirs.shape), theirs.double(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", tuple(TORCH_DTYPES))
@pytest.mark.parametrize("shape, normalized", [((4, 7, 96), 1), ((3, 5, 8, 16), 2), ((2, 4099), 1)], ids=str)
def test_statistics_feed_the_backwards_to_torch_gradients(dtype, shape, normalized):
    """The Ex form's mean and rstd into the from-input backward, and the seed form's xhat and std into the seed
    backward, give torch's gradients (float64 autograd of the same rounded inputs)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    numpy_dtype = TORCH_DTYPES[dtype]
    x, w, b = inputs(rng, shape, normalized, numpy_dtype)
    grad_y = rounded(rng.standard_normal(shape), numpy_dtype)
    normalized_shape = shape[len(shape) - normalized:]

    x64, w64, b64 = (torch.from_numpy(f64(a)).requires_grad_() for a in (x, w, b))
    torch.nn.functional.layer_norm(x64, normalized_shape, w64, b64, eps=EPS).backward(torch.from_numpy(f64(grad_y)))
    expected = [t.grad.numpy() for t in (x64, w64, b64)]

    _, mean, rstd = infiniop_py.layer_norm(x, w, b, eps=EPS, need_stats=True)
    from_input = infiniop_py.layer_norm_backward(grad_y, w, input=x, mean=mean, rstd=rstd)
    results = {"from-input": from_input}
    if normalized == 1 and len(shape) in (2, 3):  # the seed form's ranks
        output, xhat, std = np.empty_like(x), np.empty_like(x), np.empty(shape[:-1], numpy_dtype)
        with infiniop_py.Handle("cpu") as handle:
            with infiniop_py.LayerNormXhat(handle, output, xhat, std, x, w, b) as operator:
                operator(output, xhat, std, x, w, b)
        results["xhat"] = infiniop_py.layer_norm_backward(grad_y, w, xhat, std)

    # The grads of rounded statistics (and, in the xhat form, of a rounded xhat): each dtype's rounding of them,
    # relative to each gradient's scale.
    bound = {F16: 4e-3, BF16: 3.2e-2, F32: 2e-5, F64: 1e-11}[numpy_dtype]
    for form, grads in results.items():
        for name, actual, wanted in zip(("grad_input", "grad_weight", "grad_bias"), grads, expected):
            scale = float(np.max(np.abs(wanted)))
            err = float(np.max(np.abs(f64(actual) - wanted)))
            assert err <= bound * scale, f"{form} {name}: {err:.3g} > {bound} * {scale:.3g}"


# ---------------------------------------------------------------- operator objects and bad input

def test_operator_object_runs_repeatedly_and_closes():
    x, w, b = inputs(np.random.default_rng(1), (8, 64), 1, F32)
    y, mean, rstd = np.empty_like(x), np.empty(8, F32), np.empty(8, F32)
    with infiniop_py.Handle("cpu") as handle:
        operator = infiniop_py.LayerNorm(handle, y, mean, rstd, x, w, b, eps=EPS)
        for seed in (2, 3):
            x, w, b = inputs(np.random.default_rng(seed), (8, 64), 1, F32)
            operator(y, mean, rstd, x, w, b)
            assert_y_close(y, x, w, b, 1, F32)
            assert_statistics_close(mean, rstd, x, 1, F32)
        operator.close()
        operator.close()
        with pytest.raises(errors.ClosedError):
            operator(y, mean, rstd, x, w, b)


def test_each_run_takes_only_its_own_form():
    """A seed-made descriptor through infiniopLayerNormEx, and an Ex-made one through infiniopLayerNorm: BAD_PARAM,
    nothing written."""
    from infiniop_py._ffi import ffi, libraries

    x, w, b = inputs(np.random.default_rng(1), (4, 32), 1, F32)
    y = np.full_like(x, 7.0)
    pointers = [ffi.from_buffer(a) for a in (y, x, w, b)]
    with infiniop_py.Handle("cpu") as handle:
        with infiniop_py.LayerNormXhat(handle, y, None, None, x, w, b) as seed, \
                infiniop_py.LayerNorm(handle, y, None, None, x, w, b) as ex:
            library = libraries().op
            status = library.infiniopLayerNormEx(seed._pointer, ffi.NULL, 0, pointers[0], ffi.NULL, ffi.NULL,
                                                 *pointers[1:], ffi.NULL)
            assert status == errors.BadParamError.status
            status = library.infiniopLayerNorm(ex._pointer, ffi.NULL, 0, pointers[0], ffi.NULL, ffi.NULL,
                                               *pointers[1:], ffi.NULL)
            assert status == errors.BadParamError.status
    assert (y == 7.0).all()


@pytest.mark.parametrize("call, error, message", [
    (lambda x, w, b: infiniop_py.layer_norm(x.astype(np.int32), w, b), errors.BadTensorDtypeError, r"^x: dtype I32"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w.astype(np.float64), b), errors.BadTensorDtypeError,
     r"^w: dtype F64"),
    (lambda x, w, b: infiniop_py.layer_norm(x.astype(BF16), w, b.astype(BF16)), errors.BadTensorDtypeError,
     r"^b: dtype BF16 must equal w's dtype F32"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w[:-1], b), errors.BadTensorShapeError, r"^w: shape \(15,\)"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w, b[:-1]), errors.BadTensorShapeError, r"^b: shape \(15,\)"),
    (lambda x, w, b: infiniop_py.layer_norm(x, np.ones((2, 3, 16), F32), None), errors.BadTensorShapeError,
     r"^w: rank 3 must be 1..2"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w, b, eps=-1.0), errors.BadParamError, r"^eps: -1.0"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w, b, eps=float("inf")), errors.BadParamError, r"^eps: inf"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w, b, need_stats=True,
                                            out=(np.empty_like(x), np.empty(4, F32), np.empty(3, F32))),
     errors.BadTensorShapeError, r"^out\[1\], mean: shape \(4,\) must be \(3,\)"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w, b, need_stats=True,
                                            out=(np.empty_like(x), np.empty(3, F32), np.empty(3, F16))),
     errors.BadTensorDtypeError, r"^rstd: dtype F16 must be F32"),
    (lambda x, w, b: infiniop_py.layer_norm(x, w, b, out=(np.empty_like(x), np.empty(3, F32), None)), ValueError,
     r"mean is not wanted"),
])
def test_bad_input_raises_a_named_error(call, error, message):
    x, w, b = inputs(np.random.default_rng(0), (3, 16), 1, F32)
    with pytest.raises(error, match=message):
        call(x, w, b)


def test_operators_refuse_bad_layouts_by_name():
    x, w, b = inputs(np.random.default_rng(0), (3, 16), 1, F32)
    with infiniop_py.Handle("cpu") as handle:
        with pytest.raises(errors.BadTensorStridesError, match=r"^y: strides"):
            infiniop_py.LayerNorm(handle, ((3, 16), F32, (0, 1)), None, None, x, w, b)
        with pytest.raises(errors.BadTensorStridesError, match=r"^rstd: strides"):
            infiniop_py.LayerNorm(handle, np.empty_like(x), None, ((3,), F32, (0,)), x, w, b)
        with pytest.raises(errors.BadTensorStridesError, match=r"^x: strides .* last 1 \(normalized\) dims packed"):
            infiniop_py.LayerNorm(handle, np.empty_like(x), None, None, ((3, 16), F32, (32, 2)), w, b)
        with pytest.raises(errors.BadTensorStridesError, match=r"^input_standardization: strides"):
            infiniop_py.LayerNormXhat(handle, np.empty_like(x), ((3, 16), F32, (0, 1)), None, x, w, b)
        with pytest.raises(errors.BadTensorShapeError, match=r"^output: shape \(16,\) has 1 dims"):
            infiniop_py.LayerNormXhat(handle, np.empty(16, F32), None, None, x[0], w, b)
        with pytest.raises(errors.BadTensorShapeError, match=r"^input_std_deviation: shape \(4,\)"):
            infiniop_py.LayerNormXhat(handle, np.empty_like(x), None, np.empty(4, F32), x, w, b)
        with pytest.raises(errors.NullPointerError, match=r"^weight: tensor descriptor is NULL"):
            infiniop_py.LayerNormXhat(handle, np.empty_like(x), None, None, x, None, b)
        y = np.empty_like(x)
        with infiniop_py.LayerNorm(handle, y, np.empty(3, F32), None, x, w, b) as operator:
            with pytest.raises(errors.BadParamError, match="mean"):
                operator(y, y.reshape(-1)[:3], None, x, w, b)  # mean inside y


def test_without_ex_entry_points_the_ex_form_names_the_missing_function(monkeypatch):
    """Against an InfiniCore install (no ...Ex) the seed form runs; LayerNorm names the function it lacks."""
    from infiniop_py import _operator

    real = _operator._native_function
    monkeypatch.setattr(_operator, "_native_function",
                        lambda library, name: None if name.endswith("Ex") else real(library, name))
    x, w, b = inputs(np.random.default_rng(5), (6, 48), 1, F16)
    y = np.empty_like(x)
    with infiniop_py.Handle("cpu") as handle:
        with infiniop_py.LayerNormXhat(handle, y, None, None, x, w, b) as operator:
            operator(y, None, None, x, w, b)
        with pytest.raises(errors.NotImplementedStatusError, match="LayerNormDescriptorEx"):
            infiniop_py.LayerNorm(handle, y, None, None, x, w, b)
    assert_y_close(y, x, w, b, 1, F16)
