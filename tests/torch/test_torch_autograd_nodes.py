"""The eager path's C++ autograd nodes (infiniop_py/torch/autograd_nodes.py and .cpp): they build here, their
outputs and gradients are the Python Functions' bit for bit (the same forward and kernels) across dtypes, parameter
forms, layouts, ranks and devices, an output may be modified in place, a saved input may not, the descriptor cache
serves more layouts than it keeps, and where the nodes cannot be built the Python Functions serve, saying why."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from _devices import DEVICES
from _torch_helpers import TORCH_ERRORS_CRASH, TORCH_ERRORS_CRASH_REASON, LoggedTensor, torch

from infiniop_py.torch import autograd_nodes, functional

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the nodes are built on Linux only")


def test_the_nodes_build_and_load_here():
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C++ compiler ({compiler}) on this machine: the Python Functions serve (tested below)")
    assert autograd_nodes.status() == (True, "")


def _run(call, tensors, grad_seed=1):
    """(output, gradients of the tensors that require grad, grad_fn's type name) of call(*copies).backward(g)."""
    copies = [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    output = call(*copies)
    generator = torch.Generator().manual_seed(grad_seed)
    output.backward(torch.randn(output.shape, generator=generator).to(output.device, output.dtype))
    return (output.detach(), [t.grad for t in copies if t is not None and t.requires_grad],
            type(output.grad_fn).__name__)


def _with_python_functions(monkeypatch, call, tensors):
    with monkeypatch.context() as patch:
        patch.setattr(autograd_nodes, "_state", (None, "off for this comparison"))
        return _run(call, tensors)


def _assert_same_bits(monkeypatch, call, tensors, node_expected=True):
    output, gradients, node = _run(call, tensors)
    expected_output, expected_gradients, function = _with_python_functions(monkeypatch, call, tensors)
    assert node == ("CppFunction" if node_expected else function)
    assert function.endswith("FunctionBackward")
    assert torch.equal(output, expected_output)
    assert len(gradients) == len(expected_gradients)
    for got, want in zip(gradients, expected_gradients):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def _tensor(shape, dtype, device, seed, requires_grad=True, positive=False):
    generator = torch.Generator().manual_seed(seed)
    values = torch.rand(shape, generator=generator) + 0.5 if positive else torch.randn(shape, generator=generator)
    return values.to(device, dtype).requires_grad_(requires_grad)


_TORCH_DEVICE = {"cpu": "cpu", "nvidia": "cuda"}
# (data dtype, parameter dtype)
_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
           (torch.float16, torch.float32), (torch.float64, torch.float64)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, parameter_dtype", _DTYPES, ids=str)
def test_rms_norm_through_the_node_gives_the_python_functions_bits(monkeypatch, device, dtype, parameter_dtype):
    torch_device = _TORCH_DEVICE[device]
    for shape, normalized in (((3, 5, 40), [40]), ((4, 6, 8), [6, 8]), ((7, 300), [300])):
        x = _tensor(shape, dtype, torch_device, 1)
        weight = _tensor(normalized, parameter_dtype, torch_device, 2, positive=True)
        _assert_same_bits(monkeypatch, lambda x, w: functional.rms_norm(x, normalized, w, 1e-6), (x, weight))
        # the weight frozen, then the input: each gradient only where it is wanted
        _assert_same_bits(monkeypatch, lambda x, w: functional.rms_norm(x, normalized, w),
                          (x, weight.detach()))
        _assert_same_bits(monkeypatch, lambda x, w: functional.rms_norm(x, normalized, w), (x.detach(), weight))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, parameter_dtype", _DTYPES, ids=str)
def test_layer_norm_through_the_node_gives_the_python_functions_bits(monkeypatch, device, dtype, parameter_dtype):
    torch_device = _TORCH_DEVICE[device]
    x = _tensor((4, 6, 48), dtype, torch_device, 3)
    weight = _tensor((48,), parameter_dtype, torch_device, 4, positive=True)
    bias = _tensor((48,), parameter_dtype, torch_device, 5)
    layer_norm = functional.layer_norm
    _assert_same_bits(monkeypatch, lambda x, w, b: layer_norm(x, [48], w, b), (x, weight, bias))
    _assert_same_bits(monkeypatch, lambda x, w: layer_norm(x, [48], w, None), (x, weight))
    _assert_same_bits(monkeypatch, lambda x, b: layer_norm(x, [48], None, b), (x, bias))
    _assert_same_bits(monkeypatch, lambda x: layer_norm(x, [6, 48]), (x,))
    _assert_same_bits(monkeypatch, lambda x, w, b: layer_norm(x, [48], w, b), (x.detach(), weight, bias))
    # a non-contiguous input (a transposed view) and a row of one element
    _assert_same_bits(monkeypatch, lambda x, w, b: layer_norm(x.transpose(0, 1), [48], w, b), (x, weight, bias))
    _assert_same_bits(monkeypatch, lambda x: layer_norm(x, [1]), (_tensor((5, 1), dtype, torch_device, 6),))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, parameter_dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_through_the_node_gives_the_python_functions_bits(monkeypatch, device, dtype, parameter_dtype,
                                                                     training):
    torch_device = _TORCH_DEVICE[device]
    channels = 5
    for shape, memory_format in (((6, channels), None), ((4, channels, 7), None),
                                 ((3, channels, 4, 6), torch.channels_last),
                                 ((2, channels, 3, 2, 4), torch.channels_last_3d), ((3, channels, 4, 6), None)):
        x = _tensor(shape, dtype, torch_device, 7)
        if memory_format is not None:
            x = x.detach().to(memory_format=memory_format).requires_grad_()
        weight = _tensor((channels,), parameter_dtype, torch_device, 8, positive=True)
        bias = _tensor((channels,), parameter_dtype, torch_device, 9)

        def call(x, w, b):  # fresh running statistics each call: both sides start from the same ones
            running = (torch.zeros(channels, dtype=parameter_dtype, device=torch_device),
                       torch.ones(channels, dtype=parameter_dtype, device=torch_device))
            return functional.batch_norm(x, *running, w, b, training, 0.1, 1e-5)
        if dtype in (torch.float16, torch.bfloat16) and parameter_dtype is dtype and device == "nvidia":
            continue  # torch's CUDA kernel with 16-bit parameters: tested by the module tests against torch
        _assert_same_bits(monkeypatch, call, (x, weight, bias))
        _assert_same_bits(monkeypatch, lambda x: functional.batch_norm(x, None, None, training=True),
                          (x,), node_expected=True)


def test_operands_the_nodes_do_not_take_run_the_python_functions(monkeypatch):
    """Parameters of mixed dtypes (the Python Functions widen them first), an RMSNorm without weight, BatchNorm
    parameters not of shape (C,): the same results as before, through the Python Functions."""
    x = _tensor((4, 16), torch.float32, "cpu", 10)
    half_weight = _tensor((16,), torch.bfloat16, "cpu", 11, positive=True)
    _assert_same_bits(monkeypatch, lambda x, w: functional.rms_norm(x, [16], w), (x, half_weight),
                      node_expected=False)
    _assert_same_bits(monkeypatch, lambda x: functional.rms_norm(x, [16]), (x,), node_expected=False)
    images = _tensor((2, 3, 4, 4), torch.float32, "cpu", 12)
    column = _tensor((3, 1), torch.float32, "cpu", 13, positive=True)
    _assert_same_bits(monkeypatch, lambda x, w: functional.batch_norm(x, None, None, w, None, True), (images, column),
                      node_expected=False)


def test_an_output_may_be_modified_in_place_and_gives_torchs_gradients():
    """The node makes the forward's output its own (marked dirty), not a view of it: relu_ after a norm, as
    torchvision's ResNet does after BatchNorm, is allowed and differentiated."""
    x = _tensor((8, 3, 5, 5), torch.float64, "cpu", 14)
    weight, bias = _tensor((3,), torch.float64, "cpu", 15, positive=True), _tensor((3,), torch.float64, "cpu", 16)
    gradients = []
    for batch_norm in (functional.batch_norm, torch.nn.functional.batch_norm):
        copies = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
        output = batch_norm(copies[0], None, None, copies[1], copies[2], True)
        assert output._base is None
        output.relu_().square().sum().backward()
        gradients.append([t.grad for t in copies])
    for got, want in zip(*gradients):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("path", ["cpp forward", "cpp node", "python functions"])
def test_an_inference_mode_input_gives_rms_norms_weight_its_gradient(monkeypatch, path):
    """Data made under torch.inference_mode into an RMSNorm whose weight trains: torch's CPU RMSNorm (a composite)
    takes it; ours raised 'Inference tensors cannot be saved for backward' (2026-12-08). Each path saves a copy."""
    with torch.inference_mode():
        x = torch.randn(64, 32, generator=torch.Generator().manual_seed(19)).t()  # a view: any layout
    weight = _tensor((64,), torch.float32, "cpu", 20, positive=True)
    grad = torch.randn(32, 64, generator=torch.Generator().manual_seed(21))
    if path == "python functions":
        monkeypatch.setattr(autograd_nodes, "_state", (None, "off for this path"))
    results = []
    for rms_norm in (functional.rms_norm, torch.nn.functional.rms_norm):
        w = weight.detach().clone().requires_grad_()
        if rms_norm is functional.rms_norm and path == "cpp node":  # the node alone, as a Parameter input gets it
            output = autograd_nodes.apply("rms_norm", (x, [64], w, None))[0]
        else:
            output = rms_norm(x, [64], w)
        output.backward(grad)
        results.append((output.detach(), w.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert x.is_inference() and not x.requires_grad


@pytest.mark.skipif(TORCH_ERRORS_CRASH, reason=TORCH_ERRORS_CRASH_REASON)
def test_an_inference_mode_input_to_layer_norm_or_batch_norm_is_refused_as_torch_refuses_it():
    """LayerNorm and BatchNorm save their input, in torch as here: the same error, naming the cause."""
    with torch.inference_mode():
        rows, images = torch.randn(256, 16), torch.randn(4, 8, 3, 3)
    calls = []
    for layer_norm in (functional.layer_norm, torch.nn.functional.layer_norm):
        calls.append(lambda layer_norm=layer_norm: layer_norm(rows, [16], torch.ones(16, requires_grad=True)))
    for batch_norm in (functional.batch_norm, torch.nn.functional.batch_norm):
        calls.append(lambda batch_norm=batch_norm: batch_norm(images, None, None, torch.ones(8, requires_grad=True),
                                                              None, True))
    for call in calls:
        with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
            call()


@pytest.mark.skipif(TORCH_ERRORS_CRASH, reason=TORCH_ERRORS_CRASH_REASON)
def test_a_saved_input_modified_in_place_is_refused_in_the_backward():
    x = _tensor((4, 32), torch.float32, "cpu", 17)
    weight = _tensor((32,), torch.float32, "cpu", 18, positive=True)
    source = x.detach().clone().requires_grad_()
    input = source * 1.0
    output = functional.rms_norm(input, [32], weight)
    assert type(output.grad_fn).__name__ == "CppFunction"
    with torch.no_grad():
        input.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        output.sum().backward()


def test_more_layouts_than_the_descriptor_cache_keeps(monkeypatch):
    """70 layouts (the cache keeps 64, then starts again) and the first one again: each the Python Functions' bits."""
    weight = _tensor((24,), torch.float32, "cpu", 19, positive=True)
    for rows in list(range(1, 71)) + [1]:
        x = _tensor((rows, 24), torch.float32, "cpu", 20 + rows)
        _assert_same_bits(monkeypatch, lambda x, w: functional.layer_norm(x, [24], w, None), (x, weight))


_WITHOUT_COMPILER = """
import torch, infiniop_py.torch as ipt
from infiniop_py.torch import autograd_nodes, functional
functional._TORCH_BELOW = {}
built, why = autograd_nodes.status()
x = torch.randn(4, 32, requires_grad=True)
norm = ipt.LayerNorm(32)
output = norm(x)
output.sum().backward()
print(built, type(output.grad_fn).__name__, x.grad is not None and norm.weight.grad is not None)
print(why)
"""


def test_without_a_compiler_the_python_functions_serve_and_status_says_why(tmp_path):
    environment = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", _WITHOUT_COMPILER], capture_output=True, text=True, timeout=300,
                            env=environment, check=True)
    first, why = result.stdout.splitlines()[:2]
    assert first == "False LayerNormFunctionBackward True"
    assert "no-such-compiler" in why


def test_builds_unused_for_a_month_and_stale_partial_ones_are_pruned(tmp_path):
    day = 86400
    ages = {"autograd_nodes-old.so": 31 * day, "autograd_nodes-recent.so": 29 * day,
            "autograd_nodes-old.123.tmp": 2 * day, "autograd_nodes-new.456.tmp": 60, "other-file.so": 400 * day}
    now = time.time()
    for name, age in ages.items():
        path = tmp_path / name
        path.write_bytes(b"")
        os.utime(path, (now - age, now - age))
    autograd_nodes._prune(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["autograd_nodes-new.456.tmp", "autograd_nodes-recent.so",
                                                           "other-file.so"]


def test_eval_batch_norms_of_one_layout_and_other_eps_get_their_own_descriptors(monkeypatch):
    """In eval the backward's invstd comes from eps: a descriptor made for one eps must not serve another."""
    x = _tensor((4, 3, 5), torch.float32, "cpu", 30)
    running_var = torch.rand(3, generator=torch.Generator().manual_seed(31)) + 0.01
    results = []
    for eps in (1e-5, 0.5, 1e-5):
        call = lambda x, eps=eps: functional.batch_norm(x, torch.zeros(3), running_var, None, None, False, 0.1, eps)
        _assert_same_bits(monkeypatch, call, (x,))
        results.append(_run(call, (x,))[1][0])
    assert not torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def _forward_calls():
    """The C++ forwards run so far: per op (RMSNorm, LayerNorm, BatchNorm), then those of them through this
    library's kernels."""
    return list(torch.ops.infiniop_nodes.forward_calls())


def _forwards_since(before):
    return [now - then for now, then in zip(_forward_calls(), before)]


@pytest.mark.parametrize("dtype, parameter_dtype", _DTYPES, ids=str)
def test_the_whole_forward_runs_in_cpp_with_the_python_forwards_bits(monkeypatch, dtype, parameter_dtype):
    """Ordinary operands take the C++ forward (one op call: issue 52's host time), this library's kernels where
    ops.py would choose them (LayerNorm from its minimum size on) and PyTorch's else: outputs,
    statistics, gradients and running statistics are the Python path's bit for bit."""
    if not autograd_nodes.status()[0]:
        pytest.skip(f"the nodes are not built here: {autograd_nodes.status()[1]}")
    from infiniop_py.torch import ops
    rows = ops._LIBRARY_LAYER_NORM_MIN_ELEMENTS.get(dtype, 0) // 256 + 1
    x, small = _tensor((rows, 256), dtype, "cpu", 40), _tensor((3, 256), dtype, "cpu", 41)
    weight = _tensor((256,), parameter_dtype, "cpu", 42, positive=True)
    bias = _tensor((256,), parameter_dtype, "cpu", 43)
    before = _forward_calls()
    for data in (x, small):
        _assert_same_bits(monkeypatch, lambda x, w: functional.rms_norm(x, [256], w), (data, weight))
        _assert_same_bits(monkeypatch, lambda x, w, b: functional.layer_norm(x, [256], w, b), (data, weight, bias))
    minimum = ops._LIBRARY_LAYER_NORM_MIN_ELEMENTS.get(dtype)
    library_layer_norms = 0 if minimum is None else sum(data.numel() >= minimum for data in (x, small))
    assert _forwards_since(before) == [2, 2, 0, 2, library_layer_norms, 0]

    images = _tensor((8, 16, 16, 16), dtype, "cpu", 44).detach().to(memory_format=torch.channels_last)
    images.requires_grad_()
    channel_weight = _tensor((16,), parameter_dtype, "cpu", 45, positive=True)
    channel_bias = _tensor((16,), parameter_dtype, "cpu", 46)
    running = []

    def call(x, w, b, training=True):
        statistics = (torch.zeros(16, dtype=parameter_dtype), torch.ones(16, dtype=parameter_dtype))
        running.append(statistics)
        return functional.batch_norm(x, *statistics, w, b, training, 0.1, 1e-5)
    before = _forward_calls()
    for training in (True, False):
        _assert_same_bits(monkeypatch, lambda x, w, b: call(x, w, b, training), (images, channel_weight, channel_bias))
    # the C++ side's running statistics (first of each pair of calls) are the Python side's
    for ours, python in zip(running[0::2], running[1::2]):
        assert all(torch.equal(a, b) for a, b in zip(ours, python))
    library_batch_norm = dtype not in (torch.float16, torch.bfloat16) or parameter_dtype is torch.float32
    assert _forwards_since(before) == [0, 0, 2, 0, 0, 2 * int(library_batch_norm)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_cpp_forwards_statistics_are_the_python_forwards_in_shape_strides_and_bits(dtype):
    """Where this library's kernels run the forward in C++, they write the statistics with the normalized dims kept
    (size 1), as PyTorch's forwards and the Python forward save them: the same shape, strides, dtype and bits, with
    one normalized dim and with two."""
    if not autograd_nodes.status()[0]:
        pytest.skip(f"the nodes are not built here: {autograd_nodes.status()[1]}")
    from infiniop_py.torch import ops
    x = _tensor((4, 32, 16, 8), dtype, "cpu", 64, requires_grad=False)  # 16384 elements: F32's library size too
    assert x.numel() >= ops._LIBRARY_LAYER_NORM_MIN_ELEMENTS[dtype]
    for normalized in ([8], [16, 8]):
        weight = _tensor(normalized, dtype, "cpu", 65, requires_grad=False, positive=True)
        bias = _tensor(normalized, dtype, "cpu", 66, requires_grad=False)
        for name, args in (("layer_norm", (x, normalized, weight, bias, 1e-5)), ("rms_norm", (x, normalized, weight,
                                                                                               1e-6))):
            before = _forward_calls()
            ours = autograd_nodes._FORWARDS[name](*args)
            assert _forwards_since(before)[3 if name == "rms_norm" else 4] == 1, name  # the library's kernel ran
            theirs = ops.FORWARDS[name](*args)
            kept = tuple(x.shape[:x.dim() - len(normalized)]) + (1,) * len(normalized)
            assert len(ours) == len(theirs) and all(statistic.shape == kept for statistic in ours[1:]), name
            for a, b in zip(ours, theirs):
                assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype), (name, normalized)
                assert torch.equal(a, b), (name, normalized)


def test_the_cpp_forward_without_autograd_gives_the_python_forwards_bits(monkeypatch):
    """Under no_grad, and with nothing requiring grad, the C++ forward runs without a node: no grad_fn, and the
    outputs and updated running statistics of the Python forward (ops.FORWARDS)."""
    if not autograd_nodes.status()[0]:
        pytest.skip(f"the nodes are not built here: {autograd_nodes.status()[1]}")
    x = _tensor((4, 8, 6, 6), torch.float32, "cpu", 47, requires_grad=False)
    weight, bias = _tensor((8,), torch.float32, "cpu", 48, positive=True), _tensor((8,), torch.float32, "cpu", 49)

    def run():
        running = (torch.zeros(8), torch.ones(8))
        outputs = [functional.batch_norm(x, *running, weight, bias, True), functional.rms_norm(x, [6], weight[:6]),
                   functional.layer_norm(x, [6, 6], None, None)]
        return outputs, running
    before = _forward_calls()
    with torch.no_grad():
        ours, our_running = run()
    assert _forwards_since(before)[:3] == [1, 1, 1]
    with monkeypatch.context() as patch:
        patch.setattr(autograd_nodes, "_state", (None, "off for this comparison"))
        theirs, their_running = run()
    assert all(output.grad_fn is None for output in ours)
    assert all(torch.equal(a, b) for a, b in zip(ours + list(our_running), theirs + list(their_running)))


@pytest.mark.skipif(TORCH_ERRORS_CRASH, reason=TORCH_ERRORS_CRASH_REASON)
def test_operands_the_cpp_forward_does_not_take_get_the_python_forwards_errors():
    """A weight of the wrong shape, on another dtype's terms, an eval BatchNorm without running statistics, a
    channel mismatch: the C++ forward declines, and the Python forward raises torch's errors (tests/torch/
    test_torch_checks.py has them all), so none of these counts as a C++ forward."""
    if not autograd_nodes.status()[0]:
        pytest.skip(f"the nodes are not built here: {autograd_nodes.status()[1]}")
    x = _tensor((4, 8), torch.float32, "cpu", 50)
    before = _forward_calls()
    with pytest.raises(RuntimeError):
        functional.rms_norm(x, [8], torch.ones(7))
    with pytest.raises(RuntimeError):
        functional.layer_norm(x, [8], torch.ones(8), torch.ones(5))
    with pytest.raises((RuntimeError, ValueError)):
        functional.batch_norm(x, None, None, training=False)
    with pytest.raises(RuntimeError):
        functional.batch_norm(x, torch.zeros(5), torch.ones(5), training=True)
    with pytest.raises((RuntimeError, ValueError)):
        functional.batch_norm(x[:1], None, None, training=True)  # one value per channel
    assert _forwards_since(before) == [0] * 6


def test_the_forwards_module_and_ops_agree_and_a_build_without_the_module_uses_the_ops():
    """The forwards are a Python module where Python's headers were found (autograd_nodes._FORWARDS), and always
    the ops torch.ops.infiniop_nodes.<op>_forward: the same outputs; a build without the module's init is loaded as
    a library of ops, and _import says so (None)."""
    if not autograd_nodes.status()[0]:
        pytest.skip(f"the nodes are not built here: {autograd_nodes.status()[1]}")
    x = _tensor((3, 16), torch.float32, "cpu", 60, requires_grad=False)
    weight, bias = _tensor((16,), torch.float32, "cpu", 61), _tensor((16,), torch.float32, "cpu", 62)
    nodes = torch.ops.infiniop_nodes
    pairs = ((autograd_nodes._FORWARDS["rms_norm"](x, [16], weight, 1e-6),
              nodes.rms_norm_forward(x, [16], weight, 1e-6)),
             (autograd_nodes._FORWARDS["layer_norm"](x, [16], weight, bias, 1e-5),
              nodes.layer_norm_forward(x, [16], weight, bias, 1e-5)),
             (autograd_nodes._FORWARDS["batch_norm"](x, weight, bias, None, None, True, 0.1, 1e-5),
              nodes.batch_norm_forward(x, weight, bias, None, None, True, 0.1, 1e-5)))
    for ours, ops in pairs:
        assert len(ours) == len(ops) > 0 and all(torch.equal(a, b) for a, b in zip(ours, ops))
    from infiniop_py import library_path
    assert autograd_nodes._import(library_path()) is None  # a shared library without PyInit__infiniop_nodes


def test_a_tensor_subclass_takes_torchs_own_function():
    """A subclass may override torch's functions (__torch_function__), which the C++ forward would bypass: the
    functional hands it torch's own, as torch.nn's modules do (test_torch_func.py has the modules)."""
    if not autograd_nodes.status()[0]:
        pytest.skip(f"the nodes are not built here: {autograd_nodes.status()[1]}")

    LoggedTensor.seen.clear()
    x = _tensor((4, 8), torch.float32, "cpu", 63).detach().as_subclass(LoggedTensor)
    before = _forward_calls()
    output = functional.layer_norm(x, [8])
    assert _forwards_since(before) == [0] * 6 and LoggedTensor.seen[0] is torch.nn.functional.layer_norm
    torch.testing.assert_close(output.as_subclass(torch.Tensor),
                               torch.nn.functional.layer_norm(x.as_subclass(torch.Tensor), [8]))
