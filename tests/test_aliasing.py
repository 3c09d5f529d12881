"""Outputs sharing memory with another argument are refused at run (BAD_PARAM, nothing written), except the
supported in-place pair (grad_x is grad_y / grad_input is grad_output) with one pointer and one layout.

The C tests place tensors at chosen byte offsets of one arena, so a run the check failed to refuse would
still stay inside memory the test owns."""

import numpy as np
import pytest

import infiniop_py
from _helpers import (
    BAD_PARAM, F32, OPS, SUCCESS, WORKSPACE_SHAPES, COperator, CTensorDescriptors, assert_matches_reference,
    c_function, native, sentinel_outputs_and_inputs, untouched,
)

SHAPE = (2, 3, 8)
ITEM = np.dtype(F32).itemsize
IN_PLACE = {"rms_norm_backward": ("grad_x", "grad_y"), "layer_norm_backward": ("grad_input", "grad_output"),
            "batch_norm_backward": ("grad_input", "grad_output")}
# Two inputs that may be one array without making the outputs pure cancellation noise (BatchNorm's input is
# grad_output would give grad_input = 0 exactly), given as (source, the one made equal to it).
SHARED_INPUTS = {"rms_norm_backward": ("grad_y", "x"), "layer_norm_backward": ("grad_output", "input_standardization"),
                 "batch_norm_backward": ("running_var", "weight")}


class Arena:
    """One byte buffer holding several tensors' data at chosen byte offsets."""

    def __init__(self, nbytes):
        self.bytes = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)  # a pattern, to see any write

    def pointer(self, offset):
        ffi, _, _ = native()
        return ffi.cast("void *", self.bytes.ctypes.data + offset)

    def view(self, offset, shape):
        return self.bytes[offset:offset + int(np.prod(shape)) * ITEM].view(F32).reshape(shape)


def run_at_offsets(case, c_handle, offsets, workspace_offset=None, shape=SHAPE, arrays=None):
    """Status of a run with every tensor (contiguous, F32) at the given arena byte offsets (descriptor order),
    and whether the arena is unchanged. The workspace sits after the tensors unless workspace_offset is given."""
    arrays = arrays or sum(sentinel_outputs_and_inputs(case, shape), [])
    operator = COperator(case, c_handle, arrays, strides_from_arrays=False)
    end = max(offset + a.nbytes for offset, a in zip(offsets, arrays))
    if workspace_offset is None:
        workspace_offset = end
    arena = Arena(max(end, workspace_offset + operator.workspace_size) + 64)
    for offset, array in zip(offsets, arrays):
        if array.size:
            arena.view(offset, array.shape)[...] = array
    before = arena.bytes.copy()
    try:
        status = operator.run(arena.pointer(workspace_offset), operator.workspace_size,
                              [arena.pointer(offset) for offset in offsets])
    finally:
        operator.destroy()
    return status, np.array_equal(before, arena.bytes), arena


def packed_offsets(case, shape=SHAPE):
    """Byte offsets that place the tensors back to back, in descriptor order, with no gap."""
    offsets, at = [], 0
    for tensor_shape in case.tensor_shapes(shape):
        offsets.append(at)
        at += int(np.prod(tensor_shape)) * ITEM
    return offsets


def assert_runs_correctly_at(case, c_handle, offsets, outputs, inputs):
    """The run with tensors at these arena offsets succeeds, and its outputs match the float64 reference."""
    status, _, arena = run_at_offsets(case, c_handle, offsets, arrays=outputs + inputs)
    assert status == SUCCESS
    results = [arena.view(offset, o.shape) for offset, o in zip(offsets, outputs)]
    assert_matches_reference(case, results, inputs, F32)


def run_with_specs(case, c_handle, specs, pointers):
    """Status of a run of a descriptor made from (shape, dtype, strides) specs, on these data pointers."""
    ffi, _, _ = native()
    with CTensorDescriptors(specs) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        assert c_function(case, "Create")(c_handle, desc_ptr, *descriptors) == SUCCESS
    try:
        size = ffi.new("size_t *")
        assert c_function(case, "GetWorkspaceSize")(desc_ptr[0], size) == SUCCESS
        workspace = np.empty(max(size[0], 1), np.uint8)
        return c_function(case, "Run")(desc_ptr[0], ffi.from_buffer(workspace), size[0], *pointers, ffi.NULL)
    finally:
        assert c_function(case, "Destroy")(desc_ptr[0]) == SUCCESS


def argument_pairs():
    for case in OPS:
        for output in case.output_names:
            for other in case.tensor_names:
                if other != output:
                    yield pytest.param(case, output, other, id=f"{case.name}: {output} overlaps {other}")


