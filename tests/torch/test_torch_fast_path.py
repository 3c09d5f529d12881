"""The torch path through the functional API's per-layout cache (_known_layouts): each module's backward (and
RMSNorm's CPU forward) is checked once per layout and then runs from the cached operator, with the same bits; a
layout the native op refuses runs checked every time. The cache's own key rules (strides, dtypes, devices, the
negative bit, CUDA streams) are tested in tests/test_functional_fast_path.py. The modules' backwards here are the
Python Functions' (the C++ autograd nodes keep a cache of their own: tests/torch/test_torch_autograd_nodes.py)."""

import importlib

import pytest

from _torch_helpers import cpp_library_forwards, torch

import infiniop_py
import infiniop_py.torch as ipt
from infiniop_py import _functional, _known_layouts

RMS = importlib.import_module("infiniop_py.rms_norm_backward")._SIGNATURE
RMS_FORWARD = importlib.import_module("infiniop_py.rms_norm")._SIGNATURE


@pytest.fixture
def checked_runs(monkeypatch):
    """The names of the tensors the checked path converted (none: every call took the cached path); the cache
    starts empty."""
    _known_layouts.forget()
    names, as_tensor = [], _functional.as_tensor
    monkeypatch.setattr(_functional, "as_tensor", lambda *a, **k: names.append(a[1]) or as_tensor(*a, **k))
    return names


def _module_step(module, x, grad):
    x = x.detach().requires_grad_()
    module(x).backward(grad)
    return [x.grad, *(parameter.grad for parameter in module.parameters())]


@pytest.mark.parametrize("make, shape, channels_last", [
    (lambda: ipt.RMSNorm(16), (4, 16), False), (lambda: ipt.LayerNorm(16), (4, 16), False),
    (lambda: ipt.BatchNorm2d(3), (2, 3, 4, 5), True)], ids=["RMSNorm", "LayerNorm", "BatchNorm2d channels-last"])
def test_a_modules_layout_is_checked_once_then_runs_cached(python_functions, checked_runs, make, shape,
                                                            channels_last):
    module = make()
    generator = torch.Generator().manual_seed(0)
    x, grad = (torch.randn(shape, generator=generator) for _ in range(2))
    if channels_last:
        x, grad = (t.contiguous(memory_format=torch.channels_last) for t in (x, grad))
    first = _module_step(module, x, grad)
    assert checked_runs, "the first call of a layout is checked"
    checked_runs.clear()
    for _ in range(3):
        module.zero_grad(set_to_none=True)
        again = _module_step(module, x, grad)
        assert all(torch.equal(a, b) for a, b in zip(again, first))
    assert not checked_runs


def test_a_layout_the_native_op_refuses_runs_checked_every_time(checked_runs):
    """A last dim that is not contiguous runs on packed copies in the checked path: no entry is made for it."""
    generator = torch.Generator().manual_seed(2)
    grad_y, x = (torch.randn(8, 3, generator=generator).t() for _ in range(2))  # (3, 8), last stride 3
    weight = torch.rand(8, generator=generator) + 0.5
    for _ in range(2):
        checked_runs.clear()
        got = RMS.run((grad_y, x, weight, None), (torch.empty(3, 8), torch.empty(8)), (1e-6,), (True, True))
        assert checked_runs
    assert not _known_layouts._torch_runners and not _known_layouts._native_torch_tables
    reference = infiniop_py.rms_norm_backward(grad_y.contiguous(), x.contiguous(), weight, eps=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got, reference))


@pytest.mark.parametrize("weight_dtype, used", [(torch.float32, True), (None, False), (torch.bfloat16, False)])
def test_rms_norm_forward_on_the_cpu_is_the_librarys_where_it_takes_the_operands(monkeypatch, weight_dtype, used):
    """infiniop_py.torch's RMSNorm forward runs this library's CPU kernel for a weight of the data's dtype (here
    F32), and PyTorch's for what the kernel does not take (no weight; BF16 weights on F32 data); either way the
    output is within F32 rounding of the float64 reference."""
    forwards = []
    real = RMS_FORWARD.run
    monkeypatch.setattr(RMS_FORWARD, "run", lambda *a: forwards.append(1) or real(*a))
    cpp_forwards = cpp_library_forwards()[0]  # or in the C++ forward, where the autograd nodes are built
    x = torch.randn(4, 6, 16, dtype=torch.float64)
    weight = None if weight_dtype is None else (torch.rand(16, dtype=torch.float64) + 0.5).to(weight_dtype)
    output = ipt.rms_norm(x.float(), [16], weight, 1e-6)
    reference = torch.nn.functional.rms_norm(x, [16], None if weight is None else weight.double(), 1e-6)
    torch.testing.assert_close(output.double(), reference, rtol=2e-6, atol=2e-6)
    assert bool(forwards or cpp_library_forwards()[0] > cpp_forwards) == used
