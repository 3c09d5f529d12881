"""Operator objects: workspace_size, explicit workspaces, the three ways to describe tensors, calls with
arrays that do not match the layout the object was created for, and concurrent calls."""

import numpy as np
import pytest

import infiniop_py
from infiniop_py import errors
from _devices import DEVICES, DeviceData
from _helpers import (
    BF16, F16, F32, OPS, SUPPORTED_DTYPES, WORKSPACE_SHAPES, COperator, GuardedOutput, assert_matches_reference,
    sentinel_outputs_and_inputs, untouched, with_free_layout,
)


def outputs_and_inputs(case, dtype, seed=0, shape=None):
    return sentinel_outputs_and_inputs(case, shape or WORKSPACE_SHAPES[case.name], dtype, seed)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_workspace_size_is_the_c_query(cpu_handle, c_handle, case):
    outputs, inputs = outputs_and_inputs(case, F32)
    c_operator = COperator(case, c_handle, outputs + inputs)
    c_operator.destroy()
    with case.operator_class()(cpu_handle, *outputs, *inputs) as operator:
        assert isinstance(operator.workspace_size, int)
        assert operator.workspace_size == c_operator.workspace_size


def on_device(data, outputs, inputs):
    """outputs + inputs as handed to the operator on data's device."""
    return [data.put(a, output=True) for a in outputs] + [data.put(a) for a in inputs]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OPS, ids=str)
@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_explicit_workspace_exact_and_larger(device, device_handle, case, dtype):
    outputs, inputs = outputs_and_inputs(case, dtype)
    with case.operator_class()(device_handle, *on_device(DeviceData(device), outputs, inputs)) as operator:
        for extra in (0, 4096):
            outputs, inputs = outputs_and_inputs(case, dtype)  # outputs full of sentinels again
            data = DeviceData(device)
            operator(*on_device(data, outputs, inputs),
                     workspace=data.put(np.empty(operator.workspace_size + extra, np.uint8)))
            data.write_back()
            assert_matches_reference(case, outputs, inputs, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", OPS, ids=str)
def test_one_object_serves_new_data(device, device_handle, case):
    outputs, first_inputs = outputs_and_inputs(case, F32, seed=1)
    with case.operator_class()(device_handle, *on_device(DeviceData(device), outputs, first_inputs)) as operator:
        for seed in (1, 2, 3):
            outputs, inputs = outputs_and_inputs(case, F32, seed=seed)
            data = DeviceData(device)
            operator(*on_device(data, outputs, inputs))
            data.write_back()
            assert_matches_reference(case, outputs, inputs, F32)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_tensor_desc_array_and_tuple_describe_the_same_layout(cpu_handle, case):
    outputs, inputs = outputs_and_inputs(case, BF16, shape=(3, 5, 40))
    arrays = outputs + inputs
    descs = [infiniop_py.TensorDesc.from_array(a) for a in arrays]
    tuples = [(a.shape, "bfloat16", tuple(s // a.itemsize for s in a.strides)) for a in arrays]
    for described in (arrays, descs, tuples):
        for output in outputs:
            output[...] = GuardedOutput.SENTINEL
        with case.operator_class()(cpu_handle, *described) as operator:
            operator(*arrays)
        assert_matches_reference(case, outputs, inputs, BF16)
    for desc in descs:
        desc.close()


def _mismatches(case, arrays):
    """(tensor name, replacement array, expected error) per way an array can miss the created layout."""
    names = case.tensor_names
    for name, array in zip(names, arrays):
        yield name, array.astype(F16), errors.BadTensorDtypeError
        wider = np.zeros(array.shape[:-1] + (array.shape[-1] + 1,), array.dtype)
        yield name, wider, errors.BadTensorShapeError
    # Same shape and dtype, other strides: every op has a vector tensor that may be strided.
    vector = names[-1] if case.name != "layer_norm_backward" else "weight"
    index = names.index(vector)
    yield vector, with_free_layout(arrays[index], "stride2"), errors.BadTensorStridesError


@pytest.mark.parametrize("case", OPS, ids=str)
def test_arrays_not_matching_the_created_layout_are_rejected(cpu_handle, case):
    outputs, inputs = outputs_and_inputs(case, F32, shape=(3, 5, 40))
    arrays = outputs + inputs
    with case.operator_class()(cpu_handle, *arrays) as operator:
        for name, replacement, error in _mismatches(case, arrays):
            call_arrays = list(arrays)
            call_arrays[case.tensor_names.index(name)] = replacement
            with pytest.raises(error, match=name):
                operator(*call_arrays)
            assert all(untouched(output) for output in outputs), f"written after rejecting {name}"


@pytest.mark.parametrize("case", OPS, ids=str)
def test_read_only_output_is_rejected(cpu_handle, case):
    outputs, inputs = outputs_and_inputs(case, F32, shape=(2, 3, 8))
    with case.operator_class()(cpu_handle, *outputs, *inputs) as operator:
        outputs[0].flags.writeable = False
        with pytest.raises(ValueError, match=case.output_names[0]):
            operator(*outputs, *inputs)


def test_handle_must_be_a_handle():
    outputs, inputs = outputs_and_inputs(OPS[0], F32, shape=(2, 3, 8))
    with pytest.raises(TypeError):
        infiniop_py.RMSNormBackward("cpu", *outputs, *inputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_one_object_called_from_several_threads(cpu_handle, case):
    """Concurrent calls on one object (each with its own outputs) must not share a workspace."""
    from concurrent.futures import ThreadPoolExecutor

    template_outputs, inputs = outputs_and_inputs(case, F32)
    with case.operator_class()(cpu_handle, *template_outputs, *inputs) as operator:
        def run_into_fresh_outputs(_):
            outputs = [np.empty_like(o) for o in template_outputs]
            for _ in range(5):
                operator(*outputs, *inputs)
            return outputs

        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(run_into_fresh_outputs, range(8)))
    assert_matches_reference(case, results[0], inputs, F32)
    for outputs in results[1:]:
        assert all(a.tobytes() == b.tobytes() for a, b in zip(outputs, results[0]))


def test_functional_cache_under_threads_with_mixed_layouts():
    """The descriptor cache is shared; threads asking for different ops, shapes and dtypes at once all get
    right answers (test_package_threads.py covers many threads on one layout)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(case, shape, dtype) for case in OPS for shape in ((2, 3, 16), (4, 5, 33))
            for dtype in SUPPORTED_DTYPES]

    def run(job):
        case, shape, dtype = job
        inputs = case.make_inputs(np.random.default_rng(len(shape)), shape, dtype)
        for _ in range(5):
            outputs = case.function()(*inputs)
        return case, inputs, outputs, dtype

    with ThreadPoolExecutor(4) as pool:
        for case, inputs, outputs, dtype in pool.map(run, jobs * 2):
            assert_matches_reference(case, outputs, inputs, dtype)
