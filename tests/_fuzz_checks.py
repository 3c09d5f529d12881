"""The oracle checks shared by the fuzzers (tests/test_fuzz_descriptors.py with hypothesis, tests/fuzz/ with
atheris): each drives one C create function, asserts the documented status, and runs what was created."""

import numpy as np

from infiniop_py import _layout
from _helpers import (
    BAD_PARAM, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES, NULL_POINTER, SUCCESS, CTensorDescriptors,
    c_function, native,
)

INT64_MAX = 2**63 - 1
SIZE_MAX = 2**64 - 1
# Bytes per element of every infiniDtype_t code (native/include/infinicore.h); other codes are invalid.
ITEMSIZE = {1: 1, 2: 1, 3: 1, 4: 2, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 1, 12: 2, 13: 4, 14: 8, 15: 2,
            16: 4, 17: 8, 18: 16, 19: 2}
CHECKS = {"rms_norm_backward": _layout.check_rms_norm_backward,
          "layer_norm_backward": _layout.check_layer_norm_backward,
          "batch_norm_backward": _layout.check_batch_norm_backward,
          # the forwards (_helpers.FORWARD_OPS), each create form
          "rms_norm": _layout.check_rms_norm, "rms_norm_ex": _layout.check_rms_norm_ex,
          "layer_norm": _layout.check_layer_norm, "layer_norm_ex": _layout.check_layer_norm_ex,
          "batch_norm": _layout.check_batch_norm, "batch_norm_ex": _layout.check_batch_norm_ex}
# F16 extents whose packed rows still fit int64 bytes, so that an empty batch of them can be described: the
# workspace sums of these once wrapped around (issue 29).
HUGE_BROADCAST = (2**40, 2**61, 4602696377065932800)
# What the forward fuzzers draw their dtypes and scalars from, bad ones included: the data's dtype (a parameter's or
# statistic's is drawn beside it); eps (also BatchNorm's epsilon): a seed create takes a C float, in which 1e-50
# and -1e-50 are 0 and -0 (accepted) and 1e39 is infinite (refused); momentum: any finite value is taken; training
# (an int): any nonzero value is true.
FORWARD_DATA_CODES = (12, 13, 14, 19) * 3 + (1, 5, 6, 18)  # storable: invalid codes come per tensor
EPSILONS = (1e-5, 1e-5, 1e-6, 0.0, -0.0, 1e-50, -1e-50, 3.4e38, 1e39, -1e-5, -1.0, float("nan"), float("inf"),
            -float("inf"))
MOMENTA = (0.1, 0.1, 0.0, 1.0, -0.5, 2.0, 1e39, -1e39, float("nan"), float("inf"))
TRAININGS = (1, 1, 0, -1, 2, 2**31 - 1, -(2**31))
FLOAT_OF_ITEMSIZE = {2: np.float16, 4: np.float32, 8: np.float64}  # what fills a buffer: only its bytes count
CREATE_STATUSES = {SUCCESS, NULL_POINTER, BAD_PARAM, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES}


def expected_tensor_status(shape, strides, dtype, null_out=False, null_shape=False):
    """The documented status of infiniopCreateTensorDescriptor: NULL_POINTER, then BAD_TENSOR_DTYPE (not a
    storable code), then BAD_TENSOR_SHAPE when a byte offset it implies leaves int64: the element count, a
    contiguous stride (made for NULL strides), or the reach of the given strides, times the item size."""
    if null_out or (null_shape and len(shape) > 0):
        return NULL_POINTER
    if dtype not in ITEMSIZE:
        return BAD_TENSOR_DTYPE
    limit = INT64_MAX // ITEMSIZE[dtype]
    suffix_products = [int(np.prod([int(n) for n in shape[i:]], dtype=object)) for i in range(len(shape))]
    if any(n > limit for n in shape) or any(p > limit for p in suffix_products):
        return BAD_TENSOR_SHAPE
    if strides is not None and sum(abs(s) * (n - 1) for n, s in zip(shape, strides) if n > 0) > limit:
        return BAD_TENSOR_SHAPE
    return SUCCESS


def check_tensor_create(shape, strides, dtype, null_out=False, null_shape=False):
    """infiniopCreateTensorDescriptor on these arguments returns the documented status; returns it."""
    ffi, op, _ = native()
    out = ffi.NULL if null_out else ffi.new("infiniopTensorDescriptor_t *")
    c_shape = ffi.NULL if null_shape else ffi.new("size_t[]", shape)
    c_strides = ffi.NULL if strides is None else ffi.new("ptrdiff_t[]", strides)
    status = op.infiniopCreateTensorDescriptor(out, len(shape), c_shape, c_strides, dtype)
    assert status == expected_tensor_status(shape, strides, dtype, null_out, null_shape), (shape, strides, dtype)
    if status == SUCCESS:
        assert op.infiniopDestroyTensorDescriptor(out[0]) == SUCCESS
    return status


