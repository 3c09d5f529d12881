"""DeviceArray memory comes from a cache of blocks that closed or collected DeviceArrays gave back (issue 52: no
allocation through the driver per call), on the CPU device here; the per-call count on CUDA is in
test_emulated_cuda_calls.py."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import infiniop_py
from infiniop_py import _device_memory
from infiniop_py._device_memory import DeviceArray
from _helpers import F32, RMS_NORM


@pytest.fixture(autouse=True)
def _empty_cache():
    infiniop_py.empty_cache()
    yield
    infiniop_py.empty_cache()


@given(st.integers(0, 1 << 40))
def test_a_block_holds_its_request_with_at_most_an_eighth_more(nbytes):
    """(or less than 512 bytes more, below 4 KiB)"""
    block = _device_memory._block_bytes(nbytes)
    assert 0 <= block - max(nbytes, 1) < max(512, nbytes / 8)
    assert _device_memory._block_bytes(block) == block  # a class's own size maps to itself


def test_a_closed_arrays_memory_is_reused_by_the_next_array_of_its_size_class():
    first = DeviceArray((1000,), np.float32, "cpu")
    address = first.buffer.address
    first.close()
    second = DeviceArray((250, 4), np.float32, "cpu")  # the same bytes in another shape
    assert second.buffer.address == address
    third = DeviceArray((1000,), np.float32, "cpu")  # while the second lives: a block of its own
    assert third.buffer.address != address


def test_a_collected_arrays_memory_is_reused_too():
    address = DeviceArray((4096,), np.float16, "cpu").buffer.address  # collected at once
    assert DeviceArray((4096,), np.float16, "cpu").buffer.address == address


def test_live_arrays_never_share_memory_and_keep_their_values():
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(n).astype(F32) for n in (300, 300, 301, 4000)]
    arrays = [DeviceArray.from_numpy(v, "cpu") for v in values]
    DeviceArray.from_numpy(np.zeros(300, F32), "cpu").close()  # a block given back and taken again below
    arrays.append(DeviceArray.from_numpy(np.full(300, 7, F32), "cpu"))
    values.append(np.full(300, 7, F32))
    spans = sorted((a.buffer.address, a.buffer.address + a.buffer.nbytes) for a in arrays)
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    for array, value in zip(arrays, values):
        np.testing.assert_array_equal(array.to_numpy(), value)


def test_empty_cache_frees_only_given_back_blocks():
    kept = DeviceArray((2048,), np.float32, "cpu")
    DeviceArray((2048,), np.float32, "cpu").close()
    DeviceArray((10,), np.float64, "cpu").close()
    assert infiniop_py.empty_cache("nvidia") == 0  # another device's: none
    assert infiniop_py.empty_cache("cpu") == 8192 + 512
    assert infiniop_py.empty_cache() == 0
    assert DeviceArray((2048,), np.float32, "cpu").buffer.address != kept.buffer.address
    np.testing.assert_array_equal(kept.to_numpy().shape, (2048,))


def test_a_failed_allocation_frees_the_cache_and_tries_again(monkeypatch):
    DeviceArray((1 << 16,), np.uint8, "cpu").close()  # a block of another class, cached
    allocate, calls = _device_memory._allocate, []

    def fails_while_blocks_are_cached(device, device_id, nbytes):
        calls.append(nbytes)
        if any(_device_memory._cached_blocks.values()):
            raise infiniop_py.InternalError("out of memory (as cudaMalloc reports it)")
        return allocate(device, device_id, nbytes)
    monkeypatch.setattr(_device_memory, "_allocate", fails_while_blocks_are_cached)
    array = DeviceArray((1 << 18,), np.uint8, "cpu")
    assert calls == [1 << 18, 1 << 18] and array.buffer.nbytes == 1 << 18
    monkeypatch.setattr(_device_memory, "_allocate", lambda *_: (_ for _ in ()).throw(
        infiniop_py.InternalError("out of memory")))
    with pytest.raises(infiniop_py.InternalError, match="out of memory"):  # nothing cached to free: the error
        DeviceArray((1 << 20,), np.uint8, "cpu")


def test_functional_calls_on_device_arrays_allocate_only_at_first_and_stay_right(monkeypatch):
    allocate, allocations = _device_memory._allocate, []

    def counted(*args):
        allocations.append(args)
        return allocate(*args)
    monkeypatch.setattr(_device_memory, "_allocate", counted)
    rng = np.random.default_rng(1)
    for call in range(4):
        inputs = RMS_NORM.make_inputs(rng, (8, 64), F32)
        outputs = infiniop_py.rms_norm_backward(*[DeviceArray.from_numpy(a, "cpu") for a in inputs])
        for index, want in enumerate(infiniop_py.rms_norm_backward(*inputs)):
            np.testing.assert_array_equal(outputs[index].to_numpy(), want)
        if call == 0:
            first = len(allocations)  # three inputs, two outputs
        del outputs  # the inputs went when the call returned
    assert first == 5 and len(allocations) == first


def _cached_count(address):
    return sum(int(_device_memory.ffi.cast("uintptr_t", pointer)) == address
               for blocks in _device_memory._cached_blocks.values() for pointer in blocks)


def test_a_block_goes_back_once_however_often_its_array_is_closed_or_dropped():
    array = DeviceArray((1000,), np.float32, "cpu")
    address = array.buffer.address
    array.close()
    array.close()
    assert array.buffer.closed and _cached_count(address) == 1
    del array  # collected after close(): nothing more given back
    assert _cached_count(address) == 1
    make = _device_memory.array_maker((10, 100), np.float32, "cpu")  # the functional API's outputs
    made = make()
    assert made.buffer.address == address and _cached_count(address) == 0
    del made
    assert _cached_count(address) == 1


def test_threads_closing_one_array_at_once_give_its_block_back_once():
    import threading
    for _ in range(50):
        array = DeviceArray((256,), np.float32, "cpu")
        address, start = array.buffer.address, threading.Barrier(4)

        def close():
            start.wait()
            array.close()
        threads = [threading.Thread(target=close) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert _cached_count(address) == 1
        infiniop_py.empty_cache()


def test_arrays_alive_at_exit_give_their_blocks_back_quietly():
    """Blocks go back from __del__, which may run while the interpreter shuts down (module globals gone)."""
    import subprocess
    import sys
    script = """if True:
        import numpy as np, infiniop_py
        from infiniop_py import DeviceArray
        kept = [DeviceArray((100,), np.float32, "cpu") for _ in range(10)]
        class Cycle: pass
        cycle = Cycle(); cycle.itself = cycle; cycle.array = DeviceArray((8,), np.float32, "cpu")
        ones = [DeviceArray.from_numpy(np.ones(shape, np.float32), "cpu") for shape in ((4, 8), (4, 8), (8,))]
        outputs = [infiniop_py.rms_norm_backward(*ones) for _ in range(3)]
        print("done")
        """
    run = subprocess.run([sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout, run.stderr) == (0, "done\n", "")
