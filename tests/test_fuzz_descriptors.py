"""Fuzzing the create functions with hypothesis: tensor descriptors of ndim 0..9, extents including 0 and values
whose product overflows 64 bits, negative / zero / overlapping / extreme strides, dtype codes that are not
infiniDtype_t values, and NULL in every pointer position. Never a crash; always the status the rules document
(an independent model here for tensor descriptors; the package's rule mirror, _layout, for the ops). Op
descriptors that are created are also run, on separate buffers covering each footprint."""

import numpy as np
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from infiniop_py import _layout
from _helpers import (
    BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES, NULL_POINTER, OPS, SUCCESS, CTensorDescriptors, c_function,
    native,
)

INT64_MAX = 2**63 - 1
SIZE_MAX = 2**64 - 1
# Bytes per element of every infiniDtype_t code (native/include/infinicore.h); other codes are invalid.
ITEMSIZE = {1: 1, 2: 1, 3: 1, 4: 2, 5: 4, 6: 8, 7: 1, 8: 2, 9: 4, 10: 8, 11: 1, 12: 2, 13: 4, 14: 8, 15: 2,
            16: 4, 17: 8, 18: 16, 19: 2}
CHECKS = {"rms_norm_backward": _layout.check_rms_norm_backward,
          "layer_norm_backward": _layout.check_layer_norm_backward,
          "batch_norm_backward": _layout.check_batch_norm_backward}
CREATE_STATUSES = {SUCCESS, NULL_POINTER, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES}

HUGE_EXTENTS = (2**31, 2**32 + 1, 2**40, 2**62, INT64_MAX, 2**63, SIZE_MAX)
extents = st.sampled_from((0, 1, 2, 3, 5) * 3 + HUGE_EXTENTS)
small_strides = st.integers(-9, 9)
extreme_strides = st.sampled_from((-(2**63), -(2**62), 2**31, 2**62, INT64_MAX))
dtype_codes = st.sampled_from(sorted(ITEMSIZE) * 3 + [0, 20, 21, 255, 2**31 - 1, 2**32 - 1])
rarely = st.sampled_from([False] * 9 + [True])


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


@st.composite
def tensor_descriptor_args(draw):
    ndim = draw(st.integers(0, 9))
    shape = draw(st.lists(extents, min_size=ndim, max_size=ndim))
    strides = draw(st.none() | st.lists(st.sampled_from([small_strides] * 4 + [extreme_strides]).flatmap(lambda s: s),
                                        min_size=ndim, max_size=ndim))
    return shape, strides, draw(dtype_codes)


@settings(max_examples=300)
@given(args=tensor_descriptor_args(), null_out=rarely, null_shape=rarely)
@example(args=([0, 2**62, 4], None, 13), null_out=False, null_shape=False)  # contiguous strides overflow
@example(args=([2**62], None, 13), null_out=False, null_shape=False)  # 2**64 bytes
@example(args=([2**61 - 1], None, 13), null_out=False, null_shape=False)  # just fits in bytes
@example(args=([2, 2], [2**62, 1], 1), null_out=False, null_shape=False)  # fits in bytes of one
@example(args=([2, 2], [2**62, 1], 12), null_out=False, null_shape=False)  # but not of two
def test_create_tensor_descriptor_never_crashes_and_returns_the_documented_status(args, null_out, null_shape):
    ffi, op, _ = native()
    shape, strides, dtype = args
    out = ffi.NULL if null_out else ffi.new("infiniopTensorDescriptor_t *")
    c_shape = ffi.NULL if null_shape else ffi.new("size_t[]", shape)
    c_strides = ffi.NULL if strides is None else ffi.new("ptrdiff_t[]", strides)

    status = op.infiniopCreateTensorDescriptor(out, len(shape), c_shape, c_strides, dtype)

    event(f"status {status}")
    assert status == expected_tensor_status(shape, strides, dtype, null_out, null_shape)
    if status == SUCCESS:
        assert op.infiniopDestroyTensorDescriptor(out[0]) == SUCCESS


