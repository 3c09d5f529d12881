"""infiniop_py.torch.launch: the torch path's per-layout cache. A layout's first call runs the checked path, later
ones go straight to the native run; another dtype, shape, stride, device or option never reuses an entry, and every
call gives the checked path's bits."""

import importlib

import pytest

from _torch_helpers import torch

import infiniop_py
import infiniop_py.torch as ipt
from infiniop_py.torch import launch

RMS = importlib.import_module("infiniop_py.rms_norm_backward")._SIGNATURE
BATCH = importlib.import_module("infiniop_py.batch_norm_backward")._SIGNATURE


@pytest.fixture
def checked_runs(monkeypatch):
    """The checked runs of the two signatures, counted; the cache starts empty."""
    monkeypatch.setattr(launch, "_entries", {})
    calls = []
    for signature in (RMS, BATCH):
        original = signature.run

        def counted(*arguments, original=original, signature=signature):
            calls.append(signature)
            return original(*arguments)

        monkeypatch.setattr(signature, "run", counted)
    return calls


def _rms_arguments(dtype, rows=3, width=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    grad_y, x = (torch.randn(rows, width, generator=generator).to(dtype) for _ in range(2))
    weight = (torch.rand(width, generator=generator) + 0.5).to(dtype)
    return grad_y, x, weight


def _rms_run(grad_y, x, weight, want_weight=True):
    out = (torch.empty_like(x), torch.empty_like(weight) if want_weight else None)
    return launch.run(RMS, (grad_y, x, weight, None), out, (1e-6,), (True, want_weight))


def test_a_known_layout_skips_the_checked_path_and_gives_its_bits(checked_runs):
    expected = infiniop_py.rms_norm_backward(*_rms_arguments(torch.float32), eps=1e-6)
    for seed in range(3):
        arguments = _rms_arguments(torch.float32, seed=seed)
        reference = infiniop_py.rms_norm_backward(*arguments, eps=1e-6)
        got = _rms_run(*arguments)
        assert all(torch.equal(a, b) for a, b in zip(got, reference))
    assert checked_runs.count(RMS) == 1 + 3 + 1  # four references, and the cached layout's first call
    assert all(torch.equal(a, b) for a, b in zip(_rms_run(*_rms_arguments(torch.float32)), expected))


@pytest.mark.parametrize("change", ["dtype", "shape", "wanted", "strides"])
def test_another_layout_makes_its_own_entry(checked_runs, change):
    _rms_run(*_rms_arguments(torch.float32))
    _rms_run(*_rms_arguments(torch.float32))
    assert len(checked_runs) == 1
    if change == "dtype":
        arguments, want = _rms_arguments(torch.float64), True
    elif change == "shape":
        arguments, want = _rms_arguments(torch.float32, rows=5), True
    elif change == "wanted":
        arguments, want = _rms_arguments(torch.float32), False
    else:  # the same shape and dtype, rows two apart in a wider buffer
        grad_y, x, weight = _rms_arguments(torch.float32, rows=6)
        arguments, want = (grad_y[::2], x[::2], weight), True
    got = _rms_run(*arguments, want_weight=want)
    reference = infiniop_py.rms_norm_backward(*arguments, eps=1e-6, need_grad_weight=want)
    assert len(checked_runs) == 3  # the new layout's own checked run, then the reference's
    assert all(a is None and b is None or torch.equal(a, b) for a, b in zip(got, reference))
    assert len(launch._entries) == 2


def test_channels_last_and_channels_first_are_two_entries(checked_runs):
    generator = torch.Generator().manual_seed(1)
    input, grad_output = (torch.randn(2, 3, 4, 5, generator=generator) for _ in range(2))
    weight, mean, invstd = torch.rand(3) + 0.5, torch.randn(3), torch.rand(3) + 0.5
    results = []
    for memory_format in (torch.contiguous_format, torch.channels_last, torch.contiguous_format):
        x, gy = (t.contiguous(memory_format=memory_format) for t in (input, grad_output))
        out = (torch.empty_like(x), torch.empty(3), torch.empty(3))
        launch.run(BATCH, (x, gy, weight, None, None, mean, invstd), out, (0.0, True), (True, True, True))
        results.append(out)
    assert len(launch._entries) == 2 and len(checked_runs) == 2
    assert results[1][0].is_contiguous(memory_format=torch.channels_last)
    for other in results[1:]:
        torch.testing.assert_close(other[0], results[0][0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(other[1], results[0][1], rtol=1e-5, atol=1e-6)


def test_a_layout_the_native_op_refuses_runs_checked_every_time(checked_runs):
    """A last dim that is not contiguous runs on packed copies in the checked path: no entry is made for it."""
    grad_y, x, weight = _rms_arguments(torch.float32, rows=8, width=3)
    arguments = (grad_y.t(), x.t(), torch.rand(8) + 0.5)  # (3, 8), last stride 3
    for _ in range(2):
        got = _rms_run(*arguments)
    reference = infiniop_py.rms_norm_backward(*[t.contiguous() for t in arguments], eps=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, reference))
    assert not launch._entries and len(checked_runs) == 3


def test_a_negative_view_is_never_run_from_its_pointer(checked_runs):
    """A tensor with the negative bit stores -value: the checked path copies it, and no entry takes its pointer."""
    grad_y, x, weight = _rms_arguments(torch.float32)
    negative = (-grad_y)._neg_view() if hasattr(torch.Tensor, "_neg_view") else None
    if negative is None or not negative.is_neg():
        pytest.skip("this torch makes no negative views")
    for _ in range(2):
        got = _rms_run(negative, x, weight)
    reference = infiniop_py.rms_norm_backward(grad_y, x, weight, eps=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, reference))
    assert not launch._entries


@pytest.mark.nvidia
def test_cuda_layouts_on_two_streams_give_the_checked_bits(checked_runs):
    """On CUDA: one entry per device layout, run on each caller's current stream, each with its own workspace."""
    arguments = [t.cuda() for t in _rms_arguments(torch.bfloat16, rows=64, width=1024)]
    reference = infiniop_py.rms_norm_backward(*arguments, eps=1e-6)
    side = torch.cuda.Stream()
    results = []
    for stream in (torch.cuda.current_stream(), side, side):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            results.append(_rms_run(*arguments))
        torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    for got in results:
        assert all(torch.equal(a, b) for a, b in zip(got, reference))
    assert len(launch._entries) == 1


@pytest.mark.parametrize("weight_dtype, used", [(torch.float32, True), (None, False), (torch.bfloat16, False)])
def test_rms_norm_forward_on_the_cpu_is_the_librarys_where_it_takes_the_operands(monkeypatch, weight_dtype, used):
    """infiniop_py.torch's RMSNorm forward runs this library's CPU kernel for a weight of the data's dtype (here
    F32), and PyTorch's for what the kernel does not take (no weight; BF16 weights on F32 data); either way the
    output is within F32 rounding of the float64 reference, and rstd is what the backward needs."""
    forwards = []
    real = launch.run
    monkeypatch.setattr(launch, "run", lambda signature, *a: (forwards.append(signature.operator_class.__name__),
                                                              real(signature, *a))[1])
    x = torch.randn(4, 6, 16, dtype=torch.float64)
    weight = None if weight_dtype is None else (torch.rand(16, dtype=torch.float64) + 0.5).to(weight_dtype)
    output = ipt.rms_norm(x.float(), [16], weight, 1e-6)
    reference = torch.nn.functional.rms_norm(x, [16], None if weight is None else weight.double(), 1e-6)
    torch.testing.assert_close(output.double(), reference, rtol=2e-6, atol=2e-6)
    assert ("RMSNorm" in forwards) == used
