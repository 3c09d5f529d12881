"""infinirt's events (InfiniCore's infinirtEventCreate / Record / Query / Synchronize / Destroy and
infinirtStreamWaitEvent) on the CPU device and, where one is usable, NVIDIA's (a GPU or the CPU emulation); the
Ascend ones run against the CANN emulation (tests/test_ascend_emulated.py::test_runtime)."""

import pytest

from infiniop_py._ffi import ffi, libraries
from infiniop_py.handle import selected_device
from _devices import DEVICES
from _helpers import NULL_POINTER


@pytest.mark.parametrize("device", DEVICES)
def test_an_event_orders_one_stream_after_another(device):
    rt = libraries().rt
    with selected_device(device, 0):
        stream, event, state = ffi.new("infinirtStream_t *"), ffi.new("infinirtEvent_t *"), ffi.new(
            "infinirtEventStatus_t *", rt.INFINIRT_EVENT_NOT_READY)
        assert rt.infinirtStreamCreate(stream) == 0
        assert rt.infinirtEventCreate(event) == 0 and event[0] != ffi.NULL
        assert rt.infinirtEventQuery(event[0], state) == 0
        assert state[0] == rt.INFINIRT_EVENT_COMPLETE  # never recorded: complete
        assert rt.infinirtEventRecord(event[0], ffi.NULL) == 0  # on the default stream
        assert rt.infinirtStreamWaitEvent(stream[0], event[0]) == 0
        assert rt.infinirtEventSynchronize(event[0]) == 0
        state[0] = rt.INFINIRT_EVENT_NOT_READY
        assert rt.infinirtEventQuery(event[0], state) == 0 and state[0] == rt.INFINIRT_EVENT_COMPLETE
        assert rt.infinirtStreamSynchronize(stream[0]) == 0
        assert rt.infinirtEventDestroy(event[0]) == 0
        assert rt.infinirtStreamDestroy(stream[0]) == 0


def test_null_events_and_status_pointers_are_refused():
    rt = libraries().rt
    with selected_device("cpu", 0):
        event = ffi.new("infinirtEvent_t *")
        assert rt.infinirtEventCreate(ffi.NULL) == NULL_POINTER
        assert rt.infinirtEventCreate(event) == 0
        assert rt.infinirtEventQuery(event[0], ffi.NULL) == NULL_POINTER
        assert rt.infinirtEventRecord(ffi.NULL, ffi.NULL) == NULL_POINTER
        assert rt.infinirtStreamWaitEvent(ffi.NULL, ffi.NULL) == NULL_POINTER  # a NULL stream is the default one
        for call in (rt.infinirtEventSynchronize, rt.infinirtEventDestroy):
            assert call(ffi.NULL) == NULL_POINTER
        assert rt.infinirtEventDestroy(event[0]) == 0
