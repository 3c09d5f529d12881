"""Every status code of the seeds, for every op: through the Python layer (typed error naming the tensor)
and directly through C (the status code)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import infiniop_py
from infiniop_py import errors
from _devices import DEVICES
from _helpers import (assert_matches_reference, 
    BAD_PARAM, BAD_TENSOR_DTYPE, BAD_TENSOR_SHAPE, BAD_TENSOR_STRIDES, DEVICE_NOT_FOUND, DEVICE_TYPE_NOT_SUPPORTED,
    F16, F32, INSUFFICIENT_WORKSPACE, NULL_POINTER, OPS, SUCCESS, WORKSPACE_SHAPES, COperator, CTensorDescriptors,
    c_create_status, c_function, contiguous_strides, data_pointer, native, sentinel_outputs_and_inputs, untouched,
)

BASE_SHAPE = (4, 3, 8)


def base_specs(case, dtype=F32):
    """[shape, dtype, strides] per tensor, descriptor order, all valid and contiguous."""
    return [[shape, dtype, None] for shape in case.tensor_shapes(BASE_SHAPE)]


def _big(case):
    """Names of the tensors that have the big (N1, N2, D) / (N, C, L) shape."""
    return [n for n, s in zip(case.tensor_names, case.tensor_shapes(BASE_SHAPE)) if s == BASE_SHAPE]


def _vectors(case):
    return [n for n, s in zip(case.tensor_names, case.tensor_shapes(BASE_SHAPE)) if len(s) == 1]


def _with(case, changes, dtype=F32):
    specs = base_specs(case, dtype)
    for name, field, value in changes:
        specs[case.tensor_names.index(name)][("shape", "dtype", "strides").index(field)] = value
    return [tuple(s) for s in specs]


def layout_cases():
    """(case, description, specs, expected status, tensor the Python message must name or None)."""
    for case in OPS:
        first = case.tensor_names[0]
        big, vectors = _big(case), _vectors(case)
        rank_ok = (2, 3) if case.contiguous_tensors == () else (3,)
        yield case, "contiguous", _with(case, []), SUCCESS, None
        # ---- dtype
        yield case, "all float64", _with(case, [], np.float64), BAD_TENSOR_DTYPE, first
        yield case, "all int32", _with(case, [], np.int32), BAD_TENSOR_DTYPE, first
        for name in case.tensor_names[1:]:
            yield case, f"{name} float16, rest float32", _with(case, [(name, "dtype", F16)]), BAD_TENSOR_DTYPE, name
        # ---- shape
        for ndim in (1, 2, 3, 4):
            if ndim in rank_ok:
                continue
            wrong = BASE_SHAPE[:ndim] if ndim <= 3 else (2,) + BASE_SHAPE
            changes = [(n, "shape", wrong) for n in big]
            if "input_std_deviation" in case.tensor_names:
                changes.append(("input_std_deviation", "shape", wrong[:-1]))
            if case.contiguous_tensors:  # BN: the channel vectors follow shape[1]
                changes += [(n, "shape", (wrong[1] if ndim > 1 else 1,)) for n in vectors]
            else:
                changes += [(n, "shape", (wrong[-1],)) for n in vectors]
            yield case, f"rank {ndim}", _with(case, changes), BAD_TENSOR_SHAPE, first
        for name in big[1:]:
            yield case, f"{name} leading dim", _with(case, [(name, "shape", (5, 3, 8))]), BAD_TENSOR_SHAPE, name
            yield case, f"{name} last dim", _with(case, [(name, "shape", (4, 3, 9))]), BAD_TENSOR_SHAPE, name
            yield case, f"{name} rank 2", _with(case, [(name, "shape", (12, 8))]), BAD_TENSOR_SHAPE, name
        for name in vectors:
            length = case.tensor_shapes(BASE_SHAPE)[case.tensor_names.index(name)][0]
            yield case, f"{name} too long", _with(case, [(name, "shape", (length + 1,))]), BAD_TENSOR_SHAPE, name
            yield case, f"{name} 2-D", _with(case, [(name, "shape", (1, length))]), BAD_TENSOR_SHAPE, name
        if "input_std_deviation" in case.tensor_names:
            for wrong in ((4,), (4, 3, 8), (3, 4)):
                yield (case, f"input_std_deviation {wrong}", _with(case, [("input_std_deviation", "shape", wrong)]),
                       BAD_TENSOR_SHAPE, "input_std_deviation")
        # ---- strides
        for name in case.row_tensors:
            yield (case, f"{name} last stride 2", _with(case, [(name, "strides", (48, 16, 2))]),
                   BAD_TENSOR_STRIDES, name)
            yield (case, f"{name} last dim size 1, stride 5",
                   _with(case, [(n, "shape", (4, 3, 1)) for n in big] + [(name, "strides", (3, 1, 5))]
                         + [(n, "shape", (1,)) for n in vectors]),
                   SUCCESS, None)
        for name in case.contiguous_tensors:
            yield case, f"{name} padded", _with(case, [(name, "strides", (27, 9, 1))]), BAD_TENSOR_STRIDES, name
            yield case, f"{name} reversed", _with(case, [(name, "strides", (-24, 8, 1))]), BAD_TENSOR_STRIDES, name
            yield (case, f"{name} size-1 channel dim, odd stride",
                   _with(case, [(n, "shape", (4, 1, 8)) for n in big] + [(name, "strides", (8, 100, 1))]
                         + [(n, "shape", (1,)) for n in vectors]),
                   SUCCESS, None)
        for name in case.output_names:
            shape = case.tensor_shapes(BASE_SHAPE)[case.tensor_names.index(name)]
            zero = (0,) + contiguous_strides(shape)[1:]
            yield case, f"{name} zero stride", _with(case, [(name, "strides", zero)]), BAD_TENSOR_STRIDES, name
        if not case.contiguous_tensors:
            output = case.output_names[0]
            yield (case, f"{output} overlapping rows", _with(case, [(output, "strides", (8, 4, 1))]),
                   BAD_TENSOR_STRIDES, output)
            yield (case, "outputs padded and reversed",
                   _with(case, [(output, "strides", (-100, 20, 1))]
                         + [(n, "strides", (-3,)) for n in case.output_names[1:]]), SUCCESS, None)
            yield (case, "inputs broadcast, reversed, padded",
                   _with(case, [(n, "strides", (0, -9, 1)) for n in big[1:]]
                         + [(n, "strides", (0,)) for n in vectors if n not in case.output_names]), SUCCESS, None)
        else:
            yield (case, "channel vectors strided",
                   _with(case, [(n, "strides", ((-2,) if n in case.output_names else (0,))) for n in vectors]),
                   SUCCESS, None)
        yield (case, "empty output with zero strides",
               _with(case, [(n, "shape", (0, 3, 8)) for n in big] + [(first, "strides", (0, 0, 1))]
                     + ([("input_std_deviation", "shape", (0, 3))] if "input_std_deviation" in case.tensor_names
                        else [])),
               SUCCESS, None)


LAYOUT_CASES = [pytest.param(*c, id=f"{c[0].name}: {c[1]}") for c in layout_cases()]


# Where the Ex create (which the operator classes use when the library has it) accepts more than the seed's:
# F64, any rank for RMS/LN, ranks 2..5 for BN, and an input_std_deviation of lower rank (more dims
# normalized, so the vectors no longer fit). The CUDA backend implements every Ex feature, as the CPU's does.
EX_VERDICTS = {
    **{(op, description): (SUCCESS, None) for op in ("rms_norm_backward", "layer_norm_backward")
       for description in ("all float64", "rank 1", "rank 4")},
    **{("batch_norm_backward", description): (SUCCESS, None) for description in ("all float64", "rank 2", "rank 4")},
    ("layer_norm_backward", "input_std_deviation (4,)"): (BAD_TENSOR_SHAPE, "weight"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case, description, specs, expected, named", LAYOUT_CASES)
def test_python_operator_raises_typed_error_naming_the_tensor(device_handle, case, description, specs, expected,
                                                              named):
    expected, named = EX_VERDICTS.get((case.name, description), (expected, named))
    if expected == SUCCESS:
        case.operator_class()(device_handle, *specs).close()
        return
    with pytest.raises(errors.error_for_status(expected)) as raised:
        case.operator_class()(device_handle, *specs)
    assert raised.value.status == expected
    if named is not None:  # a layout error
        assert isinstance(raised.value, ValueError)
        assert named in str(raised.value)


@pytest.mark.parametrize("case, description, specs, expected, named", LAYOUT_CASES)
def test_c_create_descriptor_status(c_handle, case, description, specs, expected, named):
    assert c_create_status(case, c_handle, specs) == expected


# ---------------------------------------------------------------- functional API

@pytest.mark.parametrize("case", OPS, ids=str)
def test_functional_rejects_mixed_and_unsupported_dtypes(case):
    inputs = case.make_inputs(np.random.default_rng(0), BASE_SHAPE, F32)
    big_input = [name for name in case.input_names if name in case.row_tensors + case.contiguous_tensors][-1]
    mixed = [a.astype(F16) if name == big_input else a for name, a in zip(case.input_names, inputs)]
    with pytest.raises(errors.BadTensorDtypeError, match=big_input):
        case.function()(*mixed)
    for unsupported in (np.int32, np.uint8):
        with pytest.raises(errors.BadTensorDtypeError):
            case.function()(*(a.astype(unsupported) for a in inputs))


@pytest.mark.parametrize("case", OPS, ids=str)
def test_functional_rejects_shape_mismatch(case):
    inputs = list(case.make_inputs(np.random.default_rng(0), BASE_SHAPE, F32))
    weight_index = case.input_names.index("w" if "w" in case.input_names else "weight")
    inputs[weight_index] = np.concatenate([inputs[weight_index], inputs[weight_index][:1]])
    with pytest.raises(errors.BadTensorShapeError, match=case.input_names[weight_index]):
        case.function()(*inputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_strided_rows_are_copied_by_the_functional_api_and_refused_by_the_operator(cpu_handle, case):
    name = (case.row_tensors or case.contiguous_tensors)[-1]
    index = case.input_names.index(name)
    shape = (4, 3, 8)
    inputs = list(case.make_inputs(np.random.default_rng(0), shape, F32))
    wide = np.zeros((4, 3, 16), F32)
    wide[..., ::2] = inputs[index]
    strided = list(inputs)
    strided[index] = wide[..., ::2]

    assert_matches_reference(case, case.function()(*strided), inputs, F32)
    outputs = [np.empty(s, F32) for s in case.output_shapes(shape)]
    wide_output = np.zeros((4, 3, 16), F32)
    outputs[0] = wide_output[..., ::2]
    returned = case.function()(*strided, out=tuple(outputs))
    assert returned[0] is outputs[0] and not wide_output[..., 1::2].any()
    assert_matches_reference(case, outputs, inputs, F32)

    packed_outputs = [np.empty(shape, F32) for shape in case.output_shapes(shape)]
    specs = [(a.shape, a.dtype, tuple(st // a.itemsize for st in a.strides)) for a in (*packed_outputs, *strided)]
    with pytest.raises(errors.BadTensorStridesError, match=name):
        case.operator_class()(cpu_handle, *specs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_functional_rejects_overlapping_output(case):
    inputs = case.make_inputs(np.random.default_rng(0), BASE_SHAPE, F32)
    outputs = [np.empty(s, F32) for s in case.output_shapes(BASE_SHAPE)]
    outputs[1] = np.lib.stride_tricks.as_strided(outputs[1], strides=(0,))
    with pytest.raises(errors.BadTensorStridesError, match=case.output_names[1]):
        case.function()(*inputs, out=tuple(outputs))


def test_wrong_python_type_is_type_error():
    with pytest.raises(TypeError):
        infiniop_py.rms_norm_backward("not an array", np.ones((2, 3), F32), np.ones(3, F32))


# ---------------------------------------------------------------- NULL_POINTER through C

@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_create_null_pointers(c_handle, case):
    ffi, _, _ = native()
    create = c_function(case, "Create")
    with CTensorDescriptors([(s, F32, None) for s in case.tensor_shapes(BASE_SHAPE)]) as descriptors:
        desc_ptr = ffi.new("infiniopDescriptor_t *")
        assert create(ffi.NULL, desc_ptr, *descriptors) == NULL_POINTER
        assert create(c_handle, ffi.NULL, *descriptors) == NULL_POINTER
        for position, name in enumerate(case.tensor_names):
            with_null = list(descriptors)
            with_null[position] = ffi.NULL
            if name == "grad_bias":  # a layer without bias (issue 27): created, grad_bias not computed
                assert create(c_handle, desc_ptr, *with_null) == SUCCESS, name
                assert c_function(case, "Destroy")(desc_ptr[0]) == SUCCESS
                continue
            assert create(c_handle, desc_ptr, *with_null) == NULL_POINTER, name


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_workspace_size_and_destroy_null_pointers(c_handle, case):
    ffi, _, _ = native()
    assert c_function(case, "GetWorkspaceSize")(ffi.NULL, ffi.new("size_t *")) == NULL_POINTER
    operator = COperator(case, c_handle, [np.empty(s, F32) for s in case.tensor_shapes(BASE_SHAPE)])
    try:
        assert c_function(case, "GetWorkspaceSize")(operator.descriptor, ffi.NULL) == NULL_POINTER
    finally:
        operator.destroy()
    assert c_function(case, "Destroy")(ffi.NULL) == NULL_POINTER


def _arrays(case, shape):
    outputs, inputs = sentinel_outputs_and_inputs(case, shape)
    return outputs + inputs


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_run_null_pointers(c_handle, case):
    ffi, _, _ = native()
    arrays = _arrays(case, BASE_SHAPE)
    operator = COperator(case, c_handle, arrays)
    workspace = np.empty(max(operator.workspace_size, 1), np.uint8)
    pointers = [data_pointer(a) for a in arrays]
    try:
        assert c_function(case, "Run")(ffi.NULL, data_pointer(workspace), operator.workspace_size, *pointers,
                                       ffi.NULL) == NULL_POINTER
        for position, name in enumerate(case.tensor_names):
            with_null = list(pointers)
            with_null[position] = ffi.NULL
            assert operator.run(data_pointer(workspace), operator.workspace_size, with_null) == NULL_POINTER, name
        assert operator.run(data_pointer(workspace), operator.workspace_size, pointers) == SUCCESS
    finally:
        operator.destroy()


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_run_null_workspace_when_one_is_needed(c_handle, case):
    ffi, _, _ = native()
    arrays = _arrays(case, WORKSPACE_SHAPES[case.name])
    operator = COperator(case, c_handle, arrays)
    try:
        assert operator.workspace_size > 0, "no workspace needed: NULL workspace cannot be tested"
        status = operator.run(ffi.NULL, operator.workspace_size, [data_pointer(a) for a in arrays])
        assert status == NULL_POINTER
    finally:
        operator.destroy()


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_run_null_data_of_empty_tensors_is_fine(c_handle, case):
    ffi, _, _ = native()
    shape = (0, 3, 8)
    arrays = _arrays(case, shape)
    # numpy reports zero strides for empty arrays; describe them as contiguous (NULL strides) here.
    operator = COperator(case, c_handle, arrays, strides_from_arrays=False)
    workspace = np.empty(max(operator.workspace_size, 1), np.uint8)
    pointers = [ffi.NULL if a.size == 0 else data_pointer(a) for a in arrays]
    try:
        assert operator.run(data_pointer(workspace), operator.workspace_size, pointers) == SUCCESS
    finally:
        operator.destroy()
    for vector_output in arrays[1:len(case.output_names)]:
        assert np.array_equal(vector_output.astype(np.float64), np.zeros(vector_output.shape))


# ---------------------------------------------------------------- INSUFFICIENT_WORKSPACE

@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_insufficient_workspace_writes_nothing(c_handle, case):
    arrays = _arrays(case, WORKSPACE_SHAPES[case.name])
    operator = COperator(case, c_handle, arrays)
    workspace = np.empty(operator.workspace_size, np.uint8)
    try:
        assert operator.workspace_size > 0, "no workspace needed: INSUFFICIENT_WORKSPACE cannot be reached"
        status = operator.run(data_pointer(workspace), operator.workspace_size - 1, [data_pointer(a) for a in arrays])
        assert status == INSUFFICIENT_WORKSPACE
    finally:
        operator.destroy()
    assert all(untouched(output) for output in arrays[:len(case.output_names)])


@pytest.mark.parametrize("case", OPS, ids=str)
def test_python_insufficient_workspace_writes_nothing(cpu_handle, case):
    arrays = _arrays(case, WORKSPACE_SHAPES[case.name])
    with case.operator_class()(cpu_handle, *arrays) as operator:
        assert operator.workspace_size > 0, "no workspace needed: INSUFFICIENT_WORKSPACE cannot be reached"
        with pytest.raises(errors.InsufficientWorkspaceError) as raised:
            operator(*arrays, workspace=np.empty(operator.workspace_size - 1, np.uint8))
    assert raised.value.status == INSUFFICIENT_WORKSPACE
    assert all(untouched(output) for output in arrays[:len(case.output_names)])


# ---------------------------------------------------------------- tensor descriptors through C

def test_c_tensor_descriptor_statuses():
    ffi, op, _ = native()
    pointer = ffi.new("infiniopTensorDescriptor_t *")
    shape = ffi.new("size_t[]", [2, 3])
    assert op.infiniopCreateTensorDescriptor(ffi.NULL, 2, shape, ffi.NULL, 13) == NULL_POINTER
    assert op.infiniopCreateTensorDescriptor(pointer, 2, ffi.NULL, ffi.NULL, 13) == NULL_POINTER
    assert op.infiniopCreateTensorDescriptor(pointer, 2, shape, ffi.NULL, 0) == BAD_TENSOR_DTYPE
    assert op.infiniopCreateTensorDescriptor(pointer, 2, shape, ffi.NULL, 20) == BAD_TENSOR_DTYPE
    huge = ffi.new("size_t[]", [2**62, 4])
    assert op.infiniopCreateTensorDescriptor(pointer, 2, huge, ffi.NULL, 13) == BAD_TENSOR_SHAPE
    far = ffi.new("ptrdiff_t[]", [2**62, 1])  # the last element sits at 2 * 2**62 = 2**63 > INT64_MAX
    assert op.infiniopCreateTensorDescriptor(pointer, 2, ffi.new("size_t[]", [3, 3]), far, 13) == BAD_TENSOR_SHAPE
    assert op.infiniopDestroyTensorDescriptor(ffi.NULL) == NULL_POINTER
    for ndim, dims, dtype in ((0, ffi.NULL, 13), (2, shape, 14), (2, shape, 5)):
        assert op.infiniopCreateTensorDescriptor(pointer, ndim, dims, ffi.NULL, dtype) == SUCCESS
        assert op.infiniopDestroyTensorDescriptor(pointer[0]) == SUCCESS


def test_c_runtime_null_pointers():
    ffi, _, rt = native()
    assert rt.infinirtGetDeviceCount(0, ffi.NULL) == NULL_POINTER
    assert rt.infinirtGetDevice(ffi.NULL, ffi.new("int *")) == NULL_POINTER
    assert rt.infinirtGetDevice(ffi.new("infiniDevice_t *"), ffi.NULL) == NULL_POINTER
    assert rt.infinirtStreamCreate(ffi.NULL) == NULL_POINTER
    assert rt.infinirtMalloc(ffi.NULL, 8) == NULL_POINTER
    assert rt.infinirtMallocHost(ffi.NULL, 8) == NULL_POINTER
    assert rt.infinirtMemset(ffi.NULL, 0, 8) == NULL_POINTER
    buffer = np.zeros(8, np.uint8)
    assert rt.infinirtMemcpy(ffi.NULL, data_pointer(buffer), 8, 0) == NULL_POINTER
    assert rt.infinirtMemcpy(data_pointer(buffer), ffi.NULL, 8, 0) == NULL_POINTER


def test_c_handle_null_pointers():
    ffi, op, _ = native()
    assert op.infiniopCreateHandle(ffi.NULL) == NULL_POINTER
    assert op.infiniopDestroyHandle(ffi.NULL) == NULL_POINTER


# ---------------------------------------------------------------- devices

NOT_BUILT_DEVICES = {"cambricon": 2, "metax": 4, "moore": 5, "iluvatar": 6, "kunlun": 7, "hygon": 8, "qy": 9,
                     "ali": 10}


@pytest.fixture
def restore_cpu_device():
    yield
    assert native()[2].infinirtSetDevice(0, 0) == SUCCESS


def test_c_set_device_statuses(restore_cpu_device):
    ffi, _, rt = native()
    count = ffi.new("int *")
    assert rt.infinirtGetDeviceCount(0, count) == SUCCESS and count[0] == 1
    assert rt.infinirtGetDeviceCount(2, count) == DEVICE_TYPE_NOT_SUPPORTED
    assert rt.infinirtGetDeviceCount(11, count) == BAD_PARAM
    assert rt.infinirtSetDevice(0, 0) == SUCCESS
    assert rt.infinirtSetDevice(0, 1) == DEVICE_NOT_FOUND
    assert rt.infinirtSetDevice(0, -1) == DEVICE_NOT_FOUND
    for name, code in NOT_BUILT_DEVICES.items():
        assert rt.infinirtSetDevice(code, 0) == DEVICE_TYPE_NOT_SUPPORTED, name
    for code in (1, 3):  # NVIDIA, ASCEND: optional backends, with or without a device
        status = rt.infinirtGetDeviceCount(code, count)
        present = status == SUCCESS and count[0] > 0
        assert status in (SUCCESS, DEVICE_TYPE_NOT_SUPPORTED)
        assert rt.infinirtSetDevice(code, 0) == (SUCCESS if present else status or DEVICE_NOT_FOUND)
    for code in (11, 12, 1000):
        assert rt.infinirtSetDevice(code, 0) == BAD_PARAM


def test_c_failed_set_device_keeps_the_current_device(restore_cpu_device):
    ffi, _, rt = native()
    assert rt.infinirtSetDevice(0, 0) == SUCCESS
    assert rt.infinirtSetDevice(2, 0) == DEVICE_TYPE_NOT_SUPPORTED
    device, device_id = ffi.new("infiniDevice_t *"), ffi.new("int *")
    assert rt.infinirtGetDevice(device, device_id) == SUCCESS
    assert (device[0], device_id[0]) == (0, 0)


@pytest.mark.parametrize("device", sorted(NOT_BUILT_DEVICES))
def test_python_handle_for_a_device_not_built(device):
    with pytest.raises(errors.DeviceTypeNotSupportedError) as raised:
        infiniop_py.Handle(device)
    assert raised.value.status == DEVICE_TYPE_NOT_SUPPORTED


def test_python_handle_device_errors_then_cpu_still_works():
    for device_id in (1, -1, 2**31, -2**31 - 1, 2**70):  # beyond C's int too: cffi raised OverflowError
        with pytest.raises(errors.DeviceNotFoundError, match=f"infinirtSetDevice\\(cpu, {device_id}\\)") as raised:
            infiniop_py.Handle("cpu", device_id)
        assert raised.value.status == DEVICE_NOT_FOUND
    with pytest.raises(ValueError):
        infiniop_py.Handle("no-such-device")
    with infiniop_py.Handle("cpu") as handle:
        inputs = [np.ones((2, 4), F32), np.ones((2, 4), F32), np.ones(4, F32)]
        with infiniop_py.RMSNormBackward(handle, np.empty((2, 4), F32), np.empty(4, F32), *inputs) as operator:
            grad_x, grad_w = np.empty((2, 4), F32), np.empty(4, F32)
            operator(grad_x, grad_w, *inputs)
    # x = grad_y = w = 1: r = 1, grad_x = 1 - 1 * 4 / 4 = 0, grad_w = rows * 1 = 2.
    assert np.array_equal(grad_x, np.zeros((2, 4))) and np.array_equal(grad_w, np.full(4, 2.0))


# ---------------------------------------------------------------- errors module

STATUS_NAMES = {1: "INTERNAL_ERROR", 2: "NOT_IMPLEMENTED", 3: "BAD_PARAM", 4: "NULL_POINTER",
                5: "DEVICE_TYPE_NOT_SUPPORTED", 6: "DEVICE_NOT_FOUND", 7: "DEVICE_NOT_INITIALIZED",
                8: "DEVICE_ARCHITECTURE_NOT_SUPPORTED", 10: "BAD_TENSOR_DTYPE", 11: "BAD_TENSOR_SHAPE",
                12: "BAD_TENSOR_STRIDES", 13: "INSUFFICIENT_WORKSPACE"}


def test_check_raises_the_subclass_with_the_documented_message():
    expected = {1: errors.InternalError, 2: errors.NotImplementedStatusError, 3: errors.BadParamError,
                4: errors.NullPointerError, 5: errors.DeviceTypeNotSupportedError, 6: errors.DeviceNotFoundError,
                7: errors.DeviceNotInitializedError, 8: errors.DeviceArchitectureNotSupportedError,
                10: errors.BadTensorDtypeError, 11: errors.BadTensorShapeError, 12: errors.BadTensorStridesError,
                13: errors.InsufficientWorkspaceError}
    errors.check(SUCCESS, "nothing")
    for code, cls in expected.items():
        assert errors.error_for_status(code) is cls
        with pytest.raises(cls) as raised:
            errors.check(code, "infiniopSomething")
        assert raised.value.status == code
        assert raised.value.status_name == "INFINI_STATUS_" + STATUS_NAMES[code]
        assert str(raised.value) == f"infiniopSomething failed: {raised.value.status_name} ({code})"
    for value_error in (3, 10, 11, 12, 13):
        assert issubclass(expected[value_error], ValueError)


def test_ascend_without_cann_names_the_missing_library():
    """A handle on Ascend where CANN is absent: DEVICE_NOT_FOUND, and the message names the library."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME", "LD_LIBRARY_PATH")}
    script = (
        "import infiniop_py as ip\n"
        "try:\n"
        "    ip.Handle('ascend')\n"
        "except ip.DeviceNotFoundError as error:\n"
        "    print('refused:', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "libascendcl" in result.stdout, result.stdout
