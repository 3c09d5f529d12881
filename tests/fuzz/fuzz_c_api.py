"""Coverage-guided fuzzing (atheris / libFuzzer) of the C create and run functions through the package's cffi.

Each input picks an operator and, per tensor argument, a shape (rank 0..4), strides, a dtype code (invalid ones
included) or a NULL descriptor; the C create must return the documented status (tests/_fuzz_checks.py), and a
created descriptor runs. Some inputs instead describe an empty batch beside huge broadcast extents, or close an
operator object while two threads call it. Coverage guides the search over the Python harness and package (the native library is
not instrumented: no clang here); crashes and sanitizer reports in the native code are caught when run against
the sanitized libraries (.ci/fuzz does).

    python tests/fuzz/fuzz_c_api.py NEW_DIR tests/fuzz/corpus -max_total_time=3600   # fuzz longer
    cp NEW_DIR/* tests/fuzz/corpus/                                                   # keep what it found
(libFuzzer's -merge=1 sees no coverage through atheris here, so new inputs are copied, not merged.)
"""

import os
import sys
import threading
import time

import atheris

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
sys.path.insert(0, TESTS)

with atheris.instrument_imports():
    import infiniop_py  # noqa: F401  (instrumented for coverage)
    from _fuzz_checks import check_op_create_and_run, check_tensor_create
    from _helpers import OPS, native

DTYPE_CODES = [12, 13, 19, 12, 13, 19, 0, 1, 5, 14, 18, 20, 255]
HUGE_BROADCAST = (2**40, 2**61, 4602696377065932800)  # F16 extents whose workspace sums once wrapped (issue 29)


def make_handle():
    ffi, op, rt = native()
    pointer = ffi.new("infiniopHandle_t *")
    assert rt.infinirtSetDevice(0, 0) == 0 and op.infiniopCreateHandle(pointer) == 0
    return pointer[0]


def draw_spec(data, big):
    """(shape, dtype, strides) for one tensor, or None for a NULL descriptor."""
    if data.ConsumeIntInRange(0, 15) == 0:
        return None
    rank = data.ConsumeIntInRange(0, 4)
    shape = big if data.ConsumeBool() else tuple(data.ConsumeIntInRange(0, 5) for _ in range(rank))
    dtype = DTYPE_CODES[data.ConsumeIntInRange(0, len(DTYPE_CODES) - 1)]
    strides = None if data.ConsumeBool() else tuple(data.ConsumeIntInRange(-9, 9) for _ in shape)
    return shape, dtype, strides


def close_while_calling(data):
    """An operator object shared by two calling threads and closed by this one after a drawn delay: every call
    finishes or raises ClosedError; nothing crashes (issue 29)."""
    import numpy as np

    rows, dim = data.ConsumeIntInRange(0, 64), data.ConsumeIntInRange(1, 512)
    arrays = [np.ones((rows, dim), np.float32), np.ones(dim, np.float32), np.ones((rows, dim), np.float32),
              np.ones((rows, dim), np.float32), np.ones(dim, np.float32)]
    with infiniop_py.Handle("cpu") as handle:
        operator = infiniop_py.RMSNormBackward(handle, *arrays)

        def call():
            try:
                while True:
                    operator(*arrays)
            except infiniop_py.ClosedError:
                pass

        callers = [threading.Thread(target=call) for _ in range(2)]
        for caller in callers:
            caller.start()
        time.sleep(data.ConsumeIntInRange(0, 2000) * 1e-6)
        operator.close()
        for caller in callers:
            caller.join()


def fuzz_one(handle, raw):
    data = atheris.FuzzedDataProvider(raw)
    if data.ConsumeIntInRange(0, 63) == 0:
        close_while_calling(data)
        return
    case = OPS[data.ConsumeIntInRange(0, len(OPS) - 1)]
    rank = 3 if case.contiguous_tensors else data.PickValueInList([2, 3])
    big = tuple(data.ConsumeIntInRange(0, 6) for _ in range(rank))
    if data.ConsumeIntInRange(0, 15) == 0:  # an empty batch beside a huge extent, input vectors broadcast
        big = (0, HUGE_BROADCAST[data.ConsumeIntInRange(0, len(HUGE_BROADCAST) - 1)]) + (1,) * (rank - 2)
        outputs = len(case.output_names)
        specs = [(shape, 12, (0,) if len(shape) == 1 and index >= outputs else None)
                 for index, shape in enumerate(case.tensor_shapes(big))]
        check_op_create_and_run(case, handle, specs)
        return
    specs = []
    for shape in case.tensor_shapes(big):
        spec = draw_spec(data, shape)
        if spec is not None and check_tensor_create(spec[0], spec[2], spec[1]) != 0:
            spec = (shape, 13, None)  # not creatable: the tensor create's own status was checked above
        specs.append(spec)
    check_op_create_and_run(case, handle, specs, null_handle=data.ConsumeIntInRange(0, 31) == 0,
                            null_out=data.ConsumeIntInRange(0, 31) == 0)


def main():
    handle = make_handle()
    atheris.Setup(sys.argv, lambda raw: fuzz_one(handle, raw))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
