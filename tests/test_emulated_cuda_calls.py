"""What one call does on the host on CUDA (issue 52): no device-wide synchronization, no allocation through the
driver, no device or attribute query, no device switch where the current device is already right, no stream made;
only its kernel launches (and the cheap current-device read and launch-error check). Counted on the CPU emulation
of CUDA (.ci/sanitize), whose runtime appends each call it gets to the file INFINIOP_EMULATED_CUDA_TRACE
names; elsewhere these skip, saying so (a GPU's runtime keeps no such record)."""

import collections
import gc
import os

import numpy as np
import pytest

import infiniop_py
from _devices import EMULATED_CUDA, DeviceData
from _helpers import F32, OPS, RMS_NORM

pytestmark = pytest.mark.nvidia
TRACE = "INFINIOP_EMULATED_CUDA_TRACE"
CALLS = 5
# What a call may do on the host, per call: read the current device (a thread-local read in the runtime),
# launch kernels and read their launch errors, and clear a workspace or output asynchronously.
PER_CALL = {"cudaGetDevice", "launch", "cudaGetLastError", "cudaMemsetAsync"}


@pytest.fixture(autouse=True)
def _emulated_only():
    if not EMULATED_CUDA:
        pytest.skip("counts CUDA runtime calls through the CPU emulation's trace (.ci/sanitize); a GPU's "
                    "runtime keeps no such record")


def runtime_calls(tmp_path, call):
    """The runtime calls (name -> count) of CALLS calls of ``call``, after one that warms the caches. The garbage
    collector is kept from freeing earlier tests' device arrays meanwhile (their cudaFree is not these calls')."""
    call()
    gc.collect()
    gc.disable()
    trace = tmp_path / "trace"
    os.environ[TRACE] = str(trace)
    try:
        for _ in range(CALLS):
            call()
    finally:
        del os.environ[TRACE]
        gc.enable()
    return collections.Counter(trace.read_text().split()) if trace.exists() else collections.Counter()


def assert_only_launches(calls):
    assert set(calls) <= PER_CALL, calls
    assert calls["launch"] >= CALLS and calls["launch"] % CALLS == 0, calls


def backward_case(case, data):
    rng = np.random.default_rng(0)
    shape = (4, 6, 40)
    inputs = [data.put(a) for a in case.make_inputs(rng, shape, F32)]
    outputs = [data.put(np.zeros(s, F32), output=True) for s in case.output_shapes(shape)]
    return inputs, outputs


@pytest.mark.parametrize("case", OPS, ids=str)
def test_a_backward_call_only_launches(case, tmp_path):
    data = DeviceData("nvidia")
    inputs, outputs = backward_case(case, data)
    function = case.function()
    assert_only_launches(runtime_calls(tmp_path, lambda: function(*inputs, out=tuple(outputs))))
    with infiniop_py.Handle("nvidia") as handle, case.operator_class()(handle, *outputs, *inputs) as operator:
        assert_only_launches(runtime_calls(tmp_path, lambda: operator(*outputs, *inputs)))


