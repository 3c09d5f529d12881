"""The functional API's numpy fast path (a layout seen before skips straight to the native run) gives the same
results as the first, fully checked call, and still refuses what the checks refuse."""

import numpy as np
import pytest

import infiniop_py as ip
from infiniop_py import _functional


def random_rms_inputs(rows, dim, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, dim)).astype(np.float32), rng.standard_normal((rows, dim)).astype(np.float32),
            rng.standard_normal(dim).astype(np.float32))


def test_repeated_layout_takes_the_fast_path_and_matches_the_checked_call():
    grad_y, x, w = random_rms_inputs(6, 40, seed=1)
    first = ip.rms_norm_backward(grad_y, x, w)
    key = _functional._fast_key(ip.RMSNormBackward, {"grad_y": grad_y, "x": x, "w": w, "rstd": None}, None,
                                {"eps": 0.0}, (True, True))
    assert key in _functional._numpy_fast_path
    other_grad_y, other_x, other_w = random_rms_inputs(6, 40, seed=2)
    second = ip.rms_norm_backward(other_grad_y, other_x, other_w)  # same layout: fast path
    # The same case through an operator object of its own, outside every cache.
    grad_x, grad_w = np.empty_like(second[0]), np.empty_like(second[1])
    with ip.Handle("cpu") as handle, ip.RMSNormBackward(handle, grad_x, grad_w, other_grad_y, other_x, other_w) as op:
        op(grad_x, grad_w, other_grad_y, other_x, other_w)
    assert np.array_equal(second[0], grad_x) and np.array_equal(second[1], grad_w)
    assert not np.array_equal(first[0], second[0])  # really computed from the new data


def test_read_only_output_is_refused_even_for_a_known_layout():
    grad_y, x, w = random_rms_inputs(3, 16, seed=3)
    out = (np.empty_like(grad_y), np.empty_like(w))
    ip.rms_norm_backward(grad_y, x, w, out=out)
    out[0].flags.writeable = False
    with pytest.raises(ValueError, match="grad_x"):
        ip.rms_norm_backward(grad_y, x, w, out=out)


def test_strided_layout_repeats_correctly_through_the_checked_path():
    grad_y, x, w = random_rms_inputs(8, 32, seed=4)
    padded = np.zeros((8, 48), np.float32)
    padded[:, :32] = grad_y
    strided = padded[:, :32]  # not C-contiguous: no direct buffer, so every call takes the checked path
    results = [ip.rms_norm_backward(strided, x, w) for _ in range(2)]
    contiguous = ip.rms_norm_backward(grad_y, x, w)
    for grad_x, grad_w in results:
        assert np.array_equal(grad_x, contiguous[0]) and np.array_equal(grad_w, contiguous[1])
