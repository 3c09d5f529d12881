"""Coverage-guided fuzzing (atheris / libFuzzer) of the C create and run functions through the package's cffi.

Each input picks an operator, a backward (_helpers.OPS) or a forward create form, seed or Ex (_helpers.FORWARD_OPS,
one input in eight), and, per tensor argument, a shape (rank 0..4), strides, a dtype code (invalid ones included) or
a NULL descriptor, and for a forward its scalars (eps, momentum, training; bad ones included); the C create must
return the status of the package's rule mirror (tests/_fuzz_checks.py), and a created descriptor runs. Some inputs
instead describe an empty batch beside huge broadcast extents, or close an operator object while two threads call
it. Coverage guides the search over the Python harness and package (the native library is not instrumented: no
clang here); crashes and sanitizer reports in the native code are caught when run against the sanitized libraries
(.ci/sanitize replays the corpus under them).

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
    from _fuzz_checks import (HUGE_BROADCAST, check_op_create_and_run, check_tensor_create, draw_forward_arguments,
                              huge_broadcast_specs)
    from _helpers import FORWARD_OPS, OPS, native

DTYPE_CODES = (12, 13, 19, 12, 13, 19, 0, 1, 5, 14, 18, 20, 255)
# The first draw of an input (0..63): 0 closes an operator while it is called, these pick a forward, the rest a
# backward. No input the corpus kept before the forwards came draws one of these, so each replays as it did.
FORWARD_CHOICES = range(42, 50)


def make_handle():
    ffi, op, rt = native()
    pointer = ffi.new("infiniopHandle_t *")
    assert rt.infinirtSetDevice(0, 0) == 0 and op.infiniopCreateHandle(pointer) == 0
    return pointer[0]


def draw_spec(data, big, codes=DTYPE_CODES):
    """(shape, dtype, strides) for one tensor, the dtype one of `codes`, or None for a NULL descriptor."""
    if data.ConsumeIntInRange(0, 15) == 0:
        return None
    rank = data.ConsumeIntInRange(0, 4)
    shape = big if data.ConsumeBool() else tuple(data.ConsumeIntInRange(0, 5) for _ in range(rank))
    dtype = codes[data.ConsumeIntInRange(0, len(codes) - 1)]
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
    choice = data.ConsumeIntInRange(0, 63)
    if choice == 0:
        close_while_calling(data)
        return
    cases = FORWARD_OPS if choice in FORWARD_CHOICES else OPS
    case = cases[data.ConsumeIntInRange(0, len(cases) - 1)]
    rank = case.ranks[0] if len(case.ranks) == 1 else data.PickValueInList(list(case.ranks))
    big = tuple(data.ConsumeIntInRange(0, 6) for _ in range(rank))
    normalized, codes, scalars = (1, {"data": 13}, ()) if cases is OPS else draw_forward_arguments(
        case, rank, lambda values: data.PickValueInList(list(values)), data.ConsumeFloat)
    if data.ConsumeIntInRange(0, 15) == 0:  # an empty batch beside a huge extent, input vectors broadcast
        big = (0, HUGE_BROADCAST[data.ConsumeIntInRange(0, len(HUGE_BROADCAST) - 1)]) + (1,) * (rank - 2)
        check_op_create_and_run(case, handle, huge_broadcast_specs(case, big), scalars=scalars)
        return
    specs = []
    for name, (shape, code) in zip(case.tensor_names, case.tensor_specs(big, normalized, codes)):
        if name in case.optional and data.ConsumeIntInRange(0, 3) == 0:
            specs.append(None)  # an optional tensor left out
            continue
        spec = draw_spec(data, shape, DTYPE_CODES if cases is OPS else (code,) * len(DTYPE_CODES) + DTYPE_CODES)
        if spec is not None and check_tensor_create(spec[0], spec[2], spec[1]) != 0:
            spec = (shape, code, None)  # not creatable: the tensor create's own status was checked above
        specs.append(spec)
    check_op_create_and_run(case, handle, specs, null_handle=data.ConsumeIntInRange(0, 31) == 0,
                            null_out=data.ConsumeIntInRange(0, 31) == 0, scalars=scalars)


def main():
    handle = make_handle()
    atheris.Setup(sys.argv, lambda raw: fuzz_one(handle, raw))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
