"""A build with CUDA enabled, on a machine without an NVIDIA GPU or driver: the libraries load, the device count
is 0 (asking is not an error), every other NVIDIA call reports DEVICE_NOT_FOUND, and the CPU stays the default
device. Skips on CPU-only builds and on GPU machines."""
import pytest

import infiniop_py

from infiniop_py._ffi import ffi, libraries  # noqa: E402  the package's libraries and cdef

CPU, NVIDIA = 0, 1
DEVICE_TYPE_NOT_SUPPORTED, DEVICE_NOT_FOUND = 5, 6


@pytest.fixture(scope="module")
def libs():
    rt, op = libraries().rt, libraries().op
    count = ffi.new("int*", -1)
    status = rt.infinirtGetDeviceCount(NVIDIA, count)
    if status == DEVICE_TYPE_NOT_SUPPORTED:
        pytest.skip("this build has no NVIDIA backend (configure with --nv-gpu=y)")
    if status == 0 and count[0] > 0:
        pytest.skip(f"an NVIDIA device is present ({count[0]}); see test_nvidia_backend.py")
    return ffi, rt, op, status, count[0]


def test_device_count_is_zero_and_not_an_error(libs):
    _, _, _, status, count = libs
    assert status == 0 and count == 0


def test_set_device_reports_not_found_and_keeps_cpu(libs):
    ffi, rt, op, _, _ = libs
    assert rt.infinirtSetDevice(NVIDIA, 0) == DEVICE_NOT_FOUND
    device, device_id = ffi.new("infiniDevice_t *"), ffi.new("int *")
    assert rt.infinirtGetDevice(device, device_id) == 0 and device[0] == CPU
    handle = ffi.new("infiniopHandle_t*")
    assert op.infiniopCreateHandle(handle) == 0
    assert op.infiniopDestroyHandle(handle[0]) == 0


def test_python_handle_says_there_is_no_device(libs):
    with pytest.raises(infiniop_py.DeviceNotFoundError, match="no nvidia device"):
        infiniop_py.Handle("nvidia")