@st.composite
def op_tensor_specs(draw, case):
    """(shape, dtype code, strides or None) per tensor, or None for a NULL descriptor. The proper shapes for
    some (N, [N2,] D), with one kind of fault drawn per example so that every verdict comes up: a NULL, a
    dtype, shapes of any rank 0..9, or strides (small random ones: negative, zero, overlapping; or padded)."""
    ndim = draw(st.sampled_from([2, 3] if case.row_tensors else [3]))
    big = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    code = draw(st.sampled_from([12, 13, 19]))
    specs = [[shape, code, None] for shape in case.tensor_shapes(big)]
    fault = draw(st.sampled_from(["none", "null", "dtype", "shape", "strides", "strides", "strides"]))
    victims = draw(st.sets(st.integers(0, len(specs) - 1), min_size=1, max_size=len(specs)))
    for index in victims:
        shape = specs[index][0]
        if fault == "dtype":
            specs[index][1] = draw(st.sampled_from([1, 5, 12, 13, 14, 18, 19]))
        elif fault == "shape":
            specs[index][0] = tuple(draw(st.lists(st.integers(0, 3), max_size=9)))
        elif fault == "strides":
            kind = draw(st.sampled_from(["random", "padded"]))
            if kind == "random":
                specs[index][2] = tuple(draw(st.lists(small_strides, min_size=len(shape), max_size=len(shape))))
            elif shape:
                specs[index][2] = tuple(2 * s for s in _layout.contiguous_strides(shape))[:-1] + (1,)
    specs = [tuple(spec) for spec in specs]
    if fault == "null":
        specs[min(victims)] = None
    return specs


def separate_buffers(specs, rng):
    """One float buffer per tensor covering its footprint, and the data pointer inside it; None when too big."""
    buffers, pointers = [], []
    ffi, _, _ = native()
    for shape, dtype, strides in specs:
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
        buffer = rng.uniform(0.5, 1.5, high - low + 1).astype({2: np.float16, 4: np.float32}[itemsize])
        buffers.append(buffer)
        pointers.append(ffi.cast("void *", buffer.ctypes.data - low * itemsize))
    return buffers, pointers


def check_op_create_and_run(case, c_handle, specs, null_handle, null_out):
    ffi, _, _ = native()
    with CTensorDescriptors(specs) as descriptors:
        desc_ptr = ffi.NULL if null_out else ffi.new("infiniopDescriptor_t *")
        status = c_function(case, "Create")(ffi.NULL if null_handle else c_handle, desc_ptr, *descriptors)
    expected = (NULL_POINTER if null_handle or null_out else
                _layout.status_of(CHECKS[case.name], **dict(zip(case.tensor_names,
                                                                 [s and _layout.TensorSpec(*s) for s in specs]))))
    event(f"create status {status}")
    assert status in CREATE_STATUSES and status == expected, (status, expected, specs)
    if status != SUCCESS:
        return
    try:
        size = ffi.new("size_t *")
        assert c_function(case, "GetWorkspaceSize")(desc_ptr[0], size) == SUCCESS
        placed = separate_buffers(specs, np.random.default_rng(0))
        if placed is not None:
            workspace = np.empty(max(size[0], 1), np.uint8)
            status = c_function(case, "Run")(desc_ptr[0], ffi.from_buffer(workspace), size[0], *placed[1], ffi.NULL)
            event("ran")
            assert status == SUCCESS
    finally:
        assert c_function(case, "Destroy")(desc_ptr[0]) == SUCCESS


def _fuzz_op(case):
    @settings(max_examples=300)
    @given(data=st.data())
    def fuzz(c_handle, data):
        specs = data.draw(op_tensor_specs(case))
        null_handle = data.draw(rarely) and data.draw(rarely)
        null_out = data.draw(rarely) and data.draw(rarely)
        check_op_create_and_run(case, c_handle, specs, null_handle, null_out)

    fuzz.__name__ = f"test_fuzz_create_and_run_{case.name}"
    fuzz.__doc__ = f"{case.c_name}: create returns the documented status for any descriptors; created ones run."
    return fuzz


for _case in OPS:
    globals()[f"test_fuzz_create_and_run_{_case.name}"] = _fuzz_op(_case)
