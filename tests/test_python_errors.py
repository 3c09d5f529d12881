"""Every public function of the package refuses a wrong type, device or dtype in any argument position with an
error naming that argument, and failing calls leak nothing: neither Python objects (tracemalloc) nor native
memory or objects (the C heap's in-use bytes, and the package's live native resources)."""

import ctypes
import re
import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import infiniop_py
from infiniop_py import _resource
from _helpers import F32, OPS, WORKSPACE_SHAPES, sentinel_outputs_and_inputs

torch = pytest.importorskip("torch")  # a meta-device tensor is the portable "array on another device"

SHAPE = (2, 3, 8)


def wrong_arguments():
    """(kind, replacement, expected error, message pattern given the argument name)."""
    yield "type", lambda a: "not an array", TypeError, r"{name}: expected an array"
    # None means an absent tensor to the Ex entry points: for a required one the error still names it.
    yield "none", lambda a: None, (TypeError, ValueError, infiniop_py.InfiniopError), r"{name}\b"
    yield "type", lambda a: a.tolist(), TypeError, r"{name}: expected an array"
    # F64 is supported, but not mixed with F32: the message names the F64 tensor, or (when it is the first
    # data tensor, which sets dT) names it as the one the others must equal.
    yield "dtype", lambda a: a.astype(np.float64), infiniop_py.BadTensorDtypeError, r"{name}(: |'s )dtype F64"
    yield "dtype", lambda a: a.astype(np.int32), infiniop_py.BadTensorDtypeError, r"{name}: dtype I32"
    yield "dtype", lambda a: a.astype(np.complex64), infiniop_py.BadTensorDtypeError, r"{name}: dtype complex64"
    yield "byte order", lambda a: a.astype(a.dtype.newbyteorder("S")), infiniop_py.BadTensorDtypeError, \
        r"{name}: dtype .* is not in this machine's byte order"
    yield "device", lambda a: torch.empty(a.shape, device="meta"), ValueError, r"{name}: .*meta"
    # A torch tensor without memory of its own to read (TwoTensor stands for DTensor), and a nested one: they reached
    # the kernels with a null pointer (INFINI_STATUS_NULL_POINTER) or raised torch's internal errors (2026-12-07).
    yield "wrapper", lambda a: _two_tensor(torch.from_numpy(a)), TypeError, r"{name}: the TwoTensor owns no memory"
    yield "nested", lambda a: torch.nested.as_nested_tensor([torch.from_numpy(a)], layout=torch.jagged), TypeError, \
        r"{name}: a nested"
    # Were called wrappers without memory (2026-12-08).
    yield "sparse", lambda a: torch.from_numpy(a).to_sparse(), TypeError, r"{name}: a torch tensor of layout sparse_coo"


def _two_tensor(tensor):
    from torch.testing._internal.two_tensor import TwoTensor
    return TwoTensor(tensor, tensor.clone())


# Tensors the Ex entry points take as absent (None): leaving them out is no error.
OPTIONAL = {"grad_w", "rstd", "grad_weight", "grad_bias", "weight", "running_mean", "running_var"}


def argument_cases():
    for case in OPS:
        for position, name in enumerate(case.tensor_names):
            for kind, replace, error, pattern in wrong_arguments():
                if kind == "none" and name in OPTIONAL:
                    continue
                yield pytest.param(case, position, replace, error, pattern.format(name=name),
                                   id=f"{case.name}: {kind} of {name} ({pattern.split(': ')[-1]})")


ARGUMENT_CASES = list(argument_cases())


def _arrays(case):
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    return outputs + inputs


@pytest.mark.parametrize("case, position, replace, error, pattern", ARGUMENT_CASES)
def test_functional_names_the_wrong_argument(case, position, replace, error, pattern):
    arrays = _arrays(case)
    arrays[position] = replace(arrays[position])
    outputs, inputs = arrays[:len(case.output_names)], arrays[len(case.output_names):]
    with pytest.raises(error, match=pattern):
        case.function()(*inputs, out=tuple(outputs))


@pytest.mark.parametrize("case, position, replace, error, pattern", ARGUMENT_CASES)
def test_operator_call_names_the_wrong_argument(cpu_handle, case, position, replace, error, pattern):
    arrays = _arrays(case)
    with case.operator_class()(cpu_handle, *arrays) as operator:
        arrays[position] = replace(arrays[position])
        with pytest.raises(error, match=pattern):
            operator(*arrays)