@pytest.mark.parametrize("case, output, other", list(argument_pairs()))
def test_c_output_partly_overlapping_any_other_argument_is_refused(c_handle, case, output, other):
    offsets = packed_offsets(case)
    i, j = case.tensor_names.index(output), case.tensor_names.index(other)
    # `other` starts one element before the end of `output`: they share exactly one element.
    output_bytes = int(np.prod(case.tensor_shapes(SHAPE)[i])) * ITEM
    moved = list(offsets)
    moved[j] = offsets[i] + output_bytes - ITEM
    # Keep every other tensor clear of the two by moving them past the end.
    far = max(offsets) + 4096
    for k in range(len(moved)):
        if k not in (i, j):
            moved[k] = far + offsets[k]
    status, unchanged, _ = run_at_offsets(case, c_handle, moved)
    assert status == BAD_PARAM
    assert unchanged, "a refused run wrote to memory"


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_tensors_packed_back_to_back_run_correctly(c_handle, case):
    """Adjacent tensors share no byte: the footprint's last byte is exact, not one too far."""
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    offsets = packed_offsets(case)
    assert_runs_correctly_at(case, c_handle, offsets, outputs, inputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_in_place_pair_at_one_pointer_runs_correctly(c_handle, case):
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    output, source = IN_PLACE[case.name]
    offsets = packed_offsets(case)
    offsets[case.tensor_names.index(output)] = offsets[case.tensor_names.index(source)]
    assert_runs_correctly_at(case, c_handle, offsets, outputs, inputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_in_place_pair_shifted_by_one_element_is_refused(c_handle, case):
    output, source = IN_PLACE[case.name]
    offsets = packed_offsets(case)
    offsets[case.tensor_names.index(output)] = offsets[case.tensor_names.index(source)] + ITEM
    status, unchanged, _ = run_at_offsets(case, c_handle, offsets)
    assert status == BAD_PARAM and unchanged


@pytest.mark.parametrize("case", [c for c in OPS if c.row_tensors], ids=str)
def test_c_in_place_pair_with_another_layout_is_refused(c_handle, case):
    """Same pointer, but grad_x's rows padded while grad_y's are packed: they overlap without being one tensor."""
    output, source = IN_PLACE[case.name]
    shapes = case.tensor_shapes(SHAPE)
    specs = [(shape, F32, None) for shape in shapes]
    out_index, source_index = case.tensor_names.index(output), case.tensor_names.index(source)
    specs[out_index] = (SHAPE, F32, (2 * SHAPE[1] * SHAPE[2], 2 * SHAPE[2], 1))
    arena = Arena(64 * 1024)
    pointers = [arena.pointer(4096 * k) for k in range(len(shapes))]
    pointers[out_index] = pointers[source_index]
    before = arena.bytes.copy()
    assert run_with_specs(case, c_handle, specs, pointers) == BAD_PARAM
    assert np.array_equal(before, arena.bytes)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_negative_strides_footprint_lies_below_the_pointer(c_handle, case):
    """A reversed output vector touches the bytes *below* its pointer: an input right above the pointer's element
    is clear of it, one whose last element is the output's lowest element is not."""
    vector_out = case.output_names[1]
    vector_in = "w" if "w" in case.input_names else "weight"
    shapes = case.tensor_shapes(SHAPE)
    out_index, in_index = case.tensor_names.index(vector_out), case.tensor_names.index(vector_in)
    length = shapes[out_index][0]
    specs = [(shape, F32, None) for shape in shapes]
    specs[out_index] = ((length,), F32, (-1,))
    arena = Arena(64 * 1024)
    base = 32 * 1024  # the reversed vector's pointer: its elements lie at base, base - 4, ...
    statuses = {}
    for where, in_offset in (("above", base + ITEM), ("below", base - (length - 1) * ITEM - length * ITEM + ITEM)):
        pointers = [arena.pointer(4096 * k) for k in range(len(shapes))]
        pointers[out_index] = arena.pointer(base)
        pointers[in_index] = arena.pointer(in_offset)
        statuses[where] = run_with_specs(case, c_handle, specs, pointers)
    assert statuses == {"above": SUCCESS, "below": BAD_PARAM}


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_workspace_overlapping_any_tensor_is_refused(c_handle, case):
    shape = WORKSPACE_SHAPES[case.name]
    probe = COperator(case, c_handle, sum(sentinel_outputs_and_inputs(case, shape), []), strides_from_arrays=False)
    workspace_size = probe.workspace_size
    probe.destroy()
    assert workspace_size > 0, "no workspace needed: its overlap cannot be tested"
    # The workspace ends right before the tensors (which stay aligned to their elements): fine. The workspace
    # itself may start at any address.
    start = -workspace_size % 64
    after = [start + workspace_size + offset for offset in packed_offsets(case, shape)]
    status, _, _ = run_at_offsets(case, c_handle, after, shape=shape, workspace_offset=start)
    assert status == SUCCESS
    for index, name in enumerate(case.tensor_names):
        # The workspace's last byte is this tensor's first byte.
        status, unchanged, _ = run_at_offsets(case, c_handle, after, shape=shape,
                                              workspace_offset=after[index] - workspace_size + 1)
        assert status == BAD_PARAM and unchanged, name


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_inputs_sharing_memory_are_fine(c_handle, case):
    """Only outputs are written: two inputs may be the same memory."""
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    first, second = (case.tensor_names.index(n) for n in SHARED_INPUTS[case.name])
    arrays = outputs + inputs
    arrays[second] = arrays[first]  # the same values, so the reference sees what the kernel reads
    offsets = packed_offsets(case)
    offsets[second] = offsets[first]
    assert_runs_correctly_at(case, c_handle, offsets, outputs, arrays[len(outputs):])


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_empty_outputs_at_one_pointer_with_everything_are_fine(c_handle, case):
    """Empty outputs touch no byte (LayerNorm's input_std_deviation is not empty here: inputs may share)."""
    shape = (2, 0, 8) if case.contiguous_tensors else (2, 3, 0)
    status, _, _ = run_at_offsets(case, c_handle, [0] * len(case.tensor_names), shape=shape)
    assert status == SUCCESS


# ---------------------------------------------------------------- through the package

def _overlapping_out(case, inputs, victim):
    """Outputs for `case` where the first vector output is the input `victim` (a vector) itself."""
    outputs = [np.empty(s, F32) for s in case.output_shapes(SHAPE)]
    outputs[1] = inputs[case.input_names.index(victim)]
    return outputs


@pytest.mark.parametrize("case", OPS, ids=str)
def test_functional_refuses_an_output_that_is_an_input_and_names_both(case):
    inputs = list(case.make_inputs(np.random.default_rng(0), SHAPE, F32))
    victim = "w" if "w" in case.input_names else "weight"
    originals = [a.copy() for a in inputs]
    outputs = _overlapping_out(case, inputs, victim)
    with pytest.raises(infiniop_py.BadParamError, match=f"{case.output_names[1]}: overlaps {victim} in memory"):
        case.function()(*inputs, out=tuple(outputs))
    assert all(np.array_equal(a, b) for a, b in zip(inputs, originals)), "a refused call changed an input"


@pytest.mark.parametrize("case", OPS, ids=str)
def test_functional_fast_path_still_refuses_with_the_precise_message(case):
    """The layout-keyed fast path runs C directly; its BAD_PARAM falls back to the checked path's message."""
    inputs = list(case.make_inputs(np.random.default_rng(1), SHAPE, F32))
    victim = "w" if "w" in case.input_names else "weight"
    fresh = [np.empty(s, F32) for s in case.output_shapes(SHAPE)]
    case.function()(*inputs, out=tuple(fresh))
    case.function()(*inputs, out=tuple(fresh))  # now a known layout
    with pytest.raises(infiniop_py.BadParamError, match=f"overlaps {victim}"):
        case.function()(*inputs, out=tuple(_overlapping_out(case, inputs, victim)))


@pytest.mark.parametrize("case", OPS, ids=str)
def test_operator_refuses_outputs_sharing_memory_with_each_other(cpu_handle, case):
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    with case.operator_class()(cpu_handle, *outputs, *inputs) as operator:
        shared = list(outputs)
        if len(shared) == 3:
            shared[2] = shared[1]  # grad_bias is grad_weight
        else:
            shared[1] = shared[0][0, 0]  # grad_w is the first row of grad_x
        with pytest.raises(infiniop_py.BadParamError, match="overlaps"):
            operator(*shared, *inputs)
    assert all(untouched(o) for o in outputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_operator_refuses_a_workspace_inside_a_tensor(cpu_handle, case):
    shape = WORKSPACE_SHAPES[case.name]
    outputs, inputs = sentinel_outputs_and_inputs(case, shape)
    with case.operator_class()(cpu_handle, *outputs, *inputs) as operator:
        assert operator.workspace_size > 0
        workspace = outputs[0].reshape(-1).view(np.uint8)
        with pytest.raises(infiniop_py.BadParamError, match="workspace: overlaps"):
            operator(*outputs, *inputs, workspace=workspace)
    assert all(untouched(o) for o in outputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_interleaved_tensors_are_refused_conservatively(cpu_handle, case):
    """Footprints are byte ranges: an output interleaved with an input (every other element of one buffer) is
    refused although no element is shared. Documented in docs/guarantees.md."""
    length = case.output_shapes(SHAPE)[1][0]
    buffer = np.zeros(2 * length, F32)
    outputs = [np.empty(s, F32) for s in case.output_shapes(SHAPE)]
    inputs = list(case.make_inputs(np.random.default_rng(2), SHAPE, F32))
    victim = case.input_names.index("w" if "w" in case.input_names else "weight")
    buffer[1::2] = inputs[victim]
    inputs[victim] = buffer[1::2]
    outputs[1] = buffer[0::2]
    with pytest.raises(infiniop_py.BadParamError, match="overlaps"):
        case.function()(*inputs, out=tuple(outputs))
