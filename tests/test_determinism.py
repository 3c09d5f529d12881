"""Results are bitwise identical between runs, between OMP_NUM_THREADS=1, 2 and 3, and (row norms) whatever call a row
is in."""

import os
import subprocess
import sys

import numpy as np
import pytest

from _devices import DEVICES, call_on
from _helpers import BF16, F16, F32, LAYER_NORM, OPS, RMS_NORM, assert_matches_reference

# Many rows / a large batch, so that the work splits into several row blocks and partial sums.
SHAPES = {"rms_norm_backward": (3, 1500, 192), "layer_norm_backward": (3, 1500, 192),
          "batch_norm_backward": (48, 6, 700)}
# The row ops' other schedules (devices/cpu/row_driver.h), on 2 and 3 threads (one thread takes whole blocks).
# Inputs over 8 MiB with fewer row blocks than two per thread: the threads split every row at fixed chunks, the
# blocks capped by the size of their partials (17 rows of 140000: 3 blocks of up to 6 rows, its last an odd
# one; 3 rows of 2^20: one block). LayerNorm pairs the long rows of a block for its partials, an odd last row
# alone. Cached inputs (8 MiB or less) with too few blocks, of rows too short to split by chunks: every row's
# sums, then the threads take column slices, the last with a scalar tail (20 rows of 5000: one block; 48 rows
# of 2100: three blocks of 16 rows). A single row of 2^20 (cached): split at chunks, its 16-bit gradients rounded
# straight from the row's terms. Cached 16-bit rows whose blocks are capped by the size of their partials (240
# rows of 4500: 14 blocks of up to 18 rows, not 15 of 16; in F32 over 8 MiB, so not cached). Each shape has work
# enough for 3 threads (cpu::threadsFor).
LONG_ROW_SHAPES = {"one split row": (1, 1 << 20), "split rows, capped blocks": (17, 140000), "split rows, one capped block": (3, 1 << 20),
                   "column slices": (20, 5000), "column slices, three blocks": (48, 2100),
                   "cached blocks capped": (240, 4500)}
# Short rows (cached, at most 512 bytes) run a row block per kernel call, in groups of up to 16 rows that stay in
# L1, on any number of threads: groups with a last partial one and rows with a partial last vector (1000 rows of
# 24), one vector a row (4096 rows of 16), a single block with two groups (40 rows of 100), and rows of 256 (short
# in BF16, not in F32).
SHORT_ROW_SHAPES = {"short rows, partial groups and vectors": (1000, 24), "short rows of one vector": (4096, 16),
                    "short rows, one block": (40, 100), "short rows, longest": (600, 256)}
DTYPES = {"f32": F32, "bf16": BF16}
RAW = {2: np.uint16, 4: np.uint32}  # saved as raw bits: np.save cannot store bfloat16 itself

RUN_ALL = """
import sys
import ml_dtypes
import numpy as np
import infiniop_py

directory = sys.argv[1]
dtypes = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
for line in open(directory + "/cases.txt").read().split():
    op, dtype, count = line.split(":")
    inputs = [np.load(f"{directory}/{op}-{dtype}-{i}.npy").view(dtypes[dtype]) for i in range(int(count))]
    outputs = getattr(infiniop_py, op)(*inputs)
    with open(f"{directory}/{op}-{dtype}.out", "wb") as out:
        out.write(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
"""


def save_inputs(directory, cases, shape_of):
    """Save each case's inputs for RUN_ALL; the cases' ops, in order."""
    lines = []
    for case in cases:
        for dtype_name, dtype in DTYPES.items():
            inputs = case.make_inputs(np.random.default_rng(11), shape_of(case), dtype)
            for i, array in enumerate(inputs):
                np.save(directory / f"{case.name}-{dtype_name}-{i}.npy", array.view(RAW[array.itemsize]))
            lines.append(f"{case.name}:{dtype_name}:{len(inputs)}")
    (directory / "cases.txt").write_text("\n".join(lines))
    return cases


