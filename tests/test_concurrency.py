"""One native descriptor shared by 8 threads at once, and the functional API's operator cache under
concurrent use and eviction. (test_package_threads.py proves that native calls release the GIL.)"""

import threading

import numpy as np
import pytest

import infiniop_py
from infiniop_py import _functional
from _helpers import BF16, F32, OPS, COperator, data_pointer, sentinel_outputs_and_inputs

THREADS = 8
# Enough rows / batch that each op uses its workspace for block partials (where a shared one would corrupt).
SHAPES = {"rms_norm_backward": (4, 300, 96), "layer_norm_backward": (4, 300, 96),
          "batch_norm_backward": (16, 6, 300)}


def run_in_threads(count, body):
    """Run body(index) in `count` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(count)
    failures = []

    def worker(index):
        try:
            barrier.wait()
            body(index)
        except BaseException as error:  # reported below, in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("case", OPS, ids=str)
def test_one_descriptor_in_eight_threads_matches_a_single_threaded_run(c_handle, case, dtype):
    shape = SHAPES[case.name]
    outputs, inputs = sentinel_outputs_and_inputs(case, shape, dtype)
    operator = COperator(case, c_handle, outputs + inputs)
    try:
        assert operator.workspace_size > 0, "no workspace: sharing one descriptor would test nothing"
        workspace = np.empty(operator.workspace_size, np.uint8)
        assert operator.run(data_pointer(workspace), operator.workspace_size,
                            [data_pointer(a) for a in outputs + inputs]) == 0
        expected = [o.tobytes() for o in outputs]
        results = [[np.empty_like(o) for o in outputs] for _ in range(THREADS)]
        workspaces = [np.empty(operator.workspace_size, np.uint8) for _ in range(THREADS)]

        def body(index):
            for _ in range(5):
                status = operator.run(data_pointer(workspaces[index]), operator.workspace_size,
                                      [data_pointer(a) for a in results[index] + inputs])
                assert status == 0
                assert [o.tobytes() for o in results[index]] == expected, f"thread {index} differs"

        run_in_threads(THREADS, body)
    finally:
        operator.destroy()


def test_operator_cache_under_concurrent_use_and_eviction():
    """More layouts than the cache holds, from 8 threads at once: every result right, the cache bounded."""
    layouts = [(rows, 16 + rows % 3) for rows in range(1, _functional.CACHE_SIZE + 40)]
    rng = np.random.default_rng(0)
    data = {layout: [rng.standard_normal(s).astype(np.float32) for s in (layout, layout, layout[-1:])]
            for layout in layouts}
    expected = {layout: infiniop_py.rms_norm_backward(*arrays) for layout, arrays in data.items()}

    def body(index):
        for layout in layouts[index::2] + layouts[::-3]:
            got = infiniop_py.rms_norm_backward(*data[layout])
            for a, b in zip(got, expected[layout]):
                assert a.tobytes() == b.tobytes(), layout

    run_in_threads(THREADS, body)
    assert len(_functional._operators) <= _functional.CACHE_SIZE