def forward_call(name, data):
    """A call of the forward ``name`` on device arrays placed once, with every output given."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6, 40)).astype(F32)
    vector = data.put(rng.standard_normal(40).astype(F32))
    channel = data.put(rng.standard_normal(6).astype(F32))
    y, x = data.put(np.zeros_like(x), output=True), data.put(x)

    def statistics(shape):
        return data.put(np.zeros(shape, F32), output=True)
    if name == "rms_norm":
        out = (y, statistics((4, 6)))
        return lambda: infiniop_py.rms_norm(x, vector, need_rstd=True, out=out)
    if name == "layer_norm":
        out = (y, statistics((4, 6)), statistics((4, 6)))
        return lambda: infiniop_py.layer_norm(x, vector, vector, need_stats=True, out=out)
    running_mean, running_var = statistics(6), data.put(np.ones(6, F32), output=True)
    out = (y, statistics(6), statistics(6))
    return lambda: infiniop_py.batch_norm(x, channel, channel, running_mean, running_var, need_stats=True, out=out)


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm", "batch_norm"])
def test_a_forward_call_only_launches(name, tmp_path):
    assert_only_launches(runtime_calls(tmp_path, forward_call(name, DeviceData("nvidia"))))


@pytest.mark.parametrize("case", OPS, ids=str)
def test_a_call_that_allocates_its_outputs_takes_cached_memory(case, tmp_path):
    """Without out=, a DLPack CUDA array's outputs are DeviceArrays: after the first call, their memory comes from
    the blocks that earlier outputs gave back, with no cudaMalloc or cudaFree (which waits for the device)."""
    inputs, _ = backward_case(case, DeviceData("nvidia"))
    function = case.function()
    assert_only_launches(runtime_calls(tmp_path, lambda: function(*inputs)))


def test_an_operators_workspace_is_reused_only_on_its_stream(tmp_path):
    """A workspace goes back to the operator when the launch returns, while its kernels may still run: a call on
    another stream gets a workspace of its own (one cudaMalloc, the first time), never the busy one."""
    from infiniop_py._ffi import ffi, libraries
    from infiniop_py.handle import selected_device

    case = RMS_NORM
    data = DeviceData("nvidia")
    inputs, outputs = backward_case(case, data)
    streams = []
    with selected_device("nvidia", 0):
        for _ in range(2):
            stream = ffi.new("infinirtStream_t *")
            assert libraries().rt.infinirtStreamCreate(stream) == 0
            streams.append(stream[0])
    order = iter([0, 1, 0, 1, 0, 1])  # the warm-up call on the first stream, then alternating
    try:
        with infiniop_py.Handle("nvidia") as handle, case.operator_class()(handle, *outputs, *inputs) as operator:
            assert operator.workspace_size > 0
            calls = runtime_calls(tmp_path, lambda: operator(*outputs, *inputs, stream=streams[next(order)]))
    finally:
        with selected_device("nvidia", 0):
            for stream in streams:
                libraries().rt.infinirtStreamDestroy(stream)
    assert calls.pop("cudaMalloc", 0) == 1, calls
    for name in [name for name in calls if name.startswith("cudaSetDevice")]:
        calls.pop(name)  # infinirt's device made current for that allocation (cudaSetDevice:N, N the device)
    assert_only_launches(calls)


def _device_arrays(arrays, device_id):
    """DeviceArrays on emulated device ``device_id`` holding these C-contiguous numpy arrays."""
    from infiniop_py._ffi import ffi, libraries

    placed = []
    for array in arrays:
        device_array = infiniop_py.DeviceArray(array.shape, array.dtype, "nvidia", device_id)
        device_array.buffer._copy(device_array.buffer._open_pointer(), ffi.from_buffer(array),
                                  libraries().rt.INFINIRT_MEMCPY_H2D)
        placed.append(device_array)
    return placed


@pytest.mark.parametrize("case", OPS, ids=str)
def test_a_call_on_another_device_leaves_the_callers_device_current(case, tmp_path, monkeypatch):
    """A call on device 1 from a thread whose current device is 0 runs there and makes 0 current again: the current
    device is the thread's, shared with the caller's runtime (torch's, through the driver's current context), and
    infinirt's record of it must stay true. The emulation's trace names each cudaSetDevice's device."""
    monkeypatch.setenv("INFINIOP_EMULATED_CUDA_DEVICES", "2")
    rng = np.random.default_rng(2)
    shape = (4, 6, 40)
    output_shapes = case.output_shapes(shape)
    arrays = _device_arrays([*case.make_inputs(rng, shape, F32), *(np.zeros(s, F32) for s in output_shapes)], 1)
    inputs, outputs = arrays[:-len(output_shapes)], arrays[-len(output_shapes):]
    try:  # an operator object and arrays closed here: nothing of device 1 outlives the second emulated device
        with infiniop_py.Handle("nvidia", 1) as handle, case.operator_class()(handle, *outputs, *inputs) as operator:
            calls = runtime_calls(tmp_path, lambda: operator(*outputs, *inputs))
    finally:
        for array in arrays:
            array.close()
        infiniop_py.empty_cache("nvidia", 1)
    trace = (tmp_path / "trace").read_text().split()
    switches = [name for name in trace if name.startswith("cudaSetDevice")]
    assert switches == ["cudaSetDevice:1", "cudaSetDevice:0"] * CALLS, switches
    assert calls["launch"] >= CALLS