@pytest.fixture(scope="module")
def saved_inputs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("determinism")
    return directory, save_inputs(directory, OPS, lambda case: SHAPES[case.name])


def run_in_subprocess(saved, omp_threads):
    """Run every saved case in a fresh interpreter; {(op, dtype): output bytes}."""
    directory, cases = saved
    env = dict(os.environ, OMP_NUM_THREADS=str(omp_threads))
    subprocess.run([sys.executable, "-c", RUN_ALL, str(directory)], env=env, check=True, timeout=300)
    outputs = {}
    for case in cases:
        for dtype_name in DTYPES:
            path = directory / f"{case.name}-{dtype_name}.out"
            outputs[case.name, dtype_name] = path.read_bytes()
            path.unlink()
    return outputs


def assert_same_bits_with_1_2_and_3_threads(saved):
    one_thread = run_in_subprocess(saved, 1)
    for threads in (2, 3):
        more_threads = run_in_subprocess(saved, threads)
        assert one_thread.keys() == more_threads.keys()
        for key in one_thread:
            assert len(one_thread[key]) > 0
            assert one_thread[key] == more_threads[key], f"{key}: OMP_NUM_THREADS=1 and {threads} differ"


def test_one_two_and_three_threads_give_identical_bits(saved_inputs):
    assert_same_bits_with_1_2_and_3_threads(saved_inputs)


ROW_SHAPES = {**LONG_ROW_SHAPES, **SHORT_ROW_SHAPES}


@pytest.mark.parametrize("shape", ROW_SHAPES.values(), ids=ROW_SHAPES.keys())
def test_long_row_schedules_give_identical_bits_with_1_2_and_3_threads(tmp_path, shape):
    assert_same_bits_with_1_2_and_3_threads((tmp_path, save_inputs(tmp_path, (RMS_NORM, LAYER_NORM), lambda _: shape)))


@pytest.mark.parametrize("shape", ROW_SHAPES.values(), ids=ROW_SHAPES.keys())
@pytest.mark.parametrize("case", (RMS_NORM, LAYER_NORM), ids=str)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=str)
def test_long_row_schedules_match_the_reference(case, dtype, shape):
    inputs = case.make_inputs(np.random.default_rng(13), shape, dtype)
    assert_matches_reference(case, case.function()(*inputs), inputs, dtype)


FORWARDS = """
import sys
import ml_dtypes
import numpy as np
import infiniop_py

inputs = np.load(sys.argv[1])
for name in sorted(key[:-2] for key in inputs.files if key.endswith("_x")):
    x, w, b = (inputs[f"{name}_{part}"] for part in "xwb")
    if name.endswith("bf16"):
        x, w, b = (a.view(ml_dtypes.bfloat16) for a in (x, w, b))
    outputs = (infiniop_py.rms_norm(x, w, need_rstd=True), infiniop_py.layer_norm(x, w, b, need_stats=True))
    sys.stdout.buffer.write(b"".join(np.ascontiguousarray(o).tobytes() for pair in outputs for o in pair))
"""


def test_short_row_forwards_give_identical_bits_with_1_2_and_3_threads(tmp_path):
    """The forwards' short rows (the backwards' are above): y and the statistics of RMSNorm and LayerNorm."""
    rng = np.random.default_rng(15)
    arrays = {}
    for name, (rows, dim) in SHORT_ROW_SHAPES.items():
        for dtype_name, dtype in DTYPES.items():
            x, w, b = (rng.standard_normal(shape).astype(dtype) for shape in ((rows, dim), (dim,), (dim,)))
            key = f"{name.replace(' ', '_').replace(',', '')}_{dtype_name}"
            arrays.update({f"{key}_x": x, f"{key}_w": w, f"{key}_b": b})
    path = tmp_path / "inputs.npz"
    np.savez(path, **{key: a.view(np.uint16) if a.dtype == BF16 else a for key, a in arrays.items()})
    results = {threads: subprocess.run([sys.executable, "-c", FORWARDS, str(path)], check=True, capture_output=True,
                                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS=str(threads))).stdout
               for threads in (1, 2, 3)}
    assert results[1] and results[1] == results[2] == results[3]


