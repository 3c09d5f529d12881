"""What the PyTorch-integration tests share: running a module forward and backward, float64 references of the
same module on the exact rounded inputs, and per-dtype bounds."""

import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch integration needs it")

from _helpers import F16, F32, BF16, F64, TOLERANCE, relative_error  # noqa: E402

# torch raises its errors as C++ exceptions, which GCC's ASan runtime, preloaded ahead of CPython by the sanitizer
# stage (.ci/sanitize), cannot intercept (CHECK failed on __cxa_throw): tests of what torch refuses skip there.
TORCH_ERRORS_CRASH = "libasan" in os.environ.get("LD_PRELOAD", "")
TORCH_ERRORS_CRASH_REASON = ("the sanitizer stage's preloaded ASan runtime cannot intercept the C++ exceptions torch "
                             "raises its errors with; the plain run tests this")

class LoggedTensor(torch.Tensor):
    """A subclass that overrides torch's functions (__torch_function__), noting which it saw (``seen``)."""
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


NUMPY_DTYPE = {torch.float16: F16, torch.float32: F32, torch.bfloat16: BF16, torch.float64: F64}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def bound(dtype):
    """The library's accuracy bound (max|err| / max|ref|) for data of this torch dtype."""
    return TOLERANCE[NUMPY_DTYPE[dtype]]


def error(actual, reference, scale=0.0):
    """max|actual - reference| / max(max|reference|, scale): ``scale`` is the size of the terms that cancel in
    an output that is near zero by cancellation, where max|reference| is only rounding noise."""
    actual, reference = actual.detach().double().cpu(), reference.detach().double().cpu()
    if scale <= 0.0:
        return relative_error(actual.numpy(), reference.numpy())
    if reference.numel() == 0:
        return 0.0
    return float((actual - reference).abs().max() / max(float(reference.abs().max()), scale))


def forward_backward(module, x, grad_output):
    """(output, grad of x, {parameter name: grad}, {buffer name: value}) of module(x).backward(grad_output)."""
    x = x.detach().clone().requires_grad_(True)
    output = module(x)
    output.backward(grad_output)
    return (output.detach(), x.grad, {name: p.grad for name, p in module.named_parameters()},
            {name: b.detach().clone() for name, b in module.named_buffers()})


def float64_twin(module, dtype):
    """A float64 copy of ``module``, with an RMSNorm's default eps fixed to the one ``dtype`` would use: that of the
    dtype torch computes in (F32 for F16/BF16 data, as its kernels' opmath type)."""
    twin = copy.deepcopy(module).double()
    if isinstance(twin, torch.nn.RMSNorm) and twin.eps is None:
        twin.eps = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    return twin


def parameter_term_scales(module, x, grad_output):
    """{parameter name: the largest sum of |terms| in its gradient}. Each norm's weight gradient sums
    grad_output * normalized x and its bias gradient grad_output over every position of the parameter's element;
    where they cancel (a bias of one element summing a few grad_outputs), max|reference| is rounding noise, and
    the error is measured against the terms instead, as the numeric suites do."""
    twin = float64_twin(module, x.dtype)
    with torch.no_grad():
        for name, parameter in twin.named_parameters():
            parameter.fill_(1.0 if name == "weight" else 0.0)
        normalized = twin(x.double()).abs()
    magnitude = grad_output.double().abs()
    scales = {}
    for name, parameter in module.named_parameters():
        terms = magnitude * normalized if name == "weight" else magnitude
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):  # one element per channel (dim 1)
            sums = terms.transpose(0, 1).reshape(parameter.numel(), -1).sum(1)
        else:  # LayerNorm / RMSNorm: parameters of the trailing normalized shape
            sums = terms.reshape(-1, parameter.numel()).sum(0)
        scales[name] = float(sums.max()) if sums.numel() else 0.0
    return scales


def _library_forward(module, x):
    """Whether the module's forward is this library's kernel (ops._library_*_serves), not PyTorch's."""
    from infiniop_py.torch import ops

    if isinstance(module, torch.nn.RMSNorm):
        return ops._library_rms_norm_serves(x, module.weight)
    if isinstance(module, torch.nn.LayerNorm):
        return ops._library_layer_norm_serves(x, module.normalized_shape, module.weight, module.bias)
    if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        return ops._library_batch_norm_serves(x, module.weight, module.bias, module.running_mean, module.running_var)
    return False


