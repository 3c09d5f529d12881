"""Reliability II (issue 29): what threads, processes and foreign memory do to a call. Each case runs in its own
Python process, bounded in time, so a crash (SIGSEGV) or a hang is one failed test, not a dead suite:

- close() while other threads call an operator, hundreds of cycles: calls finish or raise ClosedError;
- interpreter exit while daemon threads are inside calls (classes and functional API), dozens of exits;
- a child forked after a multi-threaded call (os.fork, multiprocessing's fork start method) runs the operators
  on one thread with the parent's bits, instead of hanging in the OpenMP runtime;
- read-only outputs through __array_interface__, DLPack and a read-only mmap are refused, not written;
- torch tensors with the negative bit are read with their sign (inputs) or refused (outputs);
- an out= torch tensor that requires grad is refused, as torch refuses in-place writes to it.
"""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import infiniop_py

TIMEOUT_S = 120


def run_python(source, timeout=TIMEOUT_S):
    """Run ``source`` in a fresh interpreter; (returncode, output). A hang fails the test after ``timeout``, and
    kills the process with every child it forked (its own session)."""
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(source)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the process hung for {timeout} s (killed):\n{output[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # a child left behind (its parent exited)
    return process.returncode, output


def assert_clean_exit(source, timeout=TIMEOUT_S):
    code, output = run_python(source, timeout)
    assert code == 0, f"exit status {code} (negative: killed by that signal):\n{output[-3000:]}"
    return output


# A 64 x 4096 F32 RMSNorm: 256 Ki elements, enough for the CPU backend to use every thread.
SETUP = """
    import threading, numpy as np, infiniop_py
    rng = np.random.default_rng(0)
    grad_y, x = rng.standard_normal((2, 64, 4096), dtype=np.float32)
    w = rng.standard_normal(4096, dtype=np.float32)
    grad_x, grad_w = np.empty_like(x), np.empty_like(w)
    """


def test_close_while_other_threads_call():
    output = assert_clean_exit(SETUP + """
    handle = infiniop_py.Handle("cpu")
    refused = finished = 0
    for cycle in range(300):
        operator = infiniop_py.RMSNormBackward(handle, grad_x, grad_w, grad_y, x, w)
        counts = []
        def call_until_closed():
            done = 0
            try:
                while True:
                    operator(np.empty_like(x), np.empty_like(w), grad_y, x, w)
                    done += 1
            except infiniop_py.ClosedError:
                counts.append(done)
        callers = [threading.Thread(target=call_until_closed) for _ in range(2)]
        for caller in callers:
            caller.start()
        operator.close()  # waits for the calls in flight; later ones raise ClosedError
        for caller in callers:
            caller.join()
        assert len(counts) == 2 and operator.closed
        finished += sum(counts)
    print("calls", finished)
    """)
    assert "calls" in output


@pytest.mark.parametrize("api", ["class", "functional"])
def test_exit_while_daemon_threads_call(api):
    call = ("operator(np.empty_like(x), np.empty_like(w), grad_y, x, w)" if api == "class"
            else "infiniop_py.rms_norm_backward(grad_y, x, w)")
    source = SETUP + f"""
    import time
    operator = infiniop_py.RMSNormBackward(infiniop_py.Handle("cpu"), grad_x, grad_w, grad_y, x, w)
    started = threading.Barrier(4)
    def call_forever():
        started.wait()
        while True:
            {call}
    for _ in range(3):
        threading.Thread(target=call_forever, daemon=True).start()
    started.wait()
    time.sleep(0.02)  # the daemons are inside native calls when the interpreter exits
    """
    for _ in range(25):
        assert_clean_exit(source, timeout=60)


FORK_CHECK = SETUP + """
    import os
    expected = infiniop_py.rms_norm_backward(grad_y, x, w)  # multi-threaded: the OpenMP threads exist now
    def child_result():
        got = infiniop_py.rms_norm_backward(grad_y, x, w)
        return all(a.tobytes() == b.tobytes() for a, b in zip(got, expected))
    """


def test_forked_child_runs_with_the_parents_bits():
    assert_clean_exit(FORK_CHECK + """
    pid = os.fork()
    if pid == 0:
        os._exit(0 if child_result() else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    """, timeout=60)


def test_multiprocessing_fork_workers_run():
    assert_clean_exit(FORK_CHECK + """
    import multiprocessing
    def work(_):
        return child_result()
    if __name__ == "__main__":
        with multiprocessing.get_context("fork").Pool(2) as pool:
            assert pool.map(work, range(4)) == [True] * 4
    """, timeout=60)


# ---------------------------------------------------------------- read-only foreign memory

class ArrayInterface:
    """Foreign memory seen only through __array_interface__, with its read-only flag."""

    def __init__(self, array, read_only):
        self._array = array
        self.__array_interface__ = dict(array.__array_interface__, data=(array.ctypes.data, read_only))


def _rms_inputs():
    rng = np.random.default_rng(1)
    grad_y, x = rng.standard_normal((2, 4, 8), dtype=np.float32)
    return grad_y, x, rng.standard_normal(8, dtype=np.float32)


@pytest.mark.parametrize("kind", ["array_interface", "dlpack"])
def test_read_only_outputs_are_refused(kind):
    grad_y, x, w = _rms_inputs()
    target = np.zeros_like(x)
    target.flags.writeable = False
    output = ArrayInterface(target, True) if kind == "array_interface" else target  # numpy exports it via DLPack
    if kind == "dlpack":
        class DLPackOnly:  # only the protocol, so the package takes the DLPack path
            def __dlpack__(self, **kwargs):
                return target.__dlpack__(**kwargs)

            def __dlpack_device__(self):
                return target.__dlpack_device__()
        output = DLPackOnly()
    with pytest.raises(ValueError, match="grad_x: the output array is read-only"):
        infiniop_py.rms_norm_backward(grad_y, x, w, out=(output, np.empty_like(w)))
    assert not target.any()
    # The same memory as an input is fine.
    readable = ArrayInterface(x.copy(), True)
    expected = infiniop_py.rms_norm_backward(grad_y, x, w)
    got = infiniop_py.rms_norm_backward(grad_y, readable, w)
    np.testing.assert_array_equal(got[0], expected[0])


def test_read_only_mmap_output_is_refused_not_a_crash(tmp_path):
    path = tmp_path / "grad_x.bin"
    path.write_bytes(bytes(2 * 4 * 8 * 4))
    assert_clean_exit(f"""
    import mmap, numpy as np, infiniop_py
    rng = np.random.default_rng(1)
    grad_y, x = rng.standard_normal((2, 4, 8), dtype=np.float32)
    w = rng.standard_normal(8, dtype=np.float32)
    with open({str(path)!r}, "rb") as file:
        memory = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        class Mapped:
            __array_interface__ = dict(np.frombuffer(memory, np.float32).reshape(2, 4, 8).__array_interface__)
        try:
            infiniop_py.rms_norm_backward(grad_y, x, w, out=(Mapped(), np.empty_like(w)))
        except ValueError as error:
            assert "read-only" in str(error), error
        else:
            raise AssertionError("a read-only mmap was accepted as an output")
    """, timeout=60)


# ---------------------------------------------------------------- torch tensors

def test_negative_bit_inputs_are_read_with_their_sign():
    torch = pytest.importorskip("torch", reason="torch is not installed: the negative bit is torch's")
    torch.manual_seed(0)
    grad_y, x = torch.randn(2, 2, 6, 16)
    z = torch.randn(16, dtype=torch.complex64)
    w = z.conj().imag  # memory holds -w
    assert w.is_neg()
    expected = infiniop_py.rms_norm_backward(grad_y, x, w.resolve_neg())
    for attempt in range(2):  # the checked path, then whatever fast path the first call set up
        got = infiniop_py.rms_norm_backward(grad_y, x, w)
        for name, a, b in zip(("grad_x", "grad_w"), got, expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{name}, call {attempt}")
    contiguous_neg = torch.randn(16)._neg_view()  # contiguous, so the fast paths see it
    expected = infiniop_py.rms_norm_backward(grad_y, x, contiguous_neg.resolve_neg())
    for _ in range(2):
        got = infiniop_py.rms_norm_backward(grad_y, x, contiguous_neg)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    with infiniop_py.Handle("cpu") as handle:
        with infiniop_py.RMSNormBackward(handle, grad_y, w, grad_y, x, w) as operator:
            grad_x, grad_w = torch.empty_like(x), torch.empty(16)
            operator(grad_x, grad_w, grad_y, x, contiguous_neg)
            torch.testing.assert_close(grad_x, expected[0], rtol=0, atol=0)


def test_negative_bit_and_grad_requiring_outputs_are_refused():
    torch = pytest.importorskip("torch", reason="torch is not installed: these are torch's tensor flags")
    grad_y, x = torch.randn(2, 2, 6, 16)
    w = torch.randn(16)
    negative = torch.zeros(2, 6, 16)._neg_view()
    with pytest.raises(ValueError, match="grad_x: the output tensor has the negative bit"):
        infiniop_py.rms_norm_backward(grad_y, x, w, out=(negative, torch.empty(16)))
    leaf = torch.zeros(2, 6, 16, requires_grad=True)
    for _ in range(2):  # also once a fast path for these layouts exists
        with pytest.raises(RuntimeError, match="grad_x: an output tensor that requires grad"):
            infiniop_py.rms_norm_backward(grad_y, x, w, out=(leaf, torch.empty(16)))
        infiniop_py.rms_norm_backward(grad_y, x, w, out=(torch.empty(2, 6, 16), torch.empty(16)))
    assert not leaf.detach().any()
    with torch.no_grad():  # where torch allows in-place writes to it, so does the package
        infiniop_py.rms_norm_backward(grad_y, x, w, out=(leaf, torch.empty(16)))
    assert leaf.detach().any()
    with infiniop_py.Handle("cpu") as handle:
        with infiniop_py.RMSNormBackward(handle, grad_y, w, grad_y, x, w) as operator:
            with pytest.raises(RuntimeError, match="grad_x: an output tensor that requires grad"):
                operator(torch.zeros(2, 6, 16, requires_grad=True), torch.empty(16), grad_y, x, w)


# ---------------------------------------------------------------- misaligned data

def _misaligned_float32(shape):
    """A float32 array at an address one byte past an element boundary (memory from a byte buffer)."""
    count = int(np.prod(shape))
    return np.frombuffer(bytearray(4 * count + 1), dtype=np.float32, offset=1, count=count).reshape(shape)


def test_misaligned_arrays_are_refused_by_name():
    grad_y, x, w = _rms_inputs()
    odd = _misaligned_float32(x.shape)
    odd[...] = x
    assert odd.ctypes.data % 4 == 1
    for attempt in range(2):  # the checked path, then after a fast path exists for these layouts
        with pytest.raises(infiniop_py.BadParamError, match="x: its data address .* 4-byte elements"):
            infiniop_py.rms_norm_backward(grad_y, odd, w)
        infiniop_py.rms_norm_backward(grad_y, x, w)
    with pytest.raises(infiniop_py.BadParamError, match="grad_x: its data address"):
        infiniop_py.rms_norm_backward(grad_y, x, w, out=(_misaligned_float32(x.shape), np.empty_like(w)))
    with infiniop_py.Handle("cpu") as handle, infiniop_py.RMSNormBackward(handle, x, w, grad_y, x, w) as operator:
        with pytest.raises(infiniop_py.BadParamError, match="x: its data address"):
            operator(np.empty_like(x), np.empty_like(w), grad_y, odd, w)


def test_misaligned_pointers_get_bad_param_from_c(c_handle):
    from _helpers import BAD_PARAM, SUCCESS, data_pointer, native, run_batch_norm_ex
    ffi = native()[0]
    rng = np.random.default_rng(3)
    x, grad_output = rng.standard_normal((2, 4, 3, 5), dtype=np.float32)
    arrays = {"grad_input": np.empty_like(x), "input": x, "grad_output": grad_output,
              "running_mean": np.zeros(3, np.float32), "running_var": np.ones(3, np.float32)}
    assert run_batch_norm_ex(c_handle, arrays) == SUCCESS
    for name in ("input", "grad_input", "running_var"):
        def shifted(array, name=name):  # two bytes into the array named: not a float32 boundary
            return ffi.cast("void *", ffi.cast("char *", data_pointer(array)) + (2 if array is arrays[name] else 0))
        assert run_batch_norm_ex(c_handle, arrays, pointer=shifted) == BAD_PARAM, name
