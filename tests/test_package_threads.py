"""The package under threads and at exit: the GIL is released during native calls, the functional
API's shared operators and workspaces give the same bits from many threads, and a process that
ran multi-threaded (OpenMP) kernels exits cleanly."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import infiniop_py
from infiniop_py import reference


def _main_thread_pause_during_calls(operator, arrays):
    """(longest pause of a busy loop in this thread while another thread makes 4 native calls, the time of one
    call alone), in seconds."""
    one_call = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        operator(*arrays)
        one_call = min(one_call, time.perf_counter() - start)
    finished = threading.Event()

    def run_calls():
        for _ in range(4):
            operator(*arrays)
        finished.set()

    worker = threading.Thread(target=run_calls)
    longest_pause = 0.0
    last = time.perf_counter()
    worker.start()
    while not finished.is_set():
        now = time.perf_counter()
        longest_pause = max(longest_pause, now - last)
        last = now
    worker.join()
    return longest_pause, one_call


def test_native_call_releases_the_gil():
    """In a process whose kernels run on one thread (OMP_NUM_THREADS=1), so that the call and this busy loop each
    have a core of this 2-core machine: with the kernels on both, the OS descheduled the loop for 4-11 ms of a
    7-16 ms call on a loaded machine, which read as a held GIL."""
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import infiniop_py
        sys.path.insert(0, sys.argv[1])
        from test_package_threads import _main_thread_pause_during_calls
        rows, d = 8192, 4096  # a call of tens of milliseconds
        rng = np.random.default_rng(0)
        grad_y, x, w = (rng.standard_normal(s).astype(np.float32) for s in ((rows, d), (rows, d), (d,)))
        grad_x, grad_w = np.empty_like(x), np.empty_like(w)
        attempts = []
        with infiniop_py.Handle("cpu") as handle:
            with infiniop_py.RMSNormBackward(handle, grad_x, grad_w, grad_y, x, w) as operator:
                # A native call holding the GIL stalls the busy loop for a whole call in every attempt. One that
                # releases it can still see this thread descheduled for that long on a loaded machine, hence a
                # few attempts.
                for _ in range(3):
                    longest_pause, one_call = _main_thread_pause_during_calls(operator, (grad_x, grad_w, grad_y, x, w))
                    if longest_pause < 0.8 * one_call:  # a held GIL stalls it for the whole call
                        sys.exit(0)
                    attempts.append(f"paused {longest_pause * 1e3:.1f} ms, one call {one_call * 1e3:.1f} ms")
        sys.exit("the main thread stalled for most of a native call in every attempt, as if the call held "
                 "the GIL: " + "; ".join(attempts))
    """)
    result = subprocess.run([sys.executable, "-c", script, os.path.dirname(os.path.abspath(__file__))],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_functional_api_from_many_threads_gives_identical_results():
    rng = np.random.default_rng(1)
    inputs = reference.make_layer_norm_inputs((8, 16, 64), np.float32, rng)
    expected = infiniop_py.layer_norm_backward(*inputs.values())
    results = [None] * 8
    barrier = threading.Barrier(len(results))

    def run(index):
        barrier.wait()
        for _ in range(20):
            results[index] = infiniop_py.layer_norm_backward(*inputs.values())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for outputs in results:
        for got, want in zip(outputs, expected):
            assert np.array_equal(got, want)


def test_process_exits_cleanly_after_multithreaded_kernels():
    program = (
        "import numpy as np, infiniop_py\n"
        "x = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)\n"
        "infiniop_py.rms_norm_backward(x, x, np.ones(512, np.float32))\n"
    )
    environment = dict(os.environ, OMP_NUM_THREADS="2")
    for _ in range(5):
        finished = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, timeout=60)
        assert finished.returncode == 0, finished.stderr.decode()


THREADS_STARTED = """
import os, sys
import numpy as np, infiniop_py

def threads():
    return len(os.listdir("/proc/self/task"))

rng = np.random.default_rng(0)
def run(shape):
    x = rng.standard_normal(shape).astype(np.float32)
    infiniop_py.rms_norm_backward(x, x, np.ones(shape[-1], np.float32))
    infiniop_py.layer_norm_backward(x, np.ones(shape[-1], np.float32), x, np.ones(shape[:-1], np.float32))
    infiniop_py.batch_norm_backward(x.reshape(shape[0], 1, -1), x.reshape(shape[0], 1, -1), np.ones(1, np.float32),
                                    np.zeros(1, np.float32), np.ones(1, np.float32))

before = threads()
for shape in [(16, 256), (120, 256), (3, 5000), (1, 30000)]:  # under 2 x 32768 elements of work each
    run(shape)
after_small = threads()
run((1024, 512))
openmp = any("libgomp" in line or "libomp" in line for line in open("/proc/self/maps"))
print(before, after_small, threads(), int(openmp))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_small_calls_start_no_threads_and_large_ones_do():
    environment = dict(os.environ, OMP_NUM_THREADS="4")
    finished = subprocess.run([sys.executable, "-c", THREADS_STARTED], env=environment, capture_output=True,
                              timeout=120, check=True)
    before, after_small, after_large, openmp = map(int, finished.stdout.split())
    if not openmp:
        pytest.skip("the library was built without OpenMP: it never starts threads")
    assert after_small == before, "a call on less than two threads' worth of work started threads"
    assert after_large > after_small  # a large call does: the count can see OpenMP's threads