# Long rows of inputs over 8 MiB are reduced inside the previous row's elementwise pass, except the first row of
# each row block (or, with rows split across threads, row 0): blocks of 5 rows of 8200 (two 4096-element chunks
# and a scalar tail), and 3 rows of 2^20 split across threads. Cached rows are reduced on their own: by blocks of
# 17 rows (300 rows of 1000), or all first where threads split the columns (20 rows of 5000).
IDENTICAL_ROW_SHAPES = {"blocks of 5 rows": (300, 8200), "split rows": (3, 1 << 20),
                        "cached blocks": (300, 1000), "column slices": (20, 5000), "short rows": (1000, 24)}


@pytest.mark.parametrize("shape", IDENTICAL_ROW_SHAPES.values(), ids=IDENTICAL_ROW_SHAPES.keys())
@pytest.mark.parametrize("case", (RMS_NORM, LAYER_NORM), ids=str)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=str)
def test_identical_rows_give_identical_bits_however_they_are_reduced(case, dtype, shape):
    rows, dim = shape
    one_row = case.make_inputs(np.random.default_rng(14), (1, dim), dtype)
    inputs = [np.repeat(a, rows, axis=0) if a.shape[0] == 1 else a for a in one_row]  # the weight stays (dim,)
    grad = case.function()(*inputs)[0]
    assert grad.shape == (rows, dim)
    for row in range(1, rows):
        assert grad[row].tobytes() == grad[0].tobytes(), f"row {row} differs from row 0"


# Row lengths around the CPU forwards' whole-row kernels (rows of at most 128 elements), and longer ones (the row
# kernels); on a GPU around the packed kernels' limits.
FORWARD_DIMS = (1, 16, 17, 40, 64, 65, 100, 128, 129, 200, 1000, 4500)


def _forward(device, op, x, w, b):
    import infiniop_py as ip

    if op == "layer_norm":
        return call_on(device, ip.layer_norm, x, w, b, need_stats=True)
    return call_on(device, ip.rms_norm, x, w, need_rstd=True)


