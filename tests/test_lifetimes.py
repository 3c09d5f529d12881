"""Lifetimes: tensor descriptors destroyed right after op creation, close() twice, use after close,
context managers, and a Handle closed while operators made from it still exist."""

import gc

import numpy as np
import pytest

import infiniop_py
from _helpers import (
    F32, OPS, COperator, assert_matches_reference, data_pointer, sentinel_outputs_and_inputs, untouched,
)

SHAPE = (3, 4, 40)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_tensor_descriptors_destroyed_right_after_create(c_handle, case):
    """COperator destroys its tensor descriptors before returning; the op must still run correctly."""
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    operator = COperator(case, c_handle, outputs + inputs)
    gc.collect()
    workspace = np.empty(max(operator.workspace_size, 1), np.uint8)
    try:
        status = operator.run(data_pointer(workspace), operator.workspace_size,
                              [data_pointer(a) for a in outputs + inputs])
        assert status == 0
    finally:
        operator.destroy()
    assert_matches_reference(case, outputs, inputs, F32)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_python_tensor_descs_closed_right_after_create(cpu_handle, case):
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    descs = [infiniop_py.TensorDesc.from_array(a) for a in outputs + inputs]
    operator = case.operator_class()(cpu_handle, *descs)
    for desc in descs:
        desc.close()
        assert desc.closed
    with operator:
        operator(*outputs, *inputs)
    assert_matches_reference(case, outputs, inputs, F32)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_close_twice_and_use_after_close(cpu_handle, case):
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    operator = case.operator_class()(cpu_handle, *outputs, *inputs)
    operator.close()
    operator.close()
    assert operator.closed
    with pytest.raises(infiniop_py.ClosedError, match="is closed"):
        operator(*outputs, *inputs)
    with pytest.raises(RuntimeError):
        operator(*outputs, *inputs)
    assert all(untouched(o) for o in outputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_context_manager_closes(cpu_handle, case):
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    with case.operator_class()(cpu_handle, *outputs, *inputs) as operator:
        assert not operator.closed
        operator(*outputs, *inputs)
    assert operator.closed
    with pytest.raises(infiniop_py.ClosedError):
        operator(*outputs, *inputs)
    with pytest.raises(infiniop_py.ClosedError):
        with operator:
            pass


def test_tensor_desc_and_handle_close_twice_and_use_after_close():
    desc = infiniop_py.TensorDesc((2, 3), "float32")
    desc.close()
    desc.close()
    with pytest.raises(infiniop_py.ClosedError, match="is closed"):
        desc.native
    handle = infiniop_py.Handle("cpu")
    handle.close()
    handle.close()
    with pytest.raises(infiniop_py.ClosedError, match="is closed"):
        handle.native


def test_closed_handle_or_tensor_desc_cannot_make_operators():
    case = OPS[0]
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    handle = infiniop_py.Handle("cpu")
    handle.close()
    with pytest.raises(infiniop_py.ClosedError, match=r"^handle: Handle\('cpu', 0\) is closed"):
        case.operator_class()(handle, *outputs, *inputs)
    with infiniop_py.Handle("cpu") as open_handle:
        closed_desc = infiniop_py.TensorDesc.from_array(outputs[0])
        closed_desc.close()
        with pytest.raises(infiniop_py.ClosedError):
            case.operator_class()(open_handle, closed_desc, *outputs[1:], *inputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_operators_outlive_their_closed_handle(case):
    """The package lets Handle.close() destroy the native handle at once; op descriptors copy the device from
    it at create time, so operators made earlier keep working and stay correct (docs/api.md), on the fast path
    for plain arrays and on the checked one (a stream given), until their own close()."""
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    handle = infiniop_py.Handle("cpu")
    operator = case.operator_class()(handle, *outputs, *inputs)
    handle.close()
    assert handle.closed and operator.handle is handle and not operator.closed
    with operator:
        operator(*outputs, *inputs)
        assert_matches_reference(case, outputs, inputs, F32)
        for output in outputs:
            output[...] = 0
        operator(*outputs, *inputs, stream=0)  # a stream (0: the default one) takes the checked path
    assert_matches_reference(case, outputs, inputs, F32)
    with pytest.raises(infiniop_py.ClosedError, match="is closed"):
        operator(*outputs, *inputs)


@pytest.mark.parametrize("case", OPS, ids=str)
def test_c_descriptors_outlive_their_destroyed_handle(case):
    """The C ABI's promise behind the above (native/include/infiniop/handle.h): a descriptor runs, answers its
    workspace size and is destroyed after infiniopDestroyHandle (the sanitizer stage would see a use after free)."""
    from _helpers import native

    ffi, op, rt = native()
    pointer = ffi.new("infiniopHandle_t *")
    assert rt.infinirtSetDevice(0, 0) == 0 and op.infiniopCreateHandle(pointer) == 0
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    operator = COperator(case, pointer[0], outputs + inputs)
    assert op.infiniopDestroyHandle(pointer[0]) == 0
    try:
        workspace = np.empty(max(operator.workspace_size, 1), np.uint8)
        assert operator.run(data_pointer(workspace), operator.workspace_size,
                            [data_pointer(a) for a in outputs + inputs]) == 0
    finally:
        operator.destroy()
    assert_matches_reference(case, outputs, inputs, F32)


def test_unreferenced_objects_are_finalized_quietly():
    """The weakref.finalize fallback destroys what was never closed, without raising."""
    import warnings

    case = OPS[0]
    outputs, inputs = sentinel_outputs_and_inputs(case, SHAPE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            handle = infiniop_py.Handle("cpu")
            operator = case.operator_class()(handle, *outputs, *inputs)
            desc = infiniop_py.TensorDesc((2, 3), "float32")
            finalizers = [operator._finalizer, handle._finalizer, desc._finalizer]
            del operator, handle, desc
            gc.collect()
            assert not any(f.alive for f in finalizers)


def test_closes_from_two_threads_both_wait_for_the_call_in_flight_and_destroy_once():
    """close() makes its wait's Event only when a call is running; a second close() meanwhile must wait on the
    same one (a new Event would never be set: a hang), and the native object is destroyed once, after the call."""
    import threading

    from infiniop_py._resource import NativeResource

    destroyed = []
    resource = NativeResource()
    resource._own(object(), lambda pointer: destroyed.append(pointer) or 0, "destroy")
    resource._begin_call()  # a native call in flight
    closers = [threading.Thread(target=resource.close, daemon=True) for _ in range(2)]
    for closer in closers:
        closer.start()
    for closer in closers:
        closer.join(timeout=0.2)
        assert closer.is_alive()  # waiting for the call
    assert destroyed == []
    resource._end_call()
    for closer in closers:
        closer.join(timeout=10)
        assert not closer.is_alive()
    assert len(destroyed) == 1 and resource.closed