def assert_matches_torch(ours, theirs, x, grad_output, grad_input_scale=0.0, torch_computes=True):
    """ours (this package's module) against theirs (torch's, same state): the forward and the buffers equal (both
    run PyTorch's forward; where ours runs this library's, RMSNorm, LayerNorm and BatchNorm on the CPU, its forward and
    buffers within the dtype's bound of the float64 reference instead), the gradients within the dtype's bound of a
    float64 reference computed on the CPU from
    the same rounded values, and of torch's own. ``grad_input_scale``: the size of the terms that cancel in
    grad_input (see error). ``torch_computes`` False: torch's module refuses these dtypes on x's device (torch
    2.11's CUDA layer_norm, BF16 data with F32 parameters), so ours is held to the float64 reference alone, its
    forward and buffers within the bound too."""
    ours.load_state_dict(theirs.state_dict())
    # On the CPU in float64: every torch version the extra allows computes it, whatever the device refuses.
    reference = forward_backward(float64_twin(theirs, x.dtype).cpu(), x.double().cpu(), grad_output.double().cpu())
    actual = forward_backward(ours, x, grad_output)
    limit = bound(x.dtype)
    library_forward = _library_forward(ours, x)
    if torch_computes and not library_forward:
        expected = forward_backward(theirs, x, grad_output)
        assert torch.equal(actual[0], expected[0]), "forward differs from torch's"
        for name, value in expected[3].items():
            assert torch.equal(actual[3][name], value), f"buffer {name} differs from torch's"
    else:
        expected = forward_backward(theirs, x, grad_output) if torch_computes else None
        assert error(actual[0], reference[0]) <= limit, "forward beyond the bound of the float64 reference"
        for name, value in reference[3].items():
            if value.is_floating_point():
                assert error(actual[3][name], value) <= limit, f"buffer {name} beyond the bound"
            else:
                assert torch.equal(actual[3][name].cpu(), value), f"buffer {name} differs"
    term_scales = parameter_term_scales(theirs, x, grad_output)
    dtypes = {"grad_input": x.dtype, **{f"grad of {name}": p.dtype for name, p in theirs.named_parameters()}}
    for what, index, name, scale in (("grad_input", 1, None, grad_input_scale),
                                     *((f"grad of {name}", 2, name, term_scales[name]) for name in reference[2])):
        ours_grad, reference_grad = (result[index] if name is None else result[index][name]
                                     for result in (actual, reference))
        assert ours_grad is not None and ours_grad.dtype == dtypes[what], what
        assert ours_grad.shape == reference_grad.shape, what
        against_reference = error(ours_grad, reference_grad, scale)
        if expected is None:
            assert against_reference <= limit, f"{what}: {against_reference:.3g} > {limit:.3g}"
            continue
        torch_grad = expected[index] if name is None else expected[index][name]
        # Where torch's own backward misses the bound, ours may too, by as much: BatchNorm with 16-bit parameters
        # saves 16-bit statistics, which both backwards take as they are.
        allowed = max(limit, 2 * error(torch_grad, reference_grad, scale))
        against_torch = error(ours_grad, torch_grad, scale)
        assert against_reference <= allowed, f"{what}: {against_reference:.3g} > {allowed:.3g}"
        assert against_torch <= 2 * allowed, f"{what} vs torch: {against_torch:.3g} > {2 * allowed:.3g}"


_BACKWARD_NAMES = ("rms_norm_backward", "layer_norm_backward", "batch_norm_backward")


class LibraryBackwards:
    """The backwards the torch path ran in this library since this was made, by name ("rms_norm_backward", ...):
    through the functional ops' signatures (the Python Functions' backwards, recorded in ``python``) and through the
    C++ autograd nodes (their counters, torch.ops.infiniop_nodes.backward_calls)."""

    def __init__(self):
        self.python = []
        self._nodes_before = self._node_calls()

    @staticmethod
    def _node_calls():
        from infiniop_py.torch import autograd_nodes

        if not autograd_nodes.status()[0]:
            return [0, 0, 0]
        return list(torch.ops.infiniop_nodes.backward_calls())

    def names(self):
        nodes = [now - before for now, before in zip(self._node_calls(), self._nodes_before)]
        return self.python + [name for name, count in zip(_BACKWARD_NAMES, nodes) for _ in range(count)]

    def count(self, name):
        return self.names().count(name)

    def __len__(self):
        return len(self.names())

    def __eq__(self, other):
        return sorted(self.names()) == sorted(other)

    def __repr__(self):
        return f"LibraryBackwards({self.names()})"


def count_library_backwards(monkeypatch):
    """A LibraryBackwards: the backwards the torch path runs in this library from now on (every autograd backward
    of the integration calls a functional op's signature or is a C++ autograd node)."""
    import importlib

    calls = LibraryBackwards()
    for module, attribute, name in (("rms_norm_backward", "_SIGNATURE", "rms_norm_backward"),
                                    ("layer_norm_backward", "_FROM_INPUT_SIGNATURE", "layer_norm_backward"),
                                    ("batch_norm_backward", "_SIGNATURE", "batch_norm_backward")):
        signature = getattr(importlib.import_module(f"infiniop_py.{module}"), attribute)

        def counted(*arguments, _real=signature.run, _name=name):
            calls.python.append(_name)
            return _real(*arguments)

        monkeypatch.setattr(signature, "run", counted)
    return calls


def cpp_library_forwards():
    """The forwards the C++ autograd nodes ran through this library's kernels so far, per op (RMSNorm, LayerNorm,
    BatchNorm; zeros where the nodes are not built): the eager forward of ordinary operands runs there, not through
    the functional ops' signatures."""
    from infiniop_py.torch import autograd_nodes

    if not autograd_nodes.status()[0]:
        return [0, 0, 0]
    return list(torch.ops.infiniop_nodes.forward_calls())[3:]