def _off_the_vector_grid(x):
    """x's copy, its rows one stride apart as x's, starting an element past a 16-byte boundary (the kernels' vector
    loads and streaming stores need that alignment; on a GPU another kernel takes such rows)."""
    flat = np.zeros(x.size + 16 // x.itemsize, x.dtype)
    start = (-(flat.__array_interface__["data"][0] // x.itemsize) + 1) % (16 // x.itemsize)
    copy = flat[start:start + x.size].reshape(x.shape)
    copy[...] = x
    assert copy.__array_interface__["data"][0] % 16 == x.itemsize
    return copy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", FORWARD_DIMS)
@pytest.mark.parametrize("op", ("layer_norm", "rms_norm"))
@pytest.mark.parametrize("dtype", (F32, BF16, F16), ids=str)
def test_a_forward_rows_bits_do_not_depend_on_the_call_it_is_in(device, op, dtype, dim):
    """Alone, among rows one stride apart, among rows of a non-uniform layout, off the 16-byte grid, and (on the
    CPU) first in a call over the caches' 8 MiB, a row gives the same y and statistics (cpu::runWholeRowsAlways):
    F32 rows of 17-128 had come out a few roundings apart between the CPU's whole-row kernels and its row
    kernels."""
    rng = np.random.default_rng(dim)
    rows = 40
    x = (rng.standard_normal((rows, dim)) * 3 + 1).astype(dtype)
    w, b = rng.standard_normal(dim).astype(dtype), rng.standard_normal(dim).astype(dtype)
    together = _forward(device, op, x, w, b)
    assert together[0].view(np.uint8).any(), "the rows' outputs should not be all zero bits"
    alone = [np.concatenate(parts) for parts in zip(*(_forward(device, op, x[i:i + 1], w, b) for i in range(rows)))]
    padded = np.zeros((4, 11, dim), dtype)  # 4 x 10 rows, 11 rows apart between the groups: not one stride
    padded[:, :10] = x.reshape(4, 10, dim)
    strided = [o.reshape(together_o.shape) for o, together_o in zip(_forward(device, op, padded[:, :10], w, b),
                                                                     together)]
    ways = {"alone": alone, "non-uniform layout": strided,
            "off the 16-byte grid": _forward(device, op, _off_the_vector_grid(x), w, b)}
    if device == "cpu":  # the CPU's plans depend on whether a call fits its caches
        big_rows = (4 << 20) // (dim * dtype.itemsize) + rows  # x over 4 MiB: x and y over 8 MiB, not cached
        big_x = np.concatenate([x, (rng.standard_normal((big_rows - rows, dim)) * 3 + 1).astype(dtype)])
        ways["first in a call over 8 MiB"] = [o[:rows] for o in _forward(device, op, big_x, w, b)]
    for name, outputs in ways.items():
        for index, (got, want) in enumerate(zip(outputs, together)):
            differ = np.count_nonzero(got.view(np.uint8) != want.view(np.uint8))
            assert differ == 0, f"{name}: output {index} has {differ} bytes apart from the rows called together"


# The row backwards' forms: each takes (grad, x, row statistics) and gives grad_x; the statistics come from the
# forward (rstd; mean and rstd), or the seed LayerNorm's xhat and std stand for x and its statistics.
def _backward(form, g, x, statistics, w):
    import infiniop_py as ip

    if form == "rms_norm":
        return ip.rms_norm_backward(g, x, w)[0]
    if form == "rms_norm, rstd":
        return ip.rms_norm_backward(g, x, w, rstd=statistics[0])[0]
    if form == "layer_norm, xhat and std":
        return ip.layer_norm_backward(g, w, x, statistics[0])[0]
    return ip.layer_norm_backward(g, w, input=x, mean=statistics[0], rstd=statistics[1])[0]


def _row_statistics(form, x, w):
    import infiniop_py as ip

    if form == "rms_norm, rstd":
        return [ip.rms_norm(x, w, need_rstd=True)[1]]
    if form == "layer_norm, xhat and std":
        return [np.sqrt(x.astype(np.float64).var(-1) + 1e-5).astype(x.dtype)]  # x stands for xhat
    if form == "layer_norm, input, mean and rstd":
        return list(ip.layer_norm(x, w, None, need_stats=True)[1:])
    return []


# CPU only: on the NVIDIA backend a row's grad_x still depends on its call (a single long row takes the split plan,
# rows off the 16-byte grid other kernels), which the backward kernels' rewrite (issue 53) is to remove.
@pytest.mark.parametrize("dim", FORWARD_DIMS)
@pytest.mark.parametrize("form", ("rms_norm", "rms_norm, rstd", "layer_norm, xhat and std",
                                  "layer_norm, input, mean and rstd"))
@pytest.mark.parametrize("dtype", (F32, BF16, F16), ids=str)
def test_a_backward_rows_grad_x_does_not_depend_on_the_call_it_is_in(form, dtype, dim):
    """As the forwards: alone, among rows one stride apart, in a non-uniform layout, off the 16-byte grid, and first
    in a call over the caches' 8 MiB, a row's grad_x has the same bits."""
    rng = np.random.default_rng(dim)
    rows, big_rows = 40, (4 << 20) // (dim * dtype.itemsize) + 40
    big_x = (rng.standard_normal((big_rows, dim)) * 3 + 1).astype(dtype)
    big_g = rng.standard_normal((big_rows, dim)).astype(dtype)
    w = rng.standard_normal(dim).astype(dtype)
    big_statistics = _row_statistics(form, big_x, w)
    x, g, statistics = big_x[:rows].copy(), big_g[:rows].copy(), [s[:rows].copy() for s in big_statistics]
    together = _backward(form, g, x, statistics, w)
    # (A LayerNorm row of one element has grad_x 0 from its input: its xhat is 0.)
    assert together.view(np.uint8).any() or form.endswith("mean and rstd") and dim == 1, "grad_x is all zero bits"

    def non_uniform(a):  # 4 x 10 rows, 11 rows apart between the groups
        padded = np.zeros((4, 11) + a.shape[1:], a.dtype)
        padded[:, :10] = a.reshape((4, 10) + a.shape[1:])
        return padded[:, :10]
    ways = {
        "alone": np.concatenate([_backward(form, g[i:i + 1], x[i:i + 1], [s[i:i + 1] for s in statistics], w)
                                 for i in range(rows)]),
        "non-uniform layout": _backward(form, non_uniform(g), non_uniform(x), [non_uniform(s) for s in statistics],
                                        w).reshape(together.shape),
        "off the 16-byte grid": _backward(form, _off_the_vector_grid(g), _off_the_vector_grid(x), statistics, w),
        "first in a call over 8 MiB": _backward(form, big_g, big_x, big_statistics, w)[:rows],
    }
    for name, grad_x in ways.items():
        differ = np.count_nonzero(grad_x.view(np.uint8) != together.view(np.uint8))
        assert differ == 0, f"{name}: grad_x has {differ} bytes apart from the rows called together"


@pytest.mark.parametrize("case", OPS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=str)
def test_repeated_runs_give_identical_bits(case, dtype):
    inputs = case.make_inputs(np.random.default_rng(12), SHAPES[case.name], dtype)
    first = [o.copy() for o in case.function()(*inputs)]
    for _ in range(3):
        again = case.function()(*inputs)
        for a, b in zip(first, again):
            assert a.tobytes() == b.tobytes()


# BatchNorm's channels-first sums pass keeps scratch per thread, for as many threads as there were when the
# descriptor was made. Made on one thread and called on three (omp_set_num_threads in between), a call must
# neither write past its workspace nor change a bit. 8 channel blocks of one (batch, length) group here.
THREADS_CHANGE = """
import ctypes, sys
import numpy as np
import infiniop_py

made_on, called_on = int(sys.argv[1]), int(sys.argv[2])
openmp = ctypes.CDLL("libgomp.so.1")  # the runtime the library already loaded
openmp.omp_set_num_threads(made_on)
rng = np.random.default_rng(15)
shape = (8, 512, 32)
x, grad_output = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
weight, mean, invstd = rng.standard_normal(512).astype(np.float32), x.mean((0, 2)), 1 / (x.std((0, 2)) + 1e-5)
outputs = np.empty_like(x), np.empty_like(weight), np.empty_like(weight)
guard = 4096
with infiniop_py.Handle("cpu") as handle, infiniop_py.BatchNormBackward(
        handle, *outputs, x, grad_output, weight, None, None, mean, invstd) as operator:
    workspace = np.full(operator.workspace_size + guard, 0xA5, np.uint8)
    openmp.omp_set_num_threads(called_on)
    operator(*outputs, x, grad_output, weight, None, None, mean, invstd, workspace=workspace)
    assert (workspace[operator.workspace_size:] == 0xA5).all(), "the call wrote past its workspace"
sys.stdout.buffer.write(b"".join(o.tobytes() for o in outputs))
"""


def test_batch_norm_called_on_more_threads_than_it_was_made_for_stays_in_its_workspace():
    def run(made_on, called_on):
        return subprocess.run([sys.executable, "-c", THREADS_CHANGE, str(made_on), str(called_on)],
                              check=True, capture_output=True, timeout=300).stdout

    one_thread = run(1, 1)
    assert len(one_thread) == 4 * (8 * 512 * 32 + 2 * 512)
    assert run(1, 3) == one_thread
    assert run(3, 3) == one_thread


# A block's partial weight gradients begin with its first row's terms, written over whatever the workspace (or,
# for one block of F32, the gradient itself) held: no zeroing pass. Every schedule, with the workspace and the
# outputs filled with 0xA5 bytes (-2.9e-16 as F32), gives the bits of a zeroed workspace.
START_SHAPES = dict(IDENTICAL_ROW_SHAPES, **{"one row": (1, 1 << 20), "one block of F32 rows": (20, 700)})


@pytest.mark.parametrize("shape", START_SHAPES.values(), ids=START_SHAPES.keys())
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=str)
def test_partials_start_from_each_blocks_first_row_not_from_the_workspace(op, dtype, shape):
    import infiniop_py as ip

    rng = np.random.default_rng(15)
    data = lambda *dims: rng.standard_normal(dims).astype(np.float32).astype(dtype)  # noqa: E731
    grad_out, row_input, weight = data(*shape), data(*shape), data(shape[1])
    if op == "rms_norm":
        inputs, make = (grad_out, row_input, weight), ip.RMSNormBackward
        outputs = (np.empty(shape, dtype), np.empty(shape[1], dtype))
    else:
        inputs, make = (grad_out, weight, row_input, (rng.random(shape[0]) + 0.5).astype(dtype)), ip.LayerNormBackward
        outputs = (np.empty(shape, dtype), np.empty(shape[1], dtype), np.empty(shape[1], dtype))
    results = []
    with ip.Handle("cpu") as handle, make(handle, *outputs, *inputs) as operator:
        for fill in (0x00, 0xA5, 0x00):
            workspace = np.full(max(operator.workspace_size, 1), fill, np.uint8)
            for output in outputs:
                output.view(np.uint8)[...] = fill
            operator(*outputs, *inputs, workspace=workspace)
            results.append([output.tobytes() for output in outputs])
    assert results[1] == results[0] == results[2]


# A single row's 16-bit weight gradients are its terms rounded, written by the elementwise pass itself where the
# kernels read the weight as it is (contiguous, 4096 elements or more) and every wanted gradient is contiguous;
# otherwise the terms go through an F32 partial, summed and rounded at the end. Both ways give the same bits, in
# every output (with a scalar tail, and with rows split at chunks over the threads).
@pytest.mark.parametrize("dim", [4096, 4096 + 5, 2 * 4096 + 17, 1 << 18])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", (BF16, F16), ids=str)
def test_a_single_rows_gradients_rounded_straight_have_the_bits_of_summed_partials(op, dtype, dim):
    import infiniop_py as ip

    rng = np.random.default_rng(16)
    data = lambda *dims: rng.standard_normal(dims).astype(np.float32).astype(dtype)  # noqa: E731
    grad_out, row_input, weight = data(1, dim), data(1, dim), data(dim)

    def strided(vector):  # the same values, every other element of a buffer twice as long
        buffer = np.zeros(2 * vector.size, vector.dtype)
        buffer[::2] = vector
        return buffer[::2]

    def run(strided_weight=False, strided_gradient=False):
        w = strided(weight) if strided_weight else weight
        gradient = lambda: strided(np.zeros(dim, dtype)) if strided_gradient else np.zeros(dim, dtype)  # noqa: E731
        if op == "rms_norm":
            outputs, inputs, make = (np.empty((1, dim), dtype), gradient()), (grad_out, row_input, w), ip.RMSNormBackward
        else:
            # Only the bias gradient strided: the kernels write both gradients one way, so neither is rounded straight.
            outputs = (np.empty((1, dim), dtype), np.zeros(dim, dtype), gradient())
            inputs, make = (grad_out, w, row_input, np.array([1.25], dtype)), ip.LayerNormBackward
        with ip.Handle("cpu") as handle, make(handle, *outputs, *inputs) as operator:
            # The workspace is sized by the layout (no weight copy or partials where these go unused): exactly
            # that much, then guard bytes the call must leave alone.
            size, guard = operator.workspace_size, 4096
            workspace = np.full(size + guard, 0xA5, np.uint8)
            operator(*outputs, *inputs, workspace=workspace[:size])
            assert (workspace[size:] == 0xA5).all(), "the call wrote past its workspace"
        return [np.ascontiguousarray(output).tobytes() for output in outputs]

    straight = run()
    assert run(strided_gradient=True) == straight
    assert run(strided_weight=True) == straight


# A single row's 16-bit bias gradient is grad_output's own bits, as +0.0 + go rounded back gives them: -0.0 made
# +0.0, NaNs quiet with their payload, infinities and subnormals kept (on AVX512-BF16 too, whose rounding would
# flush subnormals). The strided gradient takes the F32 partial instead, summed and rounded at the end.
SPECIAL_BITS = {BF16: (0x8000, 0x0000, 0x7f81, 0xff81, 0x7fc3, 0x7f80, 0xff80, 0x0001, 0x8001, 0x3f80),
                F16: (0x8000, 0x0000, 0x7c01, 0xfc01, 0x7e03, 0x7c00, 0xfc00, 0x0001, 0x8001, 0x3c00)}


@pytest.mark.parametrize("dim", [4096 + 5, 1 << 18])
@pytest.mark.parametrize("dtype", (BF16, F16), ids=str)
def test_a_single_rows_bias_gradient_is_grad_output_plus_zero_at_special_values(dtype, dim):
    import infiniop_py as ip

    rng = np.random.default_rng(17)
    data = lambda *dims: rng.standard_normal(dims).astype(np.float32).astype(dtype)  # noqa: E731
    grad_out, row_input, weight, std = data(1, dim), data(1, dim), data(dim), np.array([1.25], dtype)
    special = np.array(SPECIAL_BITS[dtype], np.uint16)
    positions = np.concatenate([3 * np.arange(special.size) + 1, dim - 1 - np.arange(special.size)])  # the tail too
    grad_out.view(np.uint16)[0, positions] = np.tile(special, 2)

    def bias_gradient(strided):
        grad_bias = np.zeros(2 * dim, dtype)[::2] if strided else np.zeros(dim, dtype)
        outputs = (np.empty((1, dim), dtype), np.zeros(dim, dtype), grad_bias)
        with ip.Handle("cpu") as handle, ip.LayerNormBackward(handle, *outputs, grad_out, weight, row_input,
                                                              std) as operator:
            operator(*outputs, grad_out, weight, row_input, std)
        return np.ascontiguousarray(grad_bias).view(np.uint16)

    straight = bias_gradient(strided=False)
    assert (straight == bias_gradient(strided=True)).all()
    quiet = 0x0040 if dtype == BF16 else 0x0200
    expected = np.where(special == 0x8000, 0, special)
    expected = np.where((special & 0x7fff) > (0x7f80 if dtype == BF16 else 0x7c00), expected | quiet, expected)
    assert [hex(b) for b in straight[positions]] == [hex(b) for b in np.tile(expected, 2)]
    plain = np.setdiff1d(np.arange(dim), positions)
    assert (straight[plain] == grad_out.view(np.uint16)[0, plain]).all()


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", (np.float32, BF16, F16), ids=str)
def test_a_single_rows_workspace_holds_no_parameter_vector_it_leaves_unused(op, dtype):
    """A single long row reads a contiguous weight as stored and its gradients take their terms themselves
    (F32 in place, 16-bit rounded straight), so its workspace is the chunk sums only; a strided weight needs its
    copy back."""
    import infiniop_py as ip

    dim = 1 << 18
    row, vector = (lambda: np.zeros((1, dim), dtype)), (lambda: np.zeros(dim, dtype))  # noqa: E731
    strided_vector = np.zeros(2 * dim, dtype)[::2]

    def workspace_size(weight):
        with ip.Handle("cpu") as handle:
            if op == "rms_norm":
                operator = ip.RMSNormBackward(handle, row(), vector(), row(), row(), weight)
            else:
                operator = ip.LayerNormBackward(handle, row(), vector(), vector(), row(), weight, row(),
                                                np.ones(1, dtype))
            with operator:
                return operator.workspace_size

    vector_bytes = dim * 4  # one parameter vector in F32
    assert workspace_size(vector()) < vector_bytes // 16
    assert workspace_size(strided_vector) >= vector_bytes