def draw_forward_arguments(case, rank, pick, any_float):
    """(normalized dims, dtype code by kind, scalars) for a forward create (a _helpers.ForwardCase) whose big tensor
    has this rank: mostly dtypes that agree (F32 parameters beside 16-bit data, F32 or F64 statistics) and good
    scalars, sometimes not. Drawn by either fuzzer: pick(values) -> one of them; any_float() -> any double (NaN,
    infinities, subnormals, beyond a C float's range)."""
    normalized = pick(range(1, rank + 1)) if case.any_normalized else 1
    code = pick(FORWARD_DATA_CODES)
    codes = {"data": code, "parameter": pick((code, code, 13, 12)), "statistic": pick((13, 13, 14, code))}
    scalars = []
    for name, c_type in case.scalars:
        values = TRAININGS if c_type == "int" else MOMENTA if name == "momentum" else EPSILONS
        scalars.append(any_float() if c_type != "int" and pick(range(8)) == 0 else pick(values))
    return normalized, codes, scalars


def huge_broadcast_specs(case, big):
    """Specs of `case` for `big`, an empty batch beside a huge extent: F16 data and parameters, F32 statistics;
    input vectors broadcast (stride 0), outputs packed (an overlapping output is refused); a NULL descriptor for a
    tensor that has none (BatchNorm's F32 statistics of 2**61 channels, which are optional)."""
    specs = []
    for name, (shape, code) in zip(case.tensor_names,
                                   case.tensor_specs(big, 1, {"data": 12, "parameter": 12, "statistic": 13})):
        strides = (0,) if len(shape) == 1 and name not in case.output_names else None
        specs.append((shape, code, strides) if expected_tensor_status(shape, strides, code) == SUCCESS else None)
    return specs


def separate_buffers(specs, rng):
    """One float buffer per tensor covering its footprint, and the data pointer inside it; None when too big."""
    buffers, pointers = [], []
    ffi, _, _ = native()
    for spec in specs:
        if spec is None:  # a NULL descriptor that create accepted (the seed's grad_bias): a NULL pointer
            buffers.append(None)
            pointers.append(ffi.NULL)
            continue
        shape, dtype, strides = spec
        strides = strides if strides is not None else _layout.contiguous_strides(shape)
        if 0 in shape:
            buffers.append(None)
            pointers.append(ffi.NULL)
            continue
        low = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
        high = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0)
        itemsize = ITEMSIZE[dtype]
        if (high - low + 1) * itemsize > 1 << 20:
            return None
        buffer = rng.uniform(0.5, 1.5, high - low + 1).astype(FLOAT_OF_ITEMSIZE[itemsize])
        buffers.append(buffer)
        pointers.append(ffi.cast("void *", buffer.ctypes.data - low * itemsize))
    return buffers, pointers


def check_op_create_and_run(case, c_handle, specs, null_handle=False, null_out=False, scalars=()):
    """The create of `case` (an OpCase or a _helpers.ForwardCase) on these (shape, dtype, strides) specs (None: a
    NULL descriptor) and scalar arguments returns the status the package's rule mirror gives; a created descriptor
    runs on separate buffers. Returns labels of what happened."""
    ffi, _, _ = native()
    with CTensorDescriptors(specs) as descriptors:
        desc_ptr = ffi.NULL if null_out else ffi.new("infiniopDescriptor_t *")
        status = c_function(case, "Create")(ffi.NULL if null_handle else c_handle, desc_ptr, *descriptors, *scalars)
    arguments = dict(zip(case.tensor_names, [s and _layout.TensorSpec(*s) for s in specs]))
    arguments.update(zip([name for name, _ in case.scalars], scalars))
    expected = NULL_POINTER if null_handle or null_out else _layout.status_of(CHECKS[case.name], **arguments)
    assert status in CREATE_STATUSES and status == expected, (status, expected, specs, scalars)
    events = [f"create status {status}"]
    if status != SUCCESS:
        return events
    try:
        size = ffi.new("size_t *")
        assert c_function(case, "GetWorkspaceSize")(desc_ptr[0], size) == SUCCESS
        placed = separate_buffers(specs, np.random.default_rng(0))
        if placed is not None:
            workspace = np.empty(max(size[0], 1), np.uint8)
            status = c_function(case, "Run")(desc_ptr[0], ffi.from_buffer(workspace), size[0], *placed[1], ffi.NULL)
            assert status == SUCCESS
            events.append("ran")
    finally:
        assert c_function(case, "Destroy")(desc_ptr[0]) == SUCCESS
    return events
