"""Large outputs take the CPU's streaming path when their contiguous runs are long (or, for BatchNorm, all
aligned): stores that bypass the caches, each run's head computed on a padded copy until the output is aligned
for them, and (RMS, LayerNorm) the next row reduced and the one after fetched during each row's pass.
devices/cpu/row_hints.h has the thresholds: 8 MiB of output, runs of 4 KiB. None of that may change a result: the same bits at every output alignment (streamed or
not), in place or not, and the same bits as the cached path that a few of the same rows take."""

import numpy as np
import pytest

import infiniop_py
from _helpers import (BF16, F16, F32, assert_close, batch_norm_backward_reference, batch_norm_inputs, channels_last,
                      layer_norm_backward_reference, layer_norm_inputs, rms_norm_backward_reference, rms_norm_inputs)

DIM = 4100  # not a multiple of the 16-element vectors: every row has a tail as well as a head
ROWS = {F32: 520, F16: 1040, BF16: 1040}  # 8.5 MB of grad_x each: just over the streaming threshold
OFFSETS = (0, 1, 3, 7)  # elements into a larger buffer: the outputs' addresses differ modulo 64 bytes


def _rms(dtype, rows):
    grad_y, x, w = rms_norm_inputs(np.random.default_rng(0), (rows, DIM), dtype)
    return (grad_y, x, w), (lambda inputs, out: infiniop_py.rms_norm_backward(*inputs, out=out)), \
        rms_norm_backward_reference


def _layer(dtype, rows):
    grad_output, weight, xhat, std = layer_norm_inputs(np.random.default_rng(0), (rows, DIM), dtype)
    return (grad_output, weight, xhat, std), \
        (lambda inputs, out: infiniop_py.layer_norm_backward(*inputs, out=out)), layer_norm_backward_reference


OPS = {"rms_norm": _rms, "layer_norm": _layer}


def _row_output_at(offset, like):
    buffer = np.empty(like.size + 16, like.dtype)
    return buffer[offset:offset + like.size].reshape(like.shape)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_streamed_outputs_do_not_depend_on_alignment_and_match_the_reference(op, dtype):
    inputs, run, reference = OPS[op](dtype, ROWS[dtype])
    big = inputs[0]
    assert big.nbytes >= 8 << 20 and DIM * dtype.itemsize >= 4096, "the case must take the streaming path"
    vector_outputs = {"rms_norm": 1, "layer_norm": 2}[op]
    results, alignments = [], set()
    for offset in OFFSETS:
        row_output = _row_output_at(offset, big)
        alignments.add(row_output.ctypes.data % 64)
        outputs = run(inputs, (row_output, *(np.empty(DIM, dtype) for _ in range(vector_outputs))))
        results.append(b"".join(o.tobytes() for o in outputs))
    assert len(alignments) >= 3, alignments
    assert len(set(results)) == 1, "results depend on the output's alignment"
    expected = reference(*inputs)
    for got, want, name in zip(outputs, expected, ("row output", "vector output", "vector output")):
        assert_close(got, want, dtype, f"{op} {name}")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", OPS)
def test_streamed_rows_equal_the_same_rows_computed_through_the_caches(op, dtype):
    """A row's output depends only on that row and the weight: the first rows of a streamed call must equal a
    call of just those rows, which is too small to stream."""
    inputs, run, _ = OPS[op](dtype, ROWS[dtype])
    few = 8
    small_inputs = tuple(a[:few] if a.ndim and a.shape[0] == ROWS[dtype] else a for a in inputs)
    assert small_inputs[0].nbytes < 8 << 20
    streamed = run(inputs, None)[0]
    cached = run(small_inputs, None)[0]
    assert streamed[:few].tobytes() == cached.tobytes()


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_streamed_in_place_rms_equals_the_out_of_place_call(cpu_handle, dtype):
    (grad_y, x, w), _, _ = _rms(dtype, ROWS[dtype])
    grad_x, grad_w = np.empty_like(grad_y), np.empty_like(w)
    with infiniop_py.RMSNormBackward(cpu_handle, grad_x, grad_w, grad_y, x, w) as operator:
        operator(grad_x, grad_w, grad_y, x, w)
        in_place, in_place_w = grad_y.copy(), np.empty_like(w)
        operator(in_place, in_place_w, in_place, x, w)
    assert in_place.tobytes() == grad_x.tobytes() and in_place_w.tobytes() == grad_w.tobytes()


# (N, C, L) with >= 8 MiB of grad_input (N doubles for 2-byte dtypes): long channel runs (streamed at any
# alignment), and short runs of one 16-element vector (streamed only when the output is aligned to it),
# channels-first and channels-last.
BATCH_CASES = {
    "long-runs": ((4, 4, 140000), False),
    "short-runs": ((8800, 15, 16), False),  # an odd C: the pairs of one-vector runs leave one over
    "channels-last": ((8192, 16, 16), True),
}


@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("case", BATCH_CASES)
def test_streamed_batch_norm_does_not_depend_on_alignment_and_matches_the_reference(case, dtype):
    (n, c, length), last = BATCH_CASES[case]
    shape = (n * 4 // dtype.itemsize, c, length)  # the same bytes for every dtype
    x, grad_output, weight, mean, var = batch_norm_inputs(np.random.default_rng(2), shape, dtype)
    if last:
        x, grad_output = channels_last(x), channels_last(grad_output)
    assert x.nbytes >= 8 << 20
    results, alignments = [], set()
    for offset in (0, 1, 8):  # elements from a 64-byte boundary
        buffer = np.empty(x.size + 64, dtype)
        start = (-buffer.ctypes.data % 64) // dtype.itemsize + offset
        flat = buffer[start:start + x.size]
        grad_input = flat.reshape(x.shape) if not last else channels_last(np.zeros(x.shape, dtype))
        if last:  # the same memory, laid out channels-last
            grad_input = np.lib.stride_tricks.as_strided(flat, x.shape, grad_input.strides)
        alignments.add(grad_input.ctypes.data % 64)
        outputs = infiniop_py.batch_norm_backward(x, grad_output, weight, mean, var,
                                                  out=(grad_input, np.empty_like(weight), np.empty_like(weight)))
        results.append(b"".join(np.ascontiguousarray(o).tobytes() for o in outputs))
    assert 0 in alignments and len(alignments) == 3, alignments
    assert len(set(results)) == 1, "results depend on the output's alignment"
    expected = batch_norm_backward_reference(x, grad_output, weight, mean, var)
    for got, want, name in zip(outputs, expected, ("grad_input", "grad_weight", "grad_bias")):
        assert_close(got, want, dtype, f"batch_norm {case} {name}")
