"""Our libraries as an InfiniCore install, driven the way InfiniCore's own Python test harness drives one (issue 27):
plain ctypes over $INFINI_ROOT/lib/libinfiniop.so and libinfinirt.so, tensor descriptors destroyed right after
the op descriptor is created, the seed create and run functions only, and PyTorch's modules (nn.RMSNorm,
nn.LayerNorm, nn.BatchNorm1d) and autograd as the reference. LayerNorm and BatchNorm run with and without bias
(a layer without bias passes NULL as grad_bias_desc and as the grad_bias pointer), in place (grad_input at
grad_output's address) and out of place, and with padded row strides where the seed allows them.

INFINI_ROOT is laid out as `xmake install -o DIR` lays it out (lib/libinfiniop.so, lib/libinfinirt.so), with the
libraries the package loaded (which setup.py took from that same install step).
"""

import ctypes
import os

import numpy as np
import pytest

import infiniop_py
from _helpers import relative_error

torch = pytest.importorskip("torch", reason="torch is not installed: PyTorch's modules are the reference here")

F16, F32, BF16 = 12, 13, 19  # infiniDtype_t
TORCH_DTYPES = {F16: "float16", F32: "float32"}
TOLERANCE = {F16: 2e-3, F32: 2e-5}


@pytest.fixture(scope="module")
def infini_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("infini_root")
    (root / "lib").mkdir()
    library_dir = os.path.dirname(infiniop_py.library_path())
    for name in ("libinfiniop.so", "libinfinirt.so"):
        os.symlink(os.path.join(library_dir, name), root / "lib" / name)
    return root


class InfiniCore:
    """The libraries through ctypes, as InfiniCore's test/infiniop harness loads them."""

    def __init__(self, root):
        self.op = ctypes.CDLL(os.path.join(root, "lib", "libinfiniop.so"))
        self.rt = ctypes.CDLL(os.path.join(root, "lib", "libinfinirt.so"))
        for function in ("infiniopCreateHandle", "infiniopCreateTensorDescriptor", "infiniopDestroyTensorDescriptor"):
            getattr(self.op, function).restype = ctypes.c_int
        assert self.rt.infinirtSetDevice(0, 0) == 0
        self.handle = ctypes.c_void_p()
        assert self.op.infiniopCreateHandle(ctypes.byref(self.handle)) == 0

    def tensor(self, array):
        """A tensor descriptor of a torch tensor (shape, element strides, dtype)."""
        descriptor = ctypes.c_void_p()
        ndim = array.dim()
        shape = (ctypes.c_size_t * ndim)(*array.shape)
        strides = (ctypes.c_ssize_t * ndim)(*array.stride())
        dtype = {"torch.float16": F16, "torch.float32": F32}[str(array.dtype)]
        assert self.op.infiniopCreateTensorDescriptor(ctypes.byref(descriptor), ndim, shape, strides, dtype) == 0
        return descriptor

    def run(self, name, tensors, outputs_and_inputs):
        """Create the op descriptor (tensor descriptors destroyed right after), query the workspace, run, destroy.
        ``tensors``: what each descriptor describes (None: a NULL descriptor); ``outputs_and_inputs``: the data
        pointers' tensors in the run's order (None: NULL)."""
        descriptors = [None if t is None else self.tensor(t) for t in tensors]
        op_descriptor = ctypes.c_void_p()
        status = getattr(self.op, f"infiniopCreate{name}BackwardDescriptor")(
            self.handle, ctypes.byref(op_descriptor), *descriptors)
        for descriptor in descriptors:
            if descriptor is not None:
                self.op.infiniopDestroyTensorDescriptor(descriptor)
        assert status == 0, f"create {name}: status {status}"
        size = ctypes.c_size_t()
        assert getattr(self.op, f"infiniopGet{name}BackwardWorkspaceSize")(op_descriptor, ctypes.byref(size)) == 0
        workspace = torch.empty(max(size.value, 1), dtype=torch.uint8)
        pointers = [None if t is None else ctypes.c_void_p(t.data_ptr()) for t in outputs_and_inputs]
        status = getattr(self.op, f"infiniop{name}Backward")(op_descriptor, ctypes.c_void_p(workspace.data_ptr()),
                                                             ctypes.c_size_t(size.value), *pointers, None)
        assert getattr(self.op, f"infiniopDestroy{name}BackwardDescriptor")(op_descriptor) == 0
        assert status == 0, f"run {name}: status {status}"


@pytest.fixture(scope="module")
def core(infini_root):
    return InfiniCore(str(infini_root))


def assert_close(actual, expected, dtype, what):
    error = relative_error(actual.double().numpy(), expected.double().numpy())
    assert error <= TOLERANCE[dtype], f"{what}: {error:.3g} > {TOLERANCE[dtype]}"


def padded_rows(values):
    """values with each row (last dim) followed by 8 unused elements: a padded row stride."""
    base = torch.full((*values.shape[:-1], values.shape[-1] + 8), float("nan"), dtype=values.dtype)
    view = base[..., :values.shape[-1]]
    view.copy_(values)
    return view