@pytest.mark.parametrize("case, position, replace, error, pattern", ARGUMENT_CASES)
def test_operator_constructor_names_the_wrong_argument(cpu_handle, case, position, replace, error, pattern):
    arrays = _arrays(case)
    arrays[position] = replace(arrays[position])
    if error is TypeError:  # the constructor also takes TensorDescs and (shape, dtype) tuples
        pattern = pattern.replace("expected an array", "expected a TensorDesc, an array")
    with pytest.raises(error, match=pattern):
        case.operator_class()(cpu_handle, *arrays)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: infiniop_py.Handle(0), TypeError, "device must be a name"),
    (lambda: infiniop_py.Handle("gpu"), ValueError, "device 'gpu' is unknown"),
    (lambda: infiniop_py.Handle("cpu", "0"), TypeError, "device_id must be an int, got str"),
    (lambda: infiniop_py.Handle("cpu", 1.0), TypeError, "device_id must be an int, got float"),
    (lambda: infiniop_py.RMSNormBackward("cpu", *_arrays(OPS[0])), TypeError, "handle: expected a Handle, got str"),
    (lambda: infiniop_py.TensorDesc("ab", "float32"), TypeError, "tensor: shape must be a sequence of ints"),
    (lambda: infiniop_py.TensorDesc((2, 3), "float32", (1.0, 1)), TypeError, "strides must be a sequence of ints"),
    (lambda: infiniop_py.TensorDesc((2, 3), 99), infiniop_py.BadTensorDtypeError, "99 is not a valid"),
    (lambda: infiniop_py.TensorDesc((2, 3), "nonsense"), infiniop_py.BadTensorDtypeError, "'nonsense' is not a dtype"),
    (lambda: infiniop_py.TensorDesc((2**64, 3), "float32"), infiniop_py.BadTensorShapeError, r"beyond 2\*\*64 - 1"),
    (lambda: infiniop_py.TensorDesc((2, 3), "float32", (2**63, 1)), infiniop_py.BadTensorStridesError,
     "outside int64"),
    (lambda: infiniop_py.TensorDesc((2**62, 3), "float32"), infiniop_py.BadTensorShapeError,
     r"tensor: shape \(4611686018427387904, 3\) .* beyond 2\*\*63 - 1"),
    (lambda: infiniop_py.TensorDesc.from_array("x", name="x"), TypeError, "x: expected an array"),
    (lambda: infiniop_py.rms_norm_backward(*_arrays(OPS[0])[2:], out=5), TypeError, "out: expected a tuple of 2"),
    (lambda: infiniop_py.RMSNormBackward(infiniop_py.Handle("cpu"), *_arrays(OPS[0]))(
        *_arrays(OPS[0]), workspace="w"), TypeError, "workspace: expected an array"),
    (lambda: infiniop_py.RMSNormBackward(infiniop_py.Handle("cpu"), *_arrays(OPS[0]))(
        *_arrays(OPS[0]), stream="s"), TypeError, "stream: expected None"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_other_public_functions_refuse_precisely(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# ---------------------------------------------------------------- nothing leaks on error paths

def _malloc_in_use():
    """Bytes the C heap has handed out (glibc mallinfo2), or None where that is not available."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(field, ctypes.c_size_t) for field in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                     "keepcost")]

    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def _live_native_resources():
    """NativeResource objects (handles, descriptors) whose native object has not been destroyed."""
    return sum(1 for info in list(weakref.finalize._registry.values()) if info.func is _resource._destroy_quietly)


def failing_calls(handle):
    """Calls that fail at each stage: Python checks, the native create, the native run, the fast path."""
    case = OPS[0]
    arrays = _arrays(case)
    inputs = arrays[2:]
    operator = case.operator_class()(handle, *arrays)
    shape = WORKSPACE_SHAPES[case.name]
    big = sum(sentinel_outputs_and_inputs(case, shape), [])
    with_workspace = case.operator_class()(handle, *big)
    fresh = (np.empty(SHAPE, F32), np.empty(SHAPE[-1], F32))
    aliased = (np.empty(SHAPE, F32), inputs[-1])
    yield lambda: case.function()(*inputs[:-1], "w")
    yield lambda: case.function()(*inputs[:-1], inputs[-1].astype(np.float64))
    yield lambda: case.function()(*inputs[:-1], torch.empty(SHAPE[-1:], device="meta"))
    yield lambda: case.function()(*inputs[:-1], np.ones(SHAPE[-1] + 1, F32))
    yield lambda: case.operator_class()(handle, *arrays[:-1], ((SHAPE[-1],), np.float16))
    yield lambda: infiniop_py.TensorDesc((2**62, 3), "float32")  # refused by the native create
    yield lambda: infiniop_py.Handle("cpu", 1)  # refused by the native runtime
    yield lambda: operator(*arrays[:-1], arrays[-1][::-1])
    yield lambda: with_workspace(*big, workspace=np.empty(with_workspace.workspace_size - 1, np.uint8))
    yield lambda: case.function()(*inputs, out=fresh) and case.function()(*inputs, out=aliased)  # C's BAD_PARAM


@pytest.mark.parametrize("index", range(10))
def test_failing_calls_leak_nothing(cpu_handle, index):
    """Memory after each of three batches of N failing calls: a leak grows in every batch alike, while what a
    batch fills once (caches, allocator pools, objects the collector frees later) does not grow in the next
    ones. The C heap is measured without tracemalloc, whose own tables live there."""
    call = list(failing_calls(cpu_handle))[index]
    repeats = 500
    bound = 16 * repeats  # one leaked object per call is >= 16 bytes of Python or C heap per call

    def fail_many(measure):
        for _ in range(repeats):
            with pytest.raises(Exception):
                call()
        gc.collect()
        return measure()

    def least_growth(measure):
        sizes = [fail_many(measure) for _ in range(3)]
        return min(later - earlier for earlier, later in zip(sizes, sizes[1:]))

    fail_many(lambda: None)  # warm up
    resources = _live_native_resources()
    if _malloc_in_use() is not None:
        native_growth = least_growth(_malloc_in_use)
        assert native_growth < bound, f"the C heap grew by {native_growth} bytes per {repeats} failing calls"
    assert _live_native_resources() == resources, "native objects were left alive"
    tracemalloc.start()
    try:
        python_growth = least_growth(lambda: tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert python_growth < bound, f"Python memory grew by {python_growth} bytes per {repeats} failing calls"


def test_a_wrong_out_array_is_named_as_out():
    """An out= array of the wrong shape or dtype is blamed (which element, which rule), not the input the native
    rules compare it with (issue 25)."""
    rng = np.random.default_rng(0)
    grad_output = rng.standard_normal((4, 8)).astype(np.float32)
    weight, xhat, std = np.ones(8, np.float32), grad_output.copy(), np.ones(4, np.float32)
    vectors = (np.empty(8, np.float32), np.empty(8, np.float32))
    with pytest.raises(infiniop_py.BadTensorShapeError, match=r"out\[0\], grad_input: shape \(4, 9\) must be \(4, 8\)"):
        infiniop_py.layer_norm_backward(grad_output, weight, xhat, std, out=(np.empty((4, 9), np.float32), *vectors))
    with pytest.raises(infiniop_py.BadTensorDtypeError, match=r"out\[0\], grad_input: dtype F16 must be"):
        infiniop_py.layer_norm_backward(grad_output, weight, xhat, std, out=(np.empty((4, 8), np.float16), *vectors))
    with pytest.raises(infiniop_py.BadTensorShapeError, match=r"out\[1\], grad_w: shape \(9,\) must be \(8,\)"):
        infiniop_py.rms_norm_backward(grad_output, xhat, weight, out=(np.empty((4, 8), np.float32),
                                                                     np.empty(9, np.float32)))
    with pytest.raises(infiniop_py.BadTensorShapeError, match="input_std_deviation: shape"):  # the argument's name
        infiniop_py.layer_norm_backward(grad_output, weight, xhat, np.ones(5, np.float32))


def _functional_calls():
    """(function, its output names, {argument name: a correct F32 array}, call(arguments)) per functional."""
    rng = np.random.default_rng(1)
    rows, channels = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8, 3)).astype(np.float32)
    ones = np.ones(8, np.float32)
    yield ("rms_norm_backward", ("grad_x", "grad_w"), {"grad_y": rows, "x": rows, "w": ones},
           lambda a: infiniop_py.rms_norm_backward(a["grad_y"], a["x"], a["w"]))
    yield ("layer_norm_backward", ("grad_input", "grad_weight", "grad_bias"),
           {"grad_output": rows, "weight": ones, "input": rows, "mean": np.zeros(4, np.float32),
            "rstd": np.ones(4, np.float32)},
           lambda a: infiniop_py.layer_norm_backward(a["grad_output"], a["weight"], input=a["input"], mean=a["mean"],
                                                     rstd=a["rstd"]))
    yield ("batch_norm_backward", ("grad_input", "grad_weight", "grad_bias"),
           {"input": channels, "grad_output": channels, "weight": ones, "running_mean": np.zeros(8, np.float32),
            "running_var": ones},
           lambda a: infiniop_py.batch_norm_backward(a["input"], a["grad_output"], a["weight"], a["running_mean"],
                                                     a["running_var"], training=False))


ALLOCATING_CASES = [pytest.param(function, outputs, arguments, call, name, kind, id=f"{function}: {kind} of {name}")
                    for function, outputs, arguments, call in _functional_calls()
                    for name in list(arguments)[1:] for kind in ("dtype", "shape")]


@pytest.mark.parametrize("function, outputs, arguments, call, name, kind", ALLOCATING_CASES)
def test_errors_name_what_the_user_passed(function, outputs, arguments, call, name, kind):
    """Where the function allocates the outputs, an input that disagrees is named with the input it disagrees
    with, never with an output the user did not pass (issue 55: "x: dtype F16 must equal grad_x's dtype F32")."""
    wrong = dict(arguments)
    if kind == "dtype":
        wrong[name] = wrong[name].astype(np.float16)
    else:
        wrong[name] = np.ones(tuple(wrong[name].shape[:-1]) + (wrong[name].shape[-1] + 1,), np.float32)
    with pytest.raises(infiniop_py.InfiniopError) as raised:
        call(wrong)
    message = str(raised.value)
    assert message.startswith(f"{name}: "), message
    assert not any(re.search(rf"\b{output}\b", message) for output in outputs), message
    assert "out[" not in message
    assert re.search(rf"\b{list(arguments)[0]}\b", message) or "F32" in message, message
