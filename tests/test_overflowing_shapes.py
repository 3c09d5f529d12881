"""Reliability II (issue 29, item 1): shapes whose sizes overflow size_t. An empty batch beside a huge broadcast
(zero-stride) parameter once made the CPU workspace sum wrap around (BatchNorm with N = 0 and C = 2^61 reported a
workspace of 0 bytes, RMSNorm and LayerNorm with 0 rows of D just under 2^62 reported 7295) and every call then
died with SIGSEGV. Now an empty batch needs no workspace and runs (zero parameter gradients, nothing read), and a
descriptor whose workspace would overflow is refused with BAD_TENSOR_SHAPE. Each case runs in its own process,
bounded in time (a crash or a loop over 2^61 channels is one failed test)."""

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import numpy as np, infiniop_py
def broadcast(n, dtype=np.float16):
    return np.lib.stride_tricks.as_strided(np.ones(1, dtype), (n,), (0,))
handle = infiniop_py.Handle("cpu")
"""

EMPTY_BATCH_CASES = {
    "batch_norm class eval": """
        C = 2**61
        x = np.zeros((0, C, 1), np.float16)
        with infiniop_py.BatchNormBackward(handle, x, None, None, x, x, broadcast(C), broadcast(C), broadcast(C),
                                           training=False) as op:
            assert op.workspace_size == 0, op.workspace_size
            op(np.zeros_like(x), None, None, x, x, broadcast(C), broadcast(C), broadcast(C))
    """,
    "batch_norm functional, saved statistics, no weight": """
        C = 2**60  # numpy holds no F32 array of 2^61 elements, even a broadcast one
        x = np.zeros((0, C, 1), np.float16)
        stats = broadcast(C, np.float32)
        grad_input, gw, gb = infiniop_py.batch_norm_backward(x, x, None, None, None, save_mean=stats,
                                                             save_invstd=stats, need_grad_weight=False,
                                                             need_grad_bias=False)
        assert grad_input.shape == x.shape and gw is None and gb is None
    """,
    "batch_norm functional training, running statistics": """
        C = 2**61
        x = np.zeros((0, C, 1), np.float16)
        grad_input, _, _ = infiniop_py.batch_norm_backward(x, x, broadcast(C), broadcast(C), broadcast(C),
                                                           need_grad_weight=False, need_grad_bias=False)
        assert grad_input.shape == x.shape
    """,
    "rms_norm class and functional": """
        D = 4602696377065932800
        x = np.zeros((0, D), np.float16)
        with infiniop_py.RMSNormBackward(handle, x, None, x, x, broadcast(D)) as op:
            assert op.workspace_size == 0, op.workspace_size
            op(np.zeros_like(x), None, x, x, broadcast(D))
        grad_x, grad_w = infiniop_py.rms_norm_backward(x, x, broadcast(D), need_grad_weight=False)
        assert grad_x.shape == x.shape and grad_w is None
        rstd = np.zeros((0,), np.float32)
        infiniop_py.rms_norm_backward(x, x, broadcast(D), rstd=rstd, need_grad_weight=False)
    """,
    "layer_norm class, functional, from input, no weight": """
        D = 4602696377065932800
        x = np.zeros((0, D), np.float16)
        std = np.zeros((0,), np.float16)
        with infiniop_py.LayerNormBackward(handle, x, None, None, x, broadcast(D), x, std) as op:
            assert op.workspace_size == 0, op.workspace_size
            op(np.zeros_like(x), None, None, x, broadcast(D), x, std)
        infiniop_py.layer_norm_backward(x, None, x, std, need_grad_weight=False, need_grad_bias=False)
        statistics = np.zeros((0,), np.float32)
        infiniop_py.layer_norm_backward(x, broadcast(D), input=x, mean=statistics, rstd=statistics,
                                        need_grad_weight=False, need_grad_bias=False)
    """,
}


def run_case(body, timeout=60):
    source = textwrap.dedent(PRELUDE) + textwrap.dedent(body)
    try:
        result = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s (a loop over the broadcast extent?)")
    assert result.returncode == 0, f"exit status {result.returncode}:\n{result.stdout}{result.stderr[-3000:]}"


@pytest.mark.parametrize("body", EMPTY_BATCH_CASES.values(), ids=EMPTY_BATCH_CASES.keys())
def test_an_empty_batch_beside_a_huge_broadcast_parameter_runs(body):
    run_case(body)


OVERFLOW_CASES = {
    # Descriptors only (no memory behind them): their CPU workspace would need more than 2^64 bytes. A single row
    # would read a contiguous weight as stored and round its gradients straight, needing neither an F32 weight
    # copy nor partials; a broadcast weight needs both.
    "rms_norm": "infiniop_py.RMSNormBackward(handle, (S, 'float16'), (W, 'float16'), (S, 'float16'), "
                "(S, 'float16'), broadcast(W[0]))",
    "layer_norm": "infiniop_py.LayerNormBackward(handle, (S, 'float16'), (W, 'float16'), (W, 'float16'), "
                  "(S, 'float16'), broadcast(W[0]), (S, 'float16'), ((1,), 'float16'))",
    "batch_norm": "infiniop_py.BatchNormBackward(handle, (B, 'float16'), (V, 'float16'), (V, 'float16'), "
                  "(B, 'float16'), (B, 'float16'), (V, 'float16'), (V, 'float16'), (V, 'float16'))",
}


@pytest.mark.parametrize("create", OVERFLOW_CASES.values(), ids=OVERFLOW_CASES.keys())
def test_a_workspace_beyond_size_t_is_refused(create):
    run_case(f"""
        S, W = (1, 2**61), (2**61,)
        B, V = (1, 2**61, 1), (2**61,)
        try:
            {create}
        except infiniop_py.BadTensorShapeError as error:
            print(error)
        else:
            raise AssertionError("created")
    """)


def test_an_empty_batch_still_zeroes_the_parameter_gradients():
    run_case("""
        for C in (3, 70000):
            x = np.zeros((0, C, 4), np.float32)
            weight = np.ones(C, np.float32)
            out = (np.zeros_like(x), np.full(C, 7, np.float32), np.full(C, 7, np.float32))
            infiniop_py.batch_norm_backward(x, x, weight, weight, weight, out=out)
            assert not out[1].any() and not out[2].any()
            sums = infiniop_py.batch_norm_backward_reduce(x, x, weight, weight)
            assert not any(s.any() for s in sums)
        rows = np.zeros((0, 5), np.float32)
        grad_x, grad_w = infiniop_py.rms_norm_backward(rows, rows, np.ones(5, np.float32))
        assert grad_w.shape == (5,) and not grad_w.any()
    """)