@pytest.mark.parametrize("dtype", [F32, F16], ids=["F32", "F16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("place", ["out-of-place", "in-place", "padded"])
def test_layer_norm_like_infinicore(core, dtype, bias, place):
    torch.manual_seed(0)
    eps, shape = 1e-5, (4, 7, 64)
    module = torch.nn.LayerNorm(64, eps=eps, bias=bias)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    x = torch.randn(shape).to(getattr(torch, TORCH_DTYPES[dtype])).float().requires_grad_()
    grad_output = torch.randn(shape).to(getattr(torch, TORCH_DTYPES[dtype]))
    module(x).backward(grad_output.float())
    # The seed's inputs, in the data dtype: xhat and std, from the forward's statistics.
    with torch.no_grad():
        mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
        std = torch.sqrt(var + eps)
        cast = getattr(torch, TORCH_DTYPES[dtype])
        xhat, std, weight = ((x - mean) / std).to(cast), std[..., 0].to(cast), module.weight.detach().to(cast)
    grad_output_arg = padded_rows(grad_output) if place == "padded" else grad_output.clone()
    grad_input = grad_output_arg if place == "in-place" else torch.empty(shape, dtype=cast)
    grad_weight = torch.empty(64, dtype=cast)
    grad_bias = torch.empty(64, dtype=cast) if bias else None
    core.run("LayerNorm", [grad_input, grad_weight, grad_bias, grad_output_arg, weight, xhat, std],
             [grad_input, grad_weight, grad_bias, grad_output_arg, weight, xhat, std])
    assert_close(grad_input, x.grad, dtype, "grad_input")
    assert_close(grad_weight, module.weight.grad, dtype, "grad_weight")
    if bias:
        assert_close(grad_bias, module.bias.grad, dtype, "grad_bias")


@pytest.mark.parametrize("dtype", [F32, F16], ids=["F32", "F16"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("place", ["out-of-place", "in-place"])
def test_batch_norm_like_infinicore(core, dtype, bias, place):
    """The seed's statistics are the batch's (running_mean = mean, running_var = biased variance), epsilon 0; torch
    refuses 0 in training, so its module takes 1e-12 (a change of 1e-12 of the unit variances here)."""
    torch.manual_seed(1)
    shape = (8, 5, 33)
    module = torch.nn.BatchNorm1d(5, eps=1e-12)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        module.bias.uniform_(-0.5, 0.5)
    cast = getattr(torch, TORCH_DTYPES[dtype])
    x = torch.randn(shape).to(cast).float().requires_grad_()
    grad_output = torch.randn(shape).to(cast)
    module(x).backward(grad_output.float())
    with torch.no_grad():
        mean = x.mean((0, 2)).to(cast)
        var = x.var((0, 2), unbiased=False).to(cast)
    grad_output_arg = grad_output.clone()
    grad_input = grad_output_arg if place == "in-place" else torch.empty(shape, dtype=cast)
    grad_weight = torch.empty(5, dtype=cast)
    grad_bias = torch.empty(5, dtype=cast) if bias else None
    x_arg, weight = x.detach().to(cast), module.weight.detach().to(cast)
    core.run("BatchNorm", [grad_input, grad_weight, grad_bias, x_arg, grad_output_arg, weight, mean, var],
             [grad_input, grad_weight, grad_bias, x_arg, grad_output_arg, weight, mean, var])
    # The reference took the exact statistics; ours took them rounded to the data dtype.
    assert_close(grad_input, x.grad, dtype, "grad_input")
    assert_close(grad_weight, module.weight.grad, dtype, "grad_weight")
    if bias:
        assert_close(grad_bias, module.bias.grad, dtype, "grad_bias")


@pytest.mark.parametrize("dtype", [F32, F16], ids=["F32", "F16"])
@pytest.mark.parametrize("place", ["out-of-place", "in-place", "padded"])
def test_rms_norm_like_infinicore(core, dtype, place):
    torch.manual_seed(2)
    shape = (6, 3, 128)
    module = torch.nn.RMSNorm(128, eps=0.0)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    cast = getattr(torch, TORCH_DTYPES[dtype])
    x = torch.randn(shape).to(cast).float().requires_grad_()
    grad_y = torch.randn(shape).to(cast)
    module(x).backward(grad_y.float())
    grad_y_arg = padded_rows(grad_y) if place == "padded" else grad_y.clone()
    grad_x = grad_y_arg if place == "in-place" else torch.empty(shape, dtype=cast)
    grad_w = torch.empty(128, dtype=cast)
    x_arg, w = x.detach().to(cast), module.weight.detach().to(cast)
    core.run("RMSNorm", [grad_x, grad_w, grad_y_arg, x_arg, w], [grad_x, grad_w, grad_y_arg, x_arg, w])
    assert_close(grad_x, x.grad, dtype, "grad_x")
    assert_close(grad_w, module.weight.grad, dtype, "grad_w")
